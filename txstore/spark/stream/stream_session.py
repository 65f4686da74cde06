"""The stream source's planning session: one PostgreSQL connection that holds the job's stream
lock and its shared job lock for the query's life, and the planning methods run once more on a
new one when it ends under them (a restart, a failover, ``pg_terminate_backend``).

:class:`PlanningSession` is a mixin of :class:`~txstore.spark.stream.stream_source.TxstoreStreamReader`
(as :class:`~txstore.spark.stream.stream_tasks.ReadingTasks` is): the reader's planning methods
ask :meth:`PlanningSession._db` for the connection, and :func:`again_on_a_new_session` wraps
those safe to run twice.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import psycopg

from txstore.core.errors import DatabaseUnavailable, first_line
from txstore.core.failpoints import FailPoints
from txstore.postgres.db import connect
from txstore.postgres.locks import hold_job_lock
from txstore.postgres.migrate import check_schema
from txstore.postgres.reconnect import connect_retrying, session_lost
from txstore.postgres.stream_plans import stream_privileges
from txstore.spark.stream.stream_lock import take_stream_lock
from txstore.spark.stream.stream_options import GIVEN_BY, StreamOptions

log = logging.getLogger("txstore")


class PlanningSession:
    """The planning connection of a stream reader, opened by its planning methods only (a task
    opens none): ``_conn`` and its backend pid ``_session`` (once set, a new connection is a
    reconnect)."""

    options: StreamOptions
    _conn: psycopg.Connection | None
    _session: int | None

    def _db(self) -> psycopg.Connection:
        """The planning connection, holding the job's stream lock and its shared job lock.

        The query's first is opened at once (a wrong URL or a server down fails the query's start).
        A session that ended since (a restart, a failover, ``pg_terminate_backend``) is replaced:
        connected again within bounds (:func:`~txstore.postgres.reconnect.connect_retrying`), the
        locks taken again, or the query stops in one line if another query of the job took the
        stream lock meanwhile.
        """
        if self._conn is not None and not session_lost(self._conn):
            return self._conn
        url, lost = self.options.database_url, self._session
        if self._conn is None:
            conn = connect(url, given_by=GIVEN_BY)
        else:
            self._conn.close()
            self._conn = None
            log.warning(
                "job %s: the stream's planning session with PostgreSQL (pid %s) ended (server restarted, "
                "failed over, or the session was terminated); connecting again",
                self.options.job,
                lost,
            )
            conn = connect_retrying(url, given_by=GIVEN_BY)
            if self.options.failpoints:  # tests only
                FailPoints.parse(self.options.failpoints).hit("before-stream-relock")
        try:
            check_schema(conn, url)
            take_stream_lock(conn, self.options.job, lost)
            hold_job_lock(conn, self.options.job)
        except BaseException:
            conn.close()
            raise
        self._conn, self._session = conn, conn.info.backend_pid
        if lost is not None:
            log.warning(
                "job %s: connected to PostgreSQL again; the stream's locks are held again", self.options.job
            )
        return conn

    def _session_ended(self, error: psycopg.Error) -> bool:
        """Whether ``error`` came of the planning session's end: the connection is broken, or it
        dropped while :meth:`_db` connected again (then there is no connection and ``error`` is an
        OperationalError)."""
        if self._conn is not None:
            return session_lost(self._conn)
        return self._session is not None and isinstance(error, psycopg.OperationalError)

    def _close_session(self) -> None:
        """Close the planning connection (its locks end with it)."""
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None
        self._session = None


_Method = TypeVar("_Method", bound=Callable[..., Any])


def again_on_a_new_session(method: _Method) -> _Method:
    """A planning method that runs once more, on a new connection, if the planning session ended
    under it (:meth:`PlanningSession._db` connects again and re-takes the locks).

    Only for methods safe to run twice: they read, and their only writes are idempotent (the start
    rows, ``ON CONFLICT DO NOTHING``; the plan, replaced whole). A second end of the session in
    the same call stops the query in one line.
    """

    @functools.wraps(method)
    def planning(self: PlanningSession, *args: Any, **kwargs: Any) -> Any:
        with stream_privileges(self.options.job, f"planning the stream ({method.__name__})"):
            return again(self, *args, **kwargs)

    def again(self: PlanningSession, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except psycopg.Error as e:
            if not self._session_ended(e):
                raise
            log.warning(
                "job %s: %s: the PostgreSQL session ended (%s); planning again on a new connection",
                self.options.job,
                method.__name__,
                first_line(e),
            )
        try:
            return method(self, *args, **kwargs)
        except psycopg.Error as e:
            if not self._session_ended(e):
                raise
            raise DatabaseUnavailable(
                f"job {self.options.job!r}: the PostgreSQL session ended twice during one {method.__name__} "
                f"({first_line(e)}); the query stops, nothing of this micro-batch was written: restart it "
                "once PostgreSQL is steady"
            ) from None

    return cast(_Method, planning)
