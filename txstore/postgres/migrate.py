"""Alembic from Python: migrate a database and check it matches this code.

The revisions ship inside the package (``txstore/migrations``), so an installed txstore
migrates its own database: ``txstore db upgrade`` (:mod:`txstore.ops.cli`) and the tests and
the demo call :func:`upgrade` here. A checkout's ``alembic.ini`` names the same folder, so
``alembic upgrade head`` from the repository's root runs the very same revisions.

Alembic is imported only by the functions that run it: :func:`check_schema`
is imported wherever a job runs, Spark tasks included, and the workers need
not have Alembic (README: what workers need).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import psycopg

from txstore.core.errors import ConfigError, SchemaMissing, TxstoreError, first_line
from txstore.postgres.db import redact

if TYPE_CHECKING:
    from alembic.config import Config

SCHEMA_REVISION = "0009"
"""The Alembic head this code was written for; a test keeps it equal to the real head."""

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
"""Alembic's script folder (``env.py``, ``versions/``), inside the package."""

UPGRADE_COMMAND = "txstore db upgrade"
"""What a missing or older schema asks for (``alembic upgrade head`` from a checkout is the same)."""


def alembic_config(database_url: str | None = None, stdout: TextIO | None = None) -> Config:
    """Alembic's configuration for the package's revisions, optionally pointed at a database URL
    (``stdout``: where offline SQL goes)."""
    from alembic.config import Config

    config = Config(stdout=stdout) if stdout is not None else Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    config.attributes["configure_logger"] = False
    if database_url:
        config.attributes["database_url"] = database_url
    return config


@contextmanager
def one_line_errors(doing: str) -> Iterator[None]:
    """Alembic's and the database's failures inside, as one line saying what was being done
    (``txstore db``): a :class:`~txstore.core.errors.TxstoreError`, not a traceback."""
    import sqlalchemy.exc
    from alembic.util import CommandError

    try:
        yield
    except CommandError as e:  # a revision that does not exist, a downgrade that is an upgrade, ...
        raise ConfigError(
            f"{doing}: {first_line(e)}; `txstore db current` shows the database's revision and this txstore's"
        ) from None
    except sqlalchemy.exc.DBAPIError as e:
        reason = first_line(e.orig if e.orig is not None else e)
        raise TxstoreError(
            f"{doing} failed: {reason}; nothing was changed (the revisions run in one transaction): "
            "fix the cause and run it again"
        ) from None


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply the Alembic revisions up to ``revision``."""
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Undo the Alembic revisions down to ``revision`` (``base``: drop every txstore table)."""
    from alembic import command

    command.downgrade(alembic_config(database_url), revision)


def offline_sql(revision: str, out: TextIO, database_url: str | None = None) -> None:
    """Write the SQL that upgrades an empty database (or ``from:to``) to ``revision``, without
    connecting: for a DBA to review and apply."""
    from alembic import command

    command.upgrade(alembic_config(database_url, stdout=out), revision, sql=True)


def head_revision() -> str:
    """The newest revision the package ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, f"no Alembic revisions in {MIGRATIONS_DIR}"
    return head


def current_revision(conn: psycopg.Connection) -> str | None:
    """The revision the database is at, or None when it has no txstore tables."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('alembic_version') IS NOT NULL")
        row = cur.fetchone()
        found = None
        if row and row[0]:
            cur.execute("SELECT version_num FROM alembic_version")
            version = cur.fetchone()
            found = version[0] if version else None
    conn.rollback()
    return str(found) if found is not None else None


def check_schema(conn: psycopg.Connection, database_url: str) -> None:
    """Refuse to run against a database whose schema is missing or not this code's."""
    found = current_revision(conn)
    if found is None:
        raise SchemaMissing(
            f"the txstore tables are missing in {redact(database_url)}; "
            f"run `{UPGRADE_COMMAND}` with TXSTORE_DATABASE_URL set to that database"
        )
    if found != SCHEMA_REVISION:
        raise SchemaMissing(
            f"the database schema is at revision {found} but this txstore needs {SCHEMA_REVISION}; "
            f"run `{UPGRADE_COMMAND}` (or upgrade txstore if the database is newer)"
        )
