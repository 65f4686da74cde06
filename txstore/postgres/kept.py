"""One PostgreSQL connection kept per process and database, for calls that come again and again.

The stream sink's commit runs in a Python planner worker of the driver, once per micro-batch;
PySpark reuses those workers, so a connection opened by one commit can serve the next. Opening
one took 6-12 ms a micro-batch (timed on this project's 2-core machine), against under 1 ms
to check that a kept one still answers.

Steps of :func:`kept_connection`:

1. take the connection kept for the URL in this process, if there is one: a connection
   inherited from another process (a fork) is forgotten, never used or closed here (its socket is
   the parent's); one that is closed, broken or inside a transaction is closed;
2. check that it still answers (``SELECT 1``, rolled back): the server may have restarted or
   ended the session since the last call; if it does not, close it;
3. if none is left, open a new one (:func:`~txstore.postgres.db.connect`: its timeouts, its
   one-line errors; or the caller's ``opener``, such as the stream sink's
   :func:`~txstore.postgres.reconnect.connect_retrying`, which waits, within bounds, for a
   server that is restarting);
4. hand it to the caller; after a block that returned, commit what it left open (as psycopg's
   ``with connect() as conn`` does) and keep the connection for the next call; after a block
   that raised, close it (its state is not known).

Why a check and not a retry: the callers write in the block, and a retried write would need its
own proof that it ran once. The check runs before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg.pq import TransactionStatus

from txstore.postgres.db import connect

_kept: dict[str, tuple[int, psycopg.Connection]] = {}


def _answers(conn: psycopg.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
        conn.rollback()
        return True
    except psycopg.Error:
        return False


def _take(url: str) -> psycopg.Connection | None:
    """Steps 1-2: the kept connection for ``url``, checked; ``None`` when there is none."""
    entry = _kept.pop(url, None)
    if entry is None:
        return None
    pid, conn = entry
    if pid != os.getpid():
        return None  # a parent's: its socket is not ours to use or to close
    usable = not conn.closed and not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
    if usable and _answers(conn):
        return conn
    conn.close()
    return None


@contextmanager
def kept_connection(
    url: str, opener: Callable[[str], psycopg.Connection] = connect
) -> Iterator[psycopg.Connection]:
    """A checked connection to ``url``, kept for this process's next call (module docstring);
    ``opener`` opens a new one when none is kept or the kept one no longer answers."""
    conn = _take(url) or opener(url)
    try:
        yield conn
    except BaseException:
        conn.close()
        raise
    if conn.closed:  # the caller closed it: nothing to keep
        return
    try:
        conn.commit()  # then idle: no transaction open
    except BaseException:
        conn.close()
        raise
    _kept[url] = (os.getpid(), conn)


def close_kept() -> None:
    """Close every connection this process keeps (tests; a worker's exit closes them anyway)."""
    while _kept:
        _, (pid, conn) = _kept.popitem()
        if pid == os.getpid():
            conn.close()
