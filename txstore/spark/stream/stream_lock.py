"""A streaming query's lock on its job: one query of a job at a time, and who holds it.

The stream source's planning connection takes the job's *stream lock* (a session-level advisory
lock keyed by the job's name) for the query's life, beside the shared job lock that keeps
``txstore reset`` out. A second query of the job (another application, or a union or join of two
sources of the job in one query) is refused with :class:`StreamLocked`, in one line naming the
holder: its ``application_name`` (``txstore stream HOST:PID``, the driver's JVM) and address.

After a lost session the lock is taken again: the old session may outlive its client on the
server for a while, so while it is the only holder the lock is tried again within
:data:`~txstore.postgres.db.FROZEN_PEER_BOUND_SECONDS` (:func:`take_stream_lock`).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psycopg

from txstore.core.errors import TxstoreError
from txstore.postgres.db import FROZEN_PEER_BOUND_SECONDS

_STREAM_KEY = "hashtextextended('txstore stream ' || %s, 0)"


# The sessions holding a job's stream lock, in this database only: advisory locks are per
# database, and another database on the server may run a job of the same name. pg_locks shows a
# bigint advisory key as its high and low 32 bits (classid, objid) with objsubid 1.
_STREAM_HOLDERS = f"""
WITH k AS (SELECT {_STREAM_KEY} AS key)
SELECT l.pid, coalesce(host(a.client_addr), 'local'), coalesce(a.application_name, '')
FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid), k
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = (k.key >> 32) & 4294967295 AND l.objid::bigint = k.key & 4294967295
ORDER BY l.pid
"""


def stream_lock_holders(conn: psycopg.Connection, job: str) -> list[tuple[int, str]]:
    """The backend pids (and client addresses) of the sessions holding ``job``'s stream lock."""
    rows = conn.execute(_STREAM_HOLDERS, (job,)).fetchall()
    conn.rollback()
    return [(int(pid), str(client)) for pid, client, _ in rows]


class StreamLocked(TxstoreError):
    """Another streaming query of the same job holds its stream lock."""


def driver_process() -> str:
    """``host:pid`` of the Spark driver's JVM this planner worker serves (its nearest ``java``
    ancestor; the worker's parent where none is found): two sources in one application share it."""
    pid = os.getppid()
    for _ in range(8):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                break
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pid = os.getppid()
            break
    else:
        pid = os.getppid()
    return f"{socket.gethostname()}:{pid}"


def stream_lock_holder(conn: psycopg.Connection, job: str) -> tuple[str, str] | None:
    """The application name and client address of the session holding the job's stream lock in
    this database (None: nobody holds it now)."""
    row = conn.execute(_STREAM_HOLDERS, (job,)).fetchone()
    conn.rollback()
    return None if row is None else (str(row[2]), str(row[1]))


def stream_locked_line(job: str, holder: tuple[str, str] | None, me: str) -> str:
    """Why the job's stream lock is taken, in one line: a second source of the job in this Spark
    application (a union or join of two sources of one job), or another query elsewhere."""
    if holder is not None and holder[0] == me:
        return (
            f"job {job!r}: another readStream.format('txstore') of this job in this Spark application "
            "holds the job's stream lock: a union or join of two sources of the same job in one "
            "query (each would plan and commit the same offsets; read the job once and reuse the "
            "DataFrame, or give each source its own txstore.job), or a second running query of "
            "this job; nothing was read"
        )
    where = "" if holder is None else f" ({holder[0] or 'a session'} from {holder[1]})"
    return (
        f"job {job!r}: another streaming query of this job is running{where} (it holds the job's "
        "stream lock); stop it first, or give this query another txstore.job"
    )


def take_stream_lock(conn: psycopg.Connection, job: str, lost: int | None) -> None:
    """Take the job's stream lock (session-level), or raise :class:`StreamLocked`.

    ``lost``: the backend pid of this query's session that ended (None: the query's first). A
    session whose client lost it can outlive it on the server for a while (a network that
    stopped answering: up to :data:`~txstore.postgres.db.FROZEN_PEER_BOUND_SECONDS`), still
    holding the lock; while that old session is the only holder, the lock is tried again
    within that bound.
    """
    deadline = time.monotonic() + FROZEN_PEER_BOUND_SECONDS
    me = f"txstore stream {driver_process()}"
    while True:
        with conn.transaction():
            conn.execute("SELECT set_config('application_name', %s, false)", (me,))
            row = conn.execute(f"SELECT pg_try_advisory_lock({_STREAM_KEY})", (job,)).fetchone()
        if row and row[0]:
            return
        if lost is None:
            raise StreamLocked(stream_locked_line(job, stream_lock_holder(conn, job), me))
        holders = stream_lock_holders(conn, job)
        if {pid for pid, _ in holders} <= {lost} and time.monotonic() < deadline:
            time.sleep(1)  # our old session, not yet ended by the server (or just ended)
            continue
        named = ", ".join(f"PostgreSQL session {pid} from {client}" for pid, client in holders)
        raise StreamLocked(
            f"job {job!r}: this query lost its PostgreSQL session (pid {lost}) and, connected again, "
            f"found another streaming query of this job holding the stream lock ({named or 'since gone'}); "
            "this query stops before planning another micro-batch (what it committed stays, nothing "
            "is counted twice). Keep the other query, or stop it and restart this one with a new "
            "checkpointLocation (it then starts at the offsets in txn_offsets)"
        )
