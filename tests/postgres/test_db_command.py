"""``txstore db``: the package's own Alembic revisions, from any folder, in one-line outcomes.

Run as users run it, ``python -m txstore.ops.cli db ...`` in a process of its own, from a
folder that has no ``alembic.ini`` (a temporary one), against real PostgreSQL. The installed
wheel runs the same command in tests/ops/test_wheel.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.local import free_port
from tests.helpers.ops_roles import role_that_cannot_create_tables
from txstore import __version__
from txstore.postgres.db import connect, redact
from txstore.postgres.migrate import SCHEMA_REVISION, head_revision


def txstore(*args: str, cwd: Path, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSTORE_")}
    env["PYTHONPATH"] = str(REPO)  # this checkout's txstore, though the process runs elsewhere
    if url is not None:
        env["TXSTORE_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "txstore.ops.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def revision(url: str) -> str | None:
    with connect(url) as conn:
        if conn.execute("SELECT to_regclass('alembic_version')").fetchone() == (None,):
            return None
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    return row[0] if row else None


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.splitlines()
    return line


@pytest.mark.slow
def test_db_upgrade_creates_the_tables_from_a_folder_without_alembic_ini_and_current_names_the_head(
    empty_database_url: str, tmp_path: Path
) -> None:
    assert not (tmp_path / "alembic.ini").exists()
    before = txstore("db", "current", "--database-url", empty_database_url, cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    assert before.stdout.splitlines() == [
        f"{redact(empty_database_url)}: revision none (no txstore tables); this txstore needs {SCHEMA_REVISION}",
        "run `txstore db upgrade` to bring it there",
    ]
    up = txstore("db", "upgrade", cwd=tmp_path, url=empty_database_url)  # the URL from the environment
    assert (up.returncode, up.stderr) == (0, ""), up.stderr
    assert up.stdout == (
        f"upgraded {redact(empty_database_url)} from revision none (no txstore tables) "
        f"to {SCHEMA_REVISION} (head)\n"
    )
    assert revision(empty_database_url) == SCHEMA_REVISION == head_revision()
    again = txstore("db", "upgrade", "head", "--database-url", empty_database_url, cwd=tmp_path)
    assert (
        again.stdout
        == f"{redact(empty_database_url)}: already at revision {SCHEMA_REVISION} (head); nothing to do\n"
    )
    current = txstore("db", "current", cwd=tmp_path, url=empty_database_url)
    assert current.stdout == (
        f"{redact(empty_database_url)}: revision {SCHEMA_REVISION} (head); this txstore needs {SCHEMA_REVISION}\n"
    )


@pytest.mark.slow
def test_db_downgrade_then_upgrade_moves_the_revision_and_jobs_refuse_the_older_schema(
    database_url: str, tmp_path: Path
) -> None:
    down = txstore("db", "downgrade", "0007", "--database-url", database_url, cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    assert (
        down.stdout == f"downgraded {redact(database_url)} from revision {SCHEMA_REVISION} (head) to 0007\n"
    )
    assert down.stderr == (
        f"txstore: warning: this txstore needs revision {SCHEMA_REVISION}; its jobs refuse to run until "
        "`txstore db upgrade`\n"
    )
    assert revision(database_url) == "0007"
    status = txstore("status", "--database-url", database_url, cwd=tmp_path)
    assert one_error_line(status) == (
        f"txstore: error: the database schema is at revision 0007 but this txstore needs {SCHEMA_REVISION}; "
        "run `txstore db upgrade` (or upgrade txstore if the database is newer)"
    )
    base = txstore("db", "downgrade", "base", "--database-url", database_url, cwd=tmp_path)
    assert base.returncode == 0, base.stderr
    with connect(database_url) as conn:
        left = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    assert left == [("alembic_version",)]
    up = txstore("db", "upgrade", "--database-url", database_url, cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert revision(database_url) == SCHEMA_REVISION


@pytest.mark.slow
def test_db_upgrade_sql_prints_the_ddl_for_a_dba_without_any_database(tmp_path: Path) -> None:
    result = txstore("db", "upgrade", "--sql", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert "CREATE TABLE txn_offsets" in result.stdout
    assert "CREATE TABLE txn_stream_plans" in result.stdout
    assert f"UPDATE alembic_version SET version_num='{SCHEMA_REVISION}'" in result.stdout
    assert result.stdout.rstrip().endswith("COMMIT;")
    step = txstore("db", "upgrade", "--sql", "0006:0007", cwd=tmp_path)
    assert step.returncode == 0, step.stderr
    assert "CREATE TABLE" not in step.stdout
    assert "version_num='0007'" in step.stdout


@pytest.mark.slow
def test_db_errors_are_one_line_saying_what_to_do_without_a_password(
    database_url: str, tmp_path: Path
) -> None:
    assert one_error_line(txstore("db", "upgrade", cwd=tmp_path)) == (
        "txstore: error: no database given: pass --database-url or set TXSTORE_DATABASE_URL"
    )
    closed = f"postgresql://someone:s3cret-pw@127.0.0.1:{free_port()}/txstore"
    for action in (("upgrade",), ("downgrade", "base"), ("current",)):
        line = one_error_line(txstore("db", *action, "--database-url", closed, cwd=tmp_path))
        assert line.startswith("txstore: error: "), line
        assert "postgresql://someone:***@127.0.0.1:" in line
        assert "s3cret-pw" not in line
    unknown = one_error_line(txstore("db", "downgrade", "0042", "--database-url", database_url, cwd=tmp_path))
    assert unknown.startswith(f"txstore: error: downgrading {redact(database_url)}: "), unknown
    assert "0042" in unknown
    assert "`txstore db current`" in unknown
    usage = txstore("db", cwd=tmp_path)
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    assert usage.stderr == (
        "txstore db: error: the following arguments are required: ACTION (see `txstore db --help`)\n"
    )


def test_version_is_written_once_and_txstore_version_prints_it(tmp_path: Path) -> None:
    result = txstore("--version", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, f"txstore {__version__}\n")
    pyproject = (REPO / "pyproject.toml").read_text()
    project = pyproject.split("[project]\n", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.M), "the version is written in txstore/__init__.py only"
    assert 'version = { attr = "txstore.__version__" }' in pyproject


@pytest.mark.slow
def test_db_upgrade_as_a_role_that_may_not_create_tables_is_one_line_and_changes_nothing(
    empty_database_url: str, tmp_path: Path
) -> None:
    """PostgreSQL 15+ gives PUBLIC no CREATE on schema public: the migration's own reason, in
    one line naming the database, with no password (was: Alembic's traceback from ``alembic``)."""
    with role_that_cannot_create_tables(empty_database_url, "db_reader") as (url, password):
        result = txstore("db", "upgrade", "--database-url", url, cwd=tmp_path)
    line = one_error_line(result)
    assert line == (
        f"txstore: error: upgrading {redact(url)} failed: permission denied for schema public; "
        "nothing was changed (the revisions run in one transaction): fix the cause and run it again"
    )
    assert password not in result.stderr + result.stdout
    assert revision(empty_database_url) is None
