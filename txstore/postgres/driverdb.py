"""The driver's PostgreSQL connection, reused across batches.

Opened on first use: the schema is checked and the job's lock taken
(:func:`~txstore.postgres.locks.hold_job_lock`), so at most one driver of a job
plans and commits at a time. A dropped or broken connection is opened
again, with the same checks, at the next use.
"""

from __future__ import annotations

import psycopg

from txstore.postgres.db import connect
from txstore.postgres.locks import hold_job_lock
from txstore.postgres.migrate import check_schema


class DriverConnection:
    """``get()`` the open connection (opening it if need be), ``drop()`` it after an error."""

    def __init__(self, database_url: str, job: str) -> None:
        self.database_url = database_url
        self.job = job
        self._conn: psycopg.Connection | None = None

    def get(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.database_url)
            check_schema(self._conn, self.database_url)
            hold_job_lock(self._conn, self.job)
        return self._conn

    def drop(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None
