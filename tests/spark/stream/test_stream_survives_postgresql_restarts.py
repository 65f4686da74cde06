"""A streaming query outlives its PostgreSQL sessions: real Spark, real PostgreSQL, the mock broker.

Streams run for days; managed PostgreSQL restarts and fails over. The source's planning
session (which holds the job's stream lock and its shared job lock) and the sink's kept
connection are ended under a running query, by ``pg_terminate_backend`` and by a real restart
of a private server: the query connects again, takes its locks again, and counts exactly. If
another query of the job took the stream lock meanwhile, the first stops in one line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import txstore
from tests.conftest import produce
from tests.helpers.counting import BrokerDb, Counting, assert_counted_exactly
from tests.helpers.local import free_port
from tests.helpers.private_postgres import restartable_postgres, url
from tests.helpers.streams import JOB, counting_planner, sink, stream
from txstore.core.errors import DatabaseUnavailable
from txstore.postgres.migrate import upgrade
from txstore.postgres.reconnect import RECONNECT_ATTEMPTS, RECONNECT_SECONDS, connect_retrying
from txstore.postgres.stream_plans import load_plan
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark

TRIGGER = "300 milliseconds"

# The backend holding a job's stream lock, found as an operator would (pg_locks shows a bigint
# advisory key as its high and low 32 bits; an advisory lock is per database).
STREAM_LOCK_HOLDERS = """
WITH k AS (SELECT hashtextextended('txstore stream ' || %s, 0) AS key)
SELECT l.pid FROM pg_locks l, k
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = (k.key >> 32) & 4294967295 AND l.objid::bigint = k.key & 4294967295
"""


def stream_lock_holders(db: psycopg.Connection, job: str = JOB) -> list[int]:
    return [pid for (pid,) in db.execute(STREAM_LOCK_HOLDERS, (job,)).fetchall()]


def running_query(
    spark: Any, kafka: MockKafkaCluster, database_url: str, topic: str, checkpoint: Path, **options: str
) -> Any:
    return (
        sink(stream(spark, kafka, database_url, topic, **options), database_url, checkpoint)
        .trigger(processingTime=TRIGGER)
        .start()
    )


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.2)


def test_connecting_again_gives_up_within_its_bounds_in_one_line_without_the_password() -> None:
    """Nothing listens on the port: 8 attempts with backoff 0.5, 1, 2, 4, 8, 8, 8 s; or, on a
    clock where each attempt takes 20 s, no attempt after 60 s."""
    nowhere = f"postgresql://txstore:s3cret@127.0.0.1:{free_port()}/db"
    waits: list[float] = []
    with pytest.raises(DatabaseUnavailable) as e:
        connect_retrying(nowhere, given_by="X", sleep=waits.append)
    assert waits == [0.5, 1, 2, 4, 8, 8, 8] and len(waits) == RECONNECT_ATTEMPTS - 1
    line = str(e.value)
    assert "\n" not in line and "s3cret" not in line
    assert line.startswith("PostgreSQL at postgresql://txstore:***@127.0.0.1:")
    assert "did not answer 8 connection attempts" in line and "restart it once the server is up" in line

    now = [0.0]

    def slow_clock() -> float:
        now[0] += 10.0  # read twice an attempt: 20 s each
        return now[0]

    waits.clear()
    with pytest.raises(DatabaseUnavailable) as e:
        connect_retrying(nowhere, given_by="X", sleep=waits.append, clock=slow_clock)
    assert len(waits) < RECONNECT_ATTEMPTS - 1 and now[0] <= RECONNECT_SECONDS + 40
    assert f"did not answer {len(waits) + 1} connection attempts" in str(e.value)


def end_planning_session(db: psycopg.Connection) -> int:
    (pid,) = stream_lock_holders(db)
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_until(lambda: not stream_lock_holders(db), 30, "the planning session ended")
    return pid


def test_each_planning_method_survives_its_session_ended_before_it(broker_db: BrokerDb) -> None:
    """initialOffset, latestOffset, partitions, prepareForTriggerAvailableNow and commit, each
    called after the planning session was ended: each answers, on a new session that holds the
    stream lock again."""
    topic = broker_db.new_topic(2)
    broker_db.produce(topic, {0: 4, 1: 2})
    reader = counting_planner(broker_db.kafka, broker_db.database_url, topic, JOB)
    try:
        start = reader.initialOffset()
        ended = [end_planning_session(broker_db.db)]
        assert reader.initialOffset() == start == {topic: {"0": 0, "1": 0}}
        ended.append(end_planning_session(broker_db.db))
        end = reader.latestOffset(start, None)
        assert end == {topic: {"0": 4, "1": 2}}
        ended.append(end_planning_session(broker_db.db))
        parts = reader.partitions(start, end)
        assert [(r.partition, r.from_offset, r.until_offset) for p in parts for r in p.ranges] == [
            (0, 0, 4),
            (1, 0, 2),
        ]
        ended.append(end_planning_session(broker_db.db))
        reader.prepareForTriggerAvailableNow()
        reader.commit(end)
        assert reader.latestOffset(start, None) == end
        holders = stream_lock_holders(broker_db.db)
        assert len(holders) == 1 and holders[0] not in ended
    finally:
        reader.stop()
    wait_until(lambda: not stream_lock_holders(broker_db.db), 30, "the lock released by stop()")


def test_a_planning_statement_cut_short_by_the_end_of_its_session_runs_again_on_a_new_one(
    broker_db: BrokerDb,
) -> None:
    """partitions() waits on the micro-batch plan's row (locked here); its session is ended while
    it waits: the call is run once more on a new session and stores the plan."""
    topic = broker_db.new_topic(1)
    broker_db.produce(topic, {0: 3})
    reader = counting_planner(broker_db.kafka, broker_db.database_url, topic, JOB)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        reader.partitions(start, end)  # the plan's row exists
        broker_db.produce(topic, {0: 2})
        with psycopg.connect(broker_db.database_url) as blocker:
            blocker.execute("SELECT 1 FROM txn_stream_plans WHERE job = %s FOR UPDATE", (JOB,))
            done: list[object] = []

            def plan() -> None:
                try:  # the same start (nothing was committed), a later end
                    done.append(reader.partitions(start, {topic: {"0": 5}}))
                except Exception as e:
                    done.append(e)

            thread = threading.Thread(target=plan)
            thread.start()
            waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            wait_until(
                lambda: bool(broker_db.db.execute(waiting).fetchall()),
                30,
                "partitions() waiting on the plan's row",
            )
            (pid,) = [p for (p,) in broker_db.db.execute(waiting).fetchall()]
            broker_db.db.execute("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(0.5)
            blocker.rollback()  # the new session's statement then takes the row
            thread.join(60)
            assert not thread.is_alive() and done, "partitions() did not return"
            assert not isinstance(done[0], Exception), done[0]
        with psycopg.connect(broker_db.database_url) as conn:
            assert [(r.from_offset, r.until_offset) for r in load_plan(conn, JOB).ranges] == [(0, 5)]
        assert stream_lock_holders(broker_db.db) and pid not in stream_lock_holders(broker_db.db)
    finally:
        reader.stop()


def test_ending_the_querys_postgresql_sessions_between_micro_batches_costs_a_pause_not_the_query(
    streaming: Counting, tmp_path: Path
) -> None:
    """pg_terminate_backend of the source's planning session (the stream lock's holder) and of
    every other session of the query (the sink's kept connection), twice: the query goes on,
    holds its stream lock again, and counts each message once."""
    topic = streaming.new_topic(2)
    streaming.produce(topic, {0: 7, 1: 3})
    query = running_query(streaming.spark, streaming.kafka, streaming.database_url, topic, tmp_path / "chk")
    try:
        query.processAllAvailable()
        assert streaming.totals(topic, job=JOB) == {topic: 10}
        for round_, more in enumerate(({0: 4, 1: 2}, {1: 5})):
            (planner,) = stream_lock_holders(streaming.db)
            ended = streaming.db.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            assert ended is not None and ended[0] >= 2, ended  # the planner's and the sink's, at least
            streaming.produce(topic, more)
            query.processAllAvailable()
            assert query.isActive, round_
            holders = stream_lock_holders(streaming.db)
            assert len(holders) == 1 and holders != [planner]  # a new session holds the lock again
        assert streaming.totals(topic, job=JOB) == {topic: 21}
    finally:
        query.stop()
    assert streaming.offsets(topic, job=JOB) == streaming.log_ends(topic)


def test_a_postgresql_restart_under_a_running_query_costs_a_pause_not_the_query(
    spark: Any,
    kafka: MockKafkaCluster,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """A private server restarted (fast shutdown: every session ends; 2 s with no server) while
    the query runs between micro-batches: the source waits for it, connects again, re-takes its
    locks; the sink's kept connection is replaced; every message is counted once."""
    txstore.register(spark)
    topic = new_topic(2)
    with restartable_postgres() as (server, restart):
        with psycopg.connect(url(server.port, "postgres", password=""), autocommit=True) as admin:
            admin.execute("CREATE DATABASE txstore_restarts")
        database_url = url(server.port, "txstore_restarts", password="")
        upgrade(database_url)
        produce(kafka.bootstrap_servers, topic, {0: 5, 1: 6})
        query = running_query(spark, kafka, database_url, topic, tmp_path / "chk")
        try:
            query.processAllAvailable()
            restart(2.0)
            produce(kafka.bootstrap_servers, topic, {0: 3, 1: 1})
            query.processAllAvailable()
            assert query.isActive
            restart(0.0)
            produce(kafka.bootstrap_servers, topic, {1: 4})
            query.processAllAvailable()
            assert query.isActive
        finally:
            query.stop()
        with psycopg.connect(database_url, autocommit=True) as db:
            assert_counted_exactly(db, kafka, topic, 19, job=JOB)


def test_a_query_whose_stream_lock_another_query_took_while_its_session_was_gone_stops_in_one_line(
    streaming: Counting, tmp_path: Path
) -> None:
    """The first query's planning session is ended; before it takes its stream lock again (held
    back 20 s by a fail point), a second query of the job starts and takes it. The first stops
    in one line saying so; the second counts the rest; nothing is counted twice."""
    topic = streaming.new_topic(2)
    streaming.produce(topic, {0: 6, 1: 4})
    first = running_query(
        streaming.spark,
        streaming.kafka,
        streaming.database_url,
        topic,
        tmp_path / "first",
        **{"txstore.failpoints": "before-stream-relock:sleep=20"},
    )
    second = None
    try:
        first.processAllAvailable()
        assert streaming.totals(topic, job=JOB) == {topic: 10}
        (planner,) = stream_lock_holders(streaming.db)
        streaming.db.execute("SELECT pg_terminate_backend(%s)", (planner,))
        wait_until(
            lambda: not stream_lock_holders(streaming.db), 30, "the first query's planning session ended"
        )
        second = running_query(
            streaming.spark, streaming.kafka, streaming.database_url, topic, tmp_path / "second"
        )
        streaming.produce(topic, {0: 2, 1: 3})
        second.processAllAvailable()
        with pytest.raises(Exception) as stopped:  # Spark's StreamingQueryException
            first.awaitTermination(90)
        line = next(
            (x for x in str(stopped.value).splitlines() if "lost its PostgreSQL session" in x),
            str(stopped.value),
        )
        assert (
            f"job '{JOB}': this query lost its PostgreSQL session (pid {planner}) and, connected again, "
            "found another streaming query of this job holding the stream lock (PostgreSQL session "
        ) in line, line
        assert "restart this one with a new checkpointLocation" in line, line
        assert second.isActive
        streaming.produce(topic, {1: 1})
        second.processAllAvailable()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    streaming.assert_counted_exactly(topic, 16, job=JOB)
