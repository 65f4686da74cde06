"""Throwaway PostgreSQL servers from pgserver's binaries (a pip dependency of the demo).

Two uses: a server that checks passwords (scram-sha-256) for the tests of
logins, since the shared test server trusts every local connection and cannot
tell a wrong password from a right one; and the shared test server itself on a
machine that has none (tests/helpers/pg_server.py), which trusts 127.0.0.1.

Each is initialised in a new temporary directory, listens on a free 127.0.0.1
port, has TLS off, and is stopped by process id; its directory is deleted. As
root it runs as pgserver's unprivileged system user, like pgserver does, from a
copy of pgserver's binaries in that directory: the venv's may sit under a
folder only root may enter (a clone in root's home, whose .venv ``./dev``
builds), where that user cannot run them. (pgserver itself, which the demo
uses, opens every parent folder up to ``/`` to other users instead.)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg

from tests.helpers.local import free_port

SUPERUSER = "postgres"
# Every character that needs percent-encoding in a URL's user-info part.
SUPERUSER_PASSWORD = "p@ss:w/rd%#?"


def url(port: int, dbname: str, user: str = SUPERUSER, password: str = SUPERUSER_PASSWORD) -> str:
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}" if password else quote(user, safe="")
    return f"postgresql://{auth}@127.0.0.1:{port}/{dbname}"


def _binaries() -> Path:
    spec = importlib.util.find_spec("pgserver")  # not imported: it would set up its own server machinery
    assert spec is not None and spec.submodule_search_locations, "pip install pgserver (the demo extra)"
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _run_as() -> str | None:
    """The system user to run PostgreSQL as: it refuses to run as root."""
    if os.geteuid() != 0:
        return None
    user = "pgserver"  # the user pgserver itself creates to run as when started by root
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", user], check=True, capture_output=True, timeout=60)
    return user


def _reachable_copy(bin_dir: Path, home: Path) -> Path:
    """A copy of pgserver's binaries, libraries and share files in ``home``, readable by all.

    The layout is pip's (``pgserver/pginstall/{bin,lib,share}`` beside ``pgserver.libs``)
    because the binaries find their libraries relative to themselves."""
    install = bin_dir.parent
    copy = home / "pgserver-copy"
    for part in ("bin", "lib", "share"):
        shutil.copytree(install / part, copy / "pgserver" / "pginstall" / part, symlinks=True)
    libs = install.parent.parent / "pgserver.libs"  # auditwheel's folder of bundled libraries
    if libs.is_dir():
        shutil.copytree(libs, copy / "pgserver.libs", symlinks=True)
    for path in [copy, *copy.rglob("*")]:
        if not path.is_symlink():
            mode = path.stat().st_mode
            path.chmod(mode | 0o044 | (0o011 if path.is_dir() or mode & 0o100 else 0))
    return copy / "pgserver" / "pginstall" / "bin"


@dataclass(frozen=True)
class Server:
    """A running throwaway server: its TCP port on 127.0.0.1, its directory and its process."""

    port: int
    directory: Path
    pid: int


@contextlib.contextmanager
def private_postgres() -> Iterator[int]:
    """A server that checks the superuser's password (scram-sha-256); yields its port."""
    with throwaway_postgres(password=SUPERUSER_PASSWORD) as server:
        yield server.port


@contextlib.contextmanager
def throwaway_postgres(
    password: str | None = None,
    max_connections: int = 40,
    restartable: list[Callable[[float], None]] | None = None,
) -> Iterator[Server]:
    """Start a server in a new temporary directory; yield it; always stop it by pid and delete
    the directory.

    With ``password`` None every connection from 127.0.0.1 is trusted (like the usual local
    test server); otherwise the superuser logs in with that password (scram-sha-256).
    ``restartable``: a list to put the function that restarts the server into (the same data and
    port; :func:`restartable_postgres`); the process it last started is the one stopped at the end.
    """
    bin_dir = _binaries()
    user = _run_as()
    home = Path(tempfile.mkdtemp(prefix="txstore-test-pg-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        home.chmod(0o755)
        if user:
            entry = pwd.getpwnam(user)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            bin_dir = _reachable_copy(bin_dir, home)
        auth = ["--auth=trust"]
        if password is not None:
            password_file = home / "pw"
            password_file.write_text(password)
            if user:
                os.chown(password_file, pwd.getpwnam(user).pw_uid, -1)
            auth = ["--auth=scram-sha-256", f"--pwfile={password_file}"]
        data = home / "data"
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        subprocess.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                *auth,
                "--encoding=UTF8",
                "--no-sync",
            ],
            user=user,
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        port = free_port()
        settings = {"ssl": "off", "fsync": "off", "max_connections": str(max_connections)}
        login = url(port, "postgres", password=password or "")

        process = _start(bin_dir, data, home, port, settings, user, env, login)

        def restart(down_seconds: float) -> None:
            nonlocal process
            if process is not None:
                _stop(process)
            process = None
            time.sleep(down_seconds)
            process = _start(bin_dir, data, home, port, settings, user, env, login)

        if restartable is not None:
            restartable.append(restart)
        yield Server(port, home, process.pid)
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(home, ignore_errors=True)


def _start(
    bin_dir: Path,
    data: Path,
    home: Path,
    port: int,
    settings: dict[str, str],
    user: str | None,
    env: dict[str, str],
    login: str,
) -> subprocess.Popen[bytes]:
    """Start the server on ``data`` and wait (at most 60 s) until it takes logins."""
    log = home / "postgres.log"
    with log.open("ab") as log_file:
        process = subprocess.Popen(
            [
                str(bin_dir / "postgres"),
                *("-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(home)),
                *(arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")),
            ],
            user=user,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            psycopg.connect(login, connect_timeout=5).close()
            return process
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                _stop(process)
                raise RuntimeError(f"private PostgreSQL did not start:\n{log.read_text()}") from None
            time.sleep(0.2)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server by its process id: a fast shutdown, else SIGKILL after 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)  # fast shutdown
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@contextlib.contextmanager
def restartable_postgres(max_connections: int = 40) -> Iterator[tuple[Server, Callable[[float], None]]]:
    """A throwaway server (trusting 127.0.0.1) and a function that restarts it: a fast shutdown
    (every session ends, as in a managed server's restart), ``down_seconds`` with no server, then
    the same data on the same port. Whichever process runs at the end is stopped by its pid."""
    restarts: list[Callable[[float], None]] = []
    with throwaway_postgres(max_connections=max_connections, restartable=restarts) as server:
        yield server, restarts[0]
