"""The tests' own PostgreSQL (tests/helpers/pg_server.py), the way a user meets it.

On a fresh machine with no server the README's test command must work: a fresh
clone runs its database tests on a throwaway server, says so in one line and
removes it. A server the user named but that is down stops the run in seconds
with one line saying what to set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.local import free_port
from tests.helpers.pg_server import DEFAULT, LIBPQ_VARIABLES, Address, NoTestServer, named_address

NOTICE = re.compile(
    r"^PostgreSQL: nothing answers at 127\.0\.0\.1:5432 and PGHOST/PGPORT/PGUSER/PGPASSWORD are unset, "
    r"so the tests use a throwaway server \(pgserver\) at postgres@127\.0\.0\.1:(\d+), "
    r"removed at the end \((/\S+)\)$",
    re.MULTILINE,
)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without libpq variables or pytest's own, plus ``extra``."""
    drop = (*LIBPQ_VARIABLES, "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "PYTEST_VERSION", "PYTHONPATH")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def test_the_libpq_variables_name_the_server_and_the_rest_default() -> None:
    assert named_address({}) is None
    assert named_address({"PGHOST": "", "HOME": "/root"}) is None  # empty is unset, as for libpq
    assert named_address({"PGPORT": "5433"}) == (Address("127.0.0.1", 5433, "postgres", ""), ("PGPORT",))
    given = {"PGHOST": "db", "PGUSER": "ci", "PGPASSWORD": "p@ss/w:rd"}
    address, named_by = named_address(given) or (DEFAULT, ())
    assert named_by == ("PGHOST", "PGUSER", "PGPASSWORD")
    assert address.url("x") == "postgresql://ci:p%40ss%2Fw%3Ard@db:5432/x"
    assert str(address) == "ci@db:5432"  # what messages show: never the password
    with pytest.raises(NoTestServer, match=r"^PGPORT='fifty' is not a port number; set PGPORT"):
        named_address({"PGPORT": "fifty"})


def test_a_named_server_that_is_down_stops_the_run_in_seconds_with_one_line() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/postgres/test_schema.py"],
        cwd=REPO,
        env=clean_env(PGHOST="127.0.0.1", PGPORT=str(port)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 4, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.strip() == (
        f"ERROR: PostgreSQL for the tests at postgres@127.0.0.1:{port} (named by PGHOST, PGPORT) cannot be "
        f'used: connection failed: connection to server at "127.0.0.1", port {port} failed: Connection '
        "refused; start it, or set PGHOST/PGPORT/PGUSER/PGPASSWORD to a server that is up, or unset them "
        "all to let the tests start a throwaway one"
    )
    assert elapsed < 30  # pytest's start-up and one refused login; not a minute per test


def _can_isolate_network() -> str | None:
    """Why a test cannot run in a network namespace of its own here, or None if it can."""
    if os.geteuid() != 0:
        return "needs root for unshare -n (a network namespace with no PostgreSQL in it)"
    missing = [tool for tool in ("unshare", "ip", "git") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH"
    if not (REPO / ".git").exists():
        return "needs a git checkout to clone"
    return None


def processes_mentioning(text: str) -> list[int]:
    """Pids of processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.fresh_clone
@pytest.mark.timeout(300)
def test_a_fresh_clone_with_no_postgresql_reachable_runs_database_tests_on_a_throwaway_server(
    tmp_path: Path,
) -> None:
    reason = _can_isolate_network()
    if reason:
        pytest.skip(reason)
    clone = tmp_path / "txstore"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=60)
    # This venv's packages, the clone's code; no libpq variables; a network with only loopback.
    tests = [
        "tests/postgres/test_schema.py",
        "tests/postgres/test_sink.py::test_commit_adds_deltas_and_moves_the_offset_in_one_transaction",
        "tests/postgres/test_sink.py::test_a_worker_reuses_its_connection_and_replaces_one_the_server_closed",
    ]
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *tests]
    result = subprocess.run(
        ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command],
        cwd=clone,
        env=clean_env(PYTHONPATH=str(clone)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert re.search(r"^11 passed in ", output, re.MULTILINE), output[-3000:]
    notices = NOTICE.findall(output)
    assert len(notices) == 1, output[-3000:]
    assert output.count("PostgreSQL:") == 1
    [(port, directory)] = notices
    assert int(port) != 5432
    assert directory.startswith(tempfile.gettempdir()), directory
    assert not Path(directory).exists()  # removed at the end
    assert processes_mentioning(directory) == []  # and stopped


def _pgserver_install() -> tuple[Path, Path]:
    """pgserver's package folder and the folder of the libraries its binaries link (pgserver.libs)."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.submodule_search_locations
    package = Path(next(iter(spec.submodule_search_locations)))
    return package, package.parent / "pgserver.libs"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_throwaway_server_starts_from_a_venv_inside_a_private_folder(tmp_path: Path) -> None:
    """As root, a clone under a 0700 folder (any clone in root's home) has pgserver's binaries
    where pgserver's unprivileged user cannot reach them; ``./dev test`` builds .venv there."""
    if os.geteuid() != 0:
        pytest.skip("as another user PostgreSQL runs as that user, who can reach the venv")
    private = tmp_path / "home"
    site = private / "clone" / ".venv" / "site-packages"
    site.mkdir(parents=True)
    private.chmod(0o700)
    package, libs = _pgserver_install()
    shutil.copytree(package, site / "pgserver", ignore=shutil.ignore_patterns("include", "__pycache__"))
    if libs.exists():
        shutil.copytree(libs, site / "pgserver.libs")
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from tests.helpers import pg_server\n"
        "pg_server.answers = lambda *args, **kwargs: False  # as if nothing answered at 127.0.0.1:5432\n"
        "environ = {k: v for k, v in os.environ.items()}\n"
        "server = pg_server.open_session(environ)\n"
        "import importlib.util\n"
        "print(list(importlib.util.find_spec('pgserver').submodule_search_locations)[0])\n"
        "print(server.address.port, server.embedded_in)\n"
        "assert pg_server.login_problem(server.address) is None\n"
        "pg_server.close_session()\n"
        "assert not server.embedded_in.exists()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=clean_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO)])),
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    used, _ = result.stdout.splitlines()
    assert used == str(site / "pgserver")  # the private copy, not this venv's
    assert oct(private.stat().st_mode & 0o777) == oct(0o700)  # left private
