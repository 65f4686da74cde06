"""Connecting again after PostgreSQL went away: a few attempts, with backoff, bounded in time.

A streaming query runs for days, and managed PostgreSQL restarts and fails over. A connection
the server ended (a restart, a failover, ``pg_terminate_backend``) fails at its next use; the
stream's planner and sink then open a new one with :func:`connect_retrying` before they write
anything, so the restart costs the query a pause, not its life.

Bounds: at most :data:`RECONNECT_ATTEMPTS` connection attempts (each bounded by libpq's connect
timeout, :data:`~txstore.postgres.db.CONNECT_TIMEOUT_SECONDS`), waiting 0.5 s, 1 s, 2 s, ... (at
most :data:`MAX_BACKOFF_SECONDS`) between them, and no attempt starts after
:data:`RECONNECT_SECONDS`. A URL that cannot work (:class:`~txstore.core.errors.ConfigError`) is not
retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from txstore.core.errors import DatabaseUnavailable
from txstore.postgres.db import CONNECT_TIMEOUT_SECONDS, connect, redact

RECONNECT_ATTEMPTS = 8
RECONNECT_SECONDS = 6 * CONNECT_TIMEOUT_SECONDS
"""No attempt starts later than this after the first (one more connect timeout at most)."""
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 8.0


def connect_retrying(
    url: str,
    *,
    given_by: str,
    attempts: int = RECONNECT_ATTEMPTS,
    seconds: float = RECONNECT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> psycopg.Connection:
    """A new connection (:func:`~txstore.postgres.db.connect`), tried again while the server does
    not answer, within the bounds of the module docstring; else one line saying how long it tried."""
    start = clock()
    backoff = FIRST_BACKOFF_SECONDS
    tried = 0
    while True:
        tried += 1
        try:
            return connect(url, given_by=given_by)
        except DatabaseUnavailable as e:
            last = e
        elapsed = clock() - start
        if tried >= attempts or elapsed + backoff > seconds:
            raise DatabaseUnavailable(
                f"PostgreSQL at {redact(url)} did not answer {tried} connection attempts over "
                f"{elapsed:.0f} s ({last}); the query stops: restart it once the server is up "
                "(what it committed stays in PostgreSQL; nothing is counted twice)"
            ) from None
        sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)


def session_lost(conn: psycopg.Connection | None) -> bool:
    """Whether ``conn``'s session is over (the server ended it, or the network did): a statement
    that failed on it failed for that, and can run again on a new connection where it is safe."""
    return conn is not None and (conn.closed or conn.broken)
