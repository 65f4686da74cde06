"""PostgreSQL connections: URLs, redaction, timeouts, and one connection per worker.

Users give one URL (``--database-url`` or ``TXSTORE_DATABASE_URL``) in either
libpq form (``postgresql://...``) or SQLAlchemy form
(``postgresql+psycopg://...``); psycopg and Alembic each get the spelling
they need. Passwords never leave this module in a message.
"""

from __future__ import annotations

import contextlib
import os
import re

import psycopg
from sqlalchemy.engine import URL, make_url

from txstore.errors import ConfigError, DatabaseUnavailable, first_line

DATABASE_URL_ENV = "TXSTORE_DATABASE_URL"
CONNECT_TIMEOUT_SECONDS = 10

_SCHEME = re.compile(r"^(postgres|postgresql)(\+\w+)?://", re.IGNORECASE)


def resolve_database_url(given: str | None) -> str:
    """The URL from a flag, else from ``TXSTORE_DATABASE_URL``; never a built-in default."""
    url = given or os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise ConfigError(f"no database given: pass --database-url or set {DATABASE_URL_ENV}")
    if not _SCHEME.match(url):
        raise ConfigError(
            f"database URL {redact(url)} is not a PostgreSQL URL; "
            "expected postgresql://user:password@host:5432/dbname"
        )
    return url


def libpq_url(url: str) -> str:
    """The URL as libpq/psycopg accept it (no ``+driver`` suffix)."""
    return _SCHEME.sub("postgresql://", url, count=1)


def sqlalchemy_url(url: str) -> URL:
    """The URL for SQLAlchemy and Alembic, always with the psycopg 3 driver."""
    return make_url(libpq_url(url)).set(drivername="postgresql+psycopg")


_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
_ENCODING_HINT = (
    "percent-encode special characters in the user name and password "
    "(@ as %40, : as %3A, / as %2F, % as %25, # as %23, ? as %3F)"
)


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, safe for any log or error.

    Works on the text, not on a parsed URL, so a malformed URL (say a password
    with an unencoded ``@`` or ``/``) is redacted too: everything between
    ``user:`` and the last ``@`` goes, and so does a ``password=`` parameter.
    """
    text = libpq_url(url)
    scheme, sep, rest = text.partition("://")
    if sep and "@" in rest:
        userinfo, _, host_and_more = rest.rpartition("@")
        user, has_password, _ = userinfo.partition(":")
        text = f"{scheme}://{user}{':***' if has_password else ''}@{host_and_more}"
    return _PASSWORD_PARAM.sub(r"\1***", text)


def _has_password(url: str) -> bool:
    return redact(url) != libpq_url(url)


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection:
    """Open a connection with a connect timeout; failures become one redacted line."""
    conninfo = libpq_url(url)
    kwargs: dict[str, object] = {"autocommit": autocommit, "application_name": "txstore"}
    if "connect_timeout" not in conninfo:
        kwargs["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    try:
        return psycopg.connect(conninfo, **kwargs)  # type: ignore[arg-type]
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact(url)}: {first_line(e)}; "
            f"check --database-url / {DATABASE_URL_ENV} and that the server is up"
        ) from None
    except psycopg.ProgrammingError as e:
        # libpq quotes the token it could not parse, which may be part of the password.
        if _has_password(url):
            raise ConfigError(f"database URL {redact(url)} cannot be parsed; {_ENCODING_HINT}") from None
        raise ConfigError(
            f"database URL {redact(url)} cannot be parsed ({first_line(e)}); "
            "expected postgresql://user:password@host:5432/dbname"
        ) from None


_worker_connections: dict[str, psycopg.Connection] = {}


def worker_connection(url: str) -> psycopg.Connection:
    """One connection per URL per process, reused by every task a Spark worker runs.

    A reused connection is checked first (one cheap round trip): the server
    may have closed it while the worker sat idle, and a task should not fail
    for that. One left inside a transaction (a task that died half-way) is
    rolled back before reuse.
    """
    conn = _worker_connections.get(url)
    if conn is not None and not conn.closed and not conn.broken:
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            # Left open: the task's commit transaction simply starts here.
            conn.execute("SELECT 1")
            return conn
        except psycopg.Error:
            forget_worker_connection(url)
    conn = connect(url)
    _worker_connections[url] = conn
    return conn


def forget_worker_connection(url: str) -> None:
    """Drop (and close) the cached connection, after an error left it unusable."""
    conn = _worker_connections.pop(url, None)
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
