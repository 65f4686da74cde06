"""PostgreSQL connections: URLs, redaction, timeouts, and one connection per worker.

Users give one URL (``--database-url`` or ``TXSTORE_DATABASE_URL``) in either
libpq form (``postgresql://...``) or SQLAlchemy form
(``postgresql+psycopg://...``); psycopg and Alembic each get the spelling
they need. Passwords never leave this module in a message.

Every connection txstore opens (:func:`connect`: the driver, Spark workers,
the ``txstore`` command) is bounded, so a frozen network or a stuck server
can never hang a job:

- ``READ COMMITTED``, whatever the server's ``default_transaction_isolation``:
  concurrent commits add to the same topic-total row, which under repeatable
  read or serializable would fail with serialization errors instead of
  waiting for each other;
- server-side ``statement_timeout`` (5 min), ``lock_timeout`` (1 min) and
  ``idle_in_transaction_session_timeout`` (10 min), far above what a normal
  commit needs (a per-batch commit of a million rows takes seconds);
- TCP keepalives and ``tcp_user_timeout``, on both ends: a peer that stops
  answering fails the connection within :data:`FROZEN_PEER_BOUND_SECONDS`
  (30 s of unacknowledged data, or 15 s idle + 3 unanswered probes 5 s
  apart), and the server ends the session of a client that vanished (its
  transaction rolls back and frees its row locks) just as soon.

Each is only a default: a libpq parameter in the URL (``?tcp_user_timeout=..``,
``?keepalives_idle=..``, ``?connect_timeout=..``) replaces ours, and so does a
``-c name=value`` in the URL's ``options=`` (or ``PGOPTIONS``) for the
server's settings. The isolation level is not negotiable.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import TYPE_CHECKING

import psycopg
from psycopg.conninfo import conninfo_to_dict

from txstore.core.env import DATABASE_URL_ENV as DATABASE_URL_ENV
from txstore.core.errors import ConfigError, DatabaseUnavailable, first_line

if TYPE_CHECKING:  # SQLAlchemy is the driver's (migrations); Spark tasks import this module
    from sqlalchemy.engine import URL

CONNECT_TIMEOUT_SECONDS = 10
STATEMENT_TIMEOUT = "5min"
LOCK_TIMEOUT = "1min"
IDLE_IN_TRANSACTION_TIMEOUT = "10min"
KEEPALIVES_IDLE_SECONDS = 15
KEEPALIVES_INTERVAL_SECONDS = 5
KEEPALIVES_COUNT = 3
TCP_USER_TIMEOUT_MS = 30_000
FROZEN_PEER_BOUND_SECONDS = max(
    TCP_USER_TIMEOUT_MS / 1000, KEEPALIVES_IDLE_SECONDS + KEEPALIVES_INTERVAL_SECONDS * KEEPALIVES_COUNT
)
"""How long a connection whose peer stopped answering can live: 30 s."""

# libpq parameters set unless the URL gives its own.
_NETWORK_DEFAULTS: dict[str, object] = {
    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
    "keepalives": 1,
    "keepalives_idle": KEEPALIVES_IDLE_SECONDS,
    "keepalives_interval": KEEPALIVES_INTERVAL_SECONDS,
    "keepalives_count": KEEPALIVES_COUNT,
    "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
}
# Server settings, as startup options: ours first, so the URL's own options= (later) win.
# The server's keepalives too: a session whose client vanished behind a frozen
# network ends (rolling back, freeing its row locks) as soon as ours would.
_SERVER_DEFAULTS = (
    f"-c statement_timeout={STATEMENT_TIMEOUT} -c lock_timeout={LOCK_TIMEOUT} "
    f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT} "
    f"-c tcp_keepalives_idle={KEEPALIVES_IDLE_SECONDS} -c tcp_keepalives_interval={KEEPALIVES_INTERVAL_SECONDS} "
    f"-c tcp_keepalives_count={KEEPALIVES_COUNT} -c tcp_user_timeout={TCP_USER_TIMEOUT_MS}"
)
# Last, so nothing overrides it.
_PINNED = r"-c default_transaction_isolation=read\ committed"

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
    from sqlalchemy.engine import make_url  # not on the workers (README: what workers need)

    return make_url(libpq_url(url)).set(drivername="postgresql+psycopg")


_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
_ENCODING_HINT = (
    "percent-encode special characters in the user name and password "
    "(@ as %40, : as %3A, / as %2F, % as %25, # as %23, ? as %3F)"
)
_ENCODING_HINT_SHORT = "percent-encode it (@ as %40, : as %3A, / as %2F, % as %25, # as %23, ? as %3F)"


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


def _unencoded_at(url: str) -> bool:
    """Whether the user name or password holds a raw ``@``: libpq ends them at the first ``@``
    and reads the rest (part of the password) as the host."""
    _, sep, rest = libpq_url(url).partition("://")
    return bool(sep) and "@" in rest.rpartition("@")[0]


def connection_settings(url: str) -> dict[str, object]:
    """The libpq parameters :func:`connect` adds to ``url``: timeouts, keepalives, options.

    A parameter the URL already has is left alone; the URL's ``options=``
    (else ``PGOPTIONS``) come after ours, so its ``-c`` settings win, and the
    isolation level is appended after everything.
    """
    try:
        given = conninfo_to_dict(libpq_url(url))
    except psycopg.ProgrammingError:
        given = {}  # connect() reports the unparsable URL itself
    settings = {k: v for k, v in _NETWORK_DEFAULTS.items() if k not in given}
    user_options = str(given.get("options") or os.environ.get("PGOPTIONS") or "").strip()
    settings["options"] = " ".join(o for o in (_SERVER_DEFAULTS, user_options, _PINNED) if o)
    return settings


def connect(
    url: str, *, autocommit: bool = False, given_by: str = f"--database-url / {DATABASE_URL_ENV}"
) -> psycopg.Connection:
    """Open a bounded, READ COMMITTED connection (see the module docstring).

    Failures become one redacted line; a server that cannot be reached says to check
    ``given_by``, where the URL came from.
    """
    conninfo = libpq_url(url)
    kwargs: dict[str, object] = {
        "autocommit": autocommit,
        "application_name": "txstore",
        **connection_settings(url),
    }
    try:
        conn = psycopg.connect(conninfo, **kwargs)  # type: ignore[arg-type]
        # Also on every BEGIN psycopg sends: no server or role setting can change it.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        return conn
    except psycopg.OperationalError as e:
        if _unencoded_at(url):
            # libpq's message names the host it read, which is part of the password: not shown.
            raise ConfigError(
                f"cannot connect to PostgreSQL at {redact(url)}: the user name or password holds an '@' "
                f"that is not percent-encoded, so the host was read from the password; {_ENCODING_HINT_SHORT}"
            ) from None
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact(url)}: {first_line(e)}; "
            f"check {given_by} and that the server is up"
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
