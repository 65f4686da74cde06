"""The job lock: how ``status`` and ``reset`` know an instance of a job is running.

A running job holds a *shared* PostgreSQL advisory lock named after it on its
driver connection, so several instances may run at once (the conditional
offset update, not this lock, is what keeps results exact). ``reset`` takes
the same lock *exclusively* for its transaction, so it refuses while any
instance runs, and a job starting during a reset waits for it briefly.
"""

from __future__ import annotations

import psycopg

from txstore.core.errors import TxstoreError

_KEY = "hashtextextended('txstore job ' || %s, 0)"
START_WAIT_SECONDS = 10


class JobLocked(TxstoreError):
    """The job lock is held the wrong way: a reset while starting, or a running job during a reset."""


def hold_job_lock(conn: psycopg.Connection, job: str) -> None:
    """Take the shared job lock for the session (until the connection closes)."""
    try:
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{START_WAIT_SECONDS}s'")
            conn.execute(f"SELECT pg_advisory_lock_shared({_KEY})", (job,))
    except psycopg.errors.LockNotAvailable:
        raise JobLocked(
            f"job {job!r}: a `txstore reset` of this job is in progress (waited {START_WAIT_SECONDS}s); "
            "start the job again when it has finished"
        ) from None


def job_running(conn: psycopg.Connection, job: str) -> bool:
    """Whether some session holds the job lock now (checked without waiting)."""
    with conn.transaction():
        row = conn.execute(f"SELECT pg_try_advisory_xact_lock({_KEY})", (job,)).fetchone()
        free = bool(row and row[0])
    return not free


# The sessions holding the job lock: pg_locks shows a bigint advisory key as its high and low
# 32 bits (classid, objid) with objsubid 1.
_HOLDERS = f"""
WITH k AS (SELECT {_KEY} AS key)
SELECT a.pid, coalesce(host(a.client_addr), 'local'),
       to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')
FROM pg_locks l JOIN pg_stat_activity a USING (pid), k
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.classid::bigint = (k.key >> 32) & 4294967295 AND l.objid::bigint = k.key & 4294967295
ORDER BY a.backend_start, a.pid
"""


def lock_job_for_reset(conn: psycopg.Connection, job: str) -> None:
    """Inside the caller's transaction: take the job lock exclusively, or refuse, naming the
    sessions that hold it.

    A holder is usually a running instance. It can also be a session an
    instance left behind (its client gone behind a frozen network, or a proxy
    that kept the server side open), which blocks every reset until it ends:
    the line says how to end it.
    """
    row = conn.execute(f"SELECT pg_try_advisory_xact_lock({_KEY})", (job,)).fetchone()
    if not (row and row[0]):
        holders = conn.execute(_HOLDERS, (job,)).fetchall()
        named = ", ".join(f"{pid} from {client} since {since} UTC" for pid, client, since in holders)
        terminate = "; ".join(f"SELECT pg_terminate_backend({pid})" for pid, _, _ in holders)
        plural = "s" if len(holders) > 1 else ""
        raise JobLocked(
            f"job {job!r} is running (it holds its job lock"
            + (f": PostgreSQL session{plural} {named}" if holders else "")
            + "); stop every instance (SIGTERM lets the current batch finish), then run the reset again"
            + (
                f"; if no instance runs, end the left-over session{plural} with {terminate}"
                if holders
                else ""
            )
        )
