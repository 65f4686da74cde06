"""The job lock: how ``status`` and ``reset`` know an instance of a job is running.

A running job holds a *shared* PostgreSQL advisory lock named after it on its
driver connection, so several instances may run at once (the conditional
offset update, not this lock, is what keeps results exact). ``reset`` takes
the same lock *exclusively* for its transaction, so it refuses while any
instance runs, and a job starting during a reset waits for it briefly.
"""

from __future__ import annotations

import psycopg

from txstore.errors import TxstoreError

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


def lock_job_for_reset(conn: psycopg.Connection, job: str) -> None:
    """Inside the caller's transaction: take the job lock exclusively, or refuse."""
    row = conn.execute(f"SELECT pg_try_advisory_xact_lock({_KEY})", (job,)).fetchone()
    if not (row and row[0]):
        raise JobLocked(
            f"job {job!r} is running (it holds its job lock); stop every instance "
            "(SIGTERM lets the current batch finish), then run the reset again"
        )
