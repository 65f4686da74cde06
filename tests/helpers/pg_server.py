"""Which PostgreSQL the tests use: the one you name, the local one, or a throwaway one.

Decided once per test run (tests/conftest.py calls :func:`open_session` when the
session starts and :func:`close_session` at the end):

1. If any libpq variable is set (``PGHOST``, ``PGPORT``, ``PGUSER``,
   ``PGPASSWORD``), the server they name, with ``127.0.0.1``, ``5432`` and
   ``postgres`` for the ones left out. The fallback never replaces a server you
   named (CI names one).
2. Else, if something answers at 127.0.0.1:5432 within a second, that server,
   as ``postgres`` without a password.
3. Else a throwaway server from pgserver's binaries (tests/helpers/private_postgres.py)
   on a free 127.0.0.1 port, trusting ``postgres``, with room for Spark
   workers and job processes (100 connections). Its address is exported as
   ``PGHOST``/``PGPORT``/``PGUSER`` so that code reading them (the chaos
   runner, the benchmark, subprocesses) finds it too; it is stopped by pid and
   its directory deleted when the run ends.

Then one login to the ``postgres`` database, bounded by a connect timeout: if
it fails, :class:`NoTestServer` carries one line naming the server, why, and
what to set, so the run stops in seconds instead of a minute per test.

:func:`address` is the one source of the server's address for fixtures and
``pg_url``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg

from txstore.core.errors import first_line

LIBPQ_VARIABLES = ("PGHOST", "PGPORT", "PGUSER", "PGPASSWORD")
PROBE_SECONDS = 1.0
LOGIN_TIMEOUT_SECONDS = 3  # libpq's connect_timeout: whole seconds, at least 2
EMBEDDED_MAX_CONNECTIONS = 100


@dataclass(frozen=True)
class Address:
    host: str
    port: int
    user: str
    password: str

    def url(self, dbname: str, user: str | None = None, password: str | None = None) -> str:
        user = self.user if user is None else user
        password = self.password if password is None else password
        auth = f"{quote(user, safe='')}:{quote(password, safe='')}" if password else quote(user, safe="")
        return f"postgresql://{auth}@{self.host}:{self.port}/{dbname}"

    def __str__(self) -> str:  # never the password
        return f"{self.user}@{self.host}:{self.port}"


DEFAULT = Address("127.0.0.1", 5432, "postgres", "")


@dataclass(frozen=True)
class TestServer:
    address: Address
    named_by: tuple[str, ...]  # the libpq variables that named it; () if none did
    embedded_in: Path | None = None  # the throwaway server's directory; None for a server of yours

    def notice(self) -> str | None:
        """The one line that says the tests run on a throwaway server, or None."""
        if self.embedded_in is None:
            return None
        return (
            f"PostgreSQL: nothing answers at {DEFAULT.host}:{DEFAULT.port} and {'/'.join(LIBPQ_VARIABLES)} "
            f"are unset, so the tests use a throwaway server (pgserver) at {self.address}, "
            f"removed at the end ({self.embedded_in})"
        )


class NoTestServer(Exception):
    """The tests cannot use the server chosen; ``str()`` is the one line to show."""


def named_address(environ: Mapping[str, str]) -> tuple[Address, tuple[str, ...]] | None:
    """The server the libpq variables name, and which of them are set; None if none is."""
    named_by = tuple(name for name in LIBPQ_VARIABLES if environ.get(name))
    if not named_by:
        return None
    port = environ.get("PGPORT", str(DEFAULT.port))
    if not port.isdigit():
        raise NoTestServer(
            f"PGPORT={port!r} is not a port number; set PGPORT to the server's port, e.g. 5432"
        )
    address = Address(
        environ.get("PGHOST") or DEFAULT.host,
        int(port),
        environ.get("PGUSER") or DEFAULT.user,
        environ.get("PGPASSWORD", ""),
    )
    return address, named_by


def answers(host: str, port: int, timeout: float = PROBE_SECONDS) -> bool:
    """Whether anything accepts a TCP connection at host:port within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def login_problem(address: Address) -> str | None:
    """Why ``address`` cannot be logged in to (one line), or None if it can."""
    try:
        psycopg.connect(address.url("postgres"), connect_timeout=LOGIN_TIMEOUT_SECONDS).close()
    except psycopg.Error as e:
        return first_line(e)
    return None


def unusable(server: TestServer, problem: str) -> NoTestServer:
    if server.named_by:
        given = f"named by {', '.join(server.named_by)}"
        fix = (
            f"start it, or set {'/'.join(LIBPQ_VARIABLES)} to a server that is up, "
            "or unset them all to let the tests start a throwaway one"
        )
    else:
        given = "the default"
        fix = "set PGUSER/PGPASSWORD to a role that may log in and create databases, or PGHOST/PGPORT to another server"
    return NoTestServer(
        f"PostgreSQL for the tests at {server.address} ({given}) cannot be used: {problem}; {fix}"
    )


_session = contextlib.ExitStack()
_server: TestServer | None = None


def open_session(environ: MutableMapping[str, str]) -> TestServer:
    """Choose the server (steps 1-3 above), check a login, and remember it until
    :func:`close_session`. Raises :class:`NoTestServer` with the line to show."""
    global _server
    named = named_address(environ)
    if named is not None:
        server = TestServer(*named)
    elif answers(DEFAULT.host, DEFAULT.port):
        server = TestServer(DEFAULT, ())
    else:
        server = _start_embedded(environ)
    problem = login_problem(server.address)
    if problem is not None:
        close_session()
        raise unusable(server, problem)
    _server = server
    return server


def _start_embedded(environ: MutableMapping[str, str]) -> TestServer:
    from tests.helpers.private_postgres import throwaway_postgres

    try:
        started = _session.enter_context(throwaway_postgres(max_connections=EMBEDDED_MAX_CONNECTIONS))
    except Exception as e:
        close_session()
        raise NoTestServer(
            f"PostgreSQL for the tests: nothing answers at {DEFAULT.host}:{DEFAULT.port}, "
            f"{'/'.join(LIBPQ_VARIABLES)} are unset, and a throwaway server (pgserver) did not start: "
            f"{first_line(e)}; start PostgreSQL there or set {'/'.join(LIBPQ_VARIABLES)} to one that is up"
        ) from e
    address = Address("127.0.0.1", started.port, "postgres", "")
    exported = {"PGHOST": address.host, "PGPORT": str(address.port), "PGUSER": address.user}
    environ.update(exported)
    for name in exported:  # none was set, or there would be no throwaway server
        _session.callback(environ.pop, name, None)
    return TestServer(address, (), started.directory)


def close_session() -> None:
    """Stop the throwaway server if one was started (by pid; its directory deleted)."""
    global _server
    _server = None
    _session.close()


def address() -> Address:
    """The test server's address: the session's, or (outside a test run) the named or default one."""
    if _server is not None:
        return _server.address
    named = named_address(os.environ)
    return named[0] if named else DEFAULT
