"""TransactionalSink against a real PostgreSQL: every outcome of the conditional update."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from decimal import Decimal

import psycopg
import pytest

from txstore.core.errors import AlreadyCommitted, OffsetGap, OffsetOverlap
from txstore.core.failpoints import FailPoints, InjectedFailure
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL, by_key, by_key_and_window
from txstore.core.starting import StartDecision
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.sink import TransactionalSink


def snapshot(db: psycopg.Connection) -> tuple[list[tuple], list[tuple]]:
    offsets = db.execute(
        "SELECT job, topic, part, off, updated_at FROM txn_offsets ORDER BY 1, 2, 3"
    ).fetchall()
    data = db.execute(
        "SELECT job, topic, key, window_start, metric, updated_at, grain FROM txn_data "
        "ORDER BY 1, 2, 3 NULLS FIRST, 4, 7"
    ).fetchall()
    return offsets, data


def seed(db: psycopg.Connection, job: str, topic: str, offsets: dict[int, int]) -> None:
    with connect(db.info.dsn) as conn:
        store.create_start_rows(conn, job, [StartDecision(topic, p, o, "test") for p, o in offsets.items()])


def test_commit_adds_deltas_and_moves_the_offset_in_one_transaction(
    database_url: str, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j")
        sink.commit(OffsetRange("t", 0, 0, 10), {TOPIC_TOTAL: 10, by_key("k1"): 4})
        sink.commit(OffsetRange("t", 0, 10, 15), {TOPIC_TOTAL: 5, by_key("k1"): 1})
    offsets, data = snapshot(db)
    assert [o[:4] for o in offsets] == [("j", "t", 0, 15)]
    assert [d[:5] for d in data] == [("j", "t", None, None, 15), ("j", "t", "k1", None, 5)]


@pytest.mark.parametrize(
    ("offset_range", "error", "text"),
    [
        (OffsetRange("t", 0, 0, 10), AlreadyCommitted, "already committed (stored offset 10); skipped"),
        (OffsetRange("t", 0, 12, 20), OffsetGap, "gap, stored offset 10 is below 12"),
        (
            OffsetRange("t", 0, 5, 20),
            OffsetOverlap,
            "overlap, stored offset 10 does not match the range start",
        ),
        (OffsetRange("t", 1, 0, 5), OffsetOverlap, "overlap, no offset row does not match"),
    ],
)
def test_a_refused_commit_leaves_results_and_offsets_exactly_as_they_were(
    database_url: str, db: psycopg.Connection, offset_range: OffsetRange, error: type, text: str
) -> None:
    seed(db, "j", "t", {0: 0})
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j")
        sink.commit(OffsetRange("t", 0, 0, 10), {TOPIC_TOTAL: 10, by_key_and_window("a", when): 3})
        before = snapshot(db)
        with pytest.raises(error) as raised:
            sink.commit(offset_range, {TOPIC_TOTAL: 99, by_key_and_window("a", when): 99, by_key("new"): 1})
        assert text in str(raised.value)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert snapshot(db) == before


@pytest.mark.parametrize("point", ["before-upsert", "between-upsert-and-offsets", "before-commit"])
def test_a_failure_inside_the_transaction_writes_nothing(
    database_url: str, db: psycopg.Connection, point: str
) -> None:
    seed(db, "j", "t", {0: 0})
    before = snapshot(db)
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j", FailPoints.parse(point))
        with pytest.raises(InjectedFailure):
            sink.commit(OffsetRange("t", 0, 0, 10), {TOPIC_TOTAL: 10})
        # The retry of the same range then commits exactly once.
        TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 10), {TOPIC_TOTAL: 10})
    assert before[1] == []
    assert [d[:5] for d in snapshot(db)[1]] == [("j", "t", None, None, 10)]


def test_a_lost_acknowledgement_then_a_retry_counts_once(database_url: str, db: psycopg.Connection) -> None:
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        with pytest.raises(InjectedFailure):
            TransactionalSink(conn, "j", FailPoints.parse("after-commit")).commit(
                OffsetRange("t", 0, 0, 7), {TOPIC_TOTAL: 7}
            )
        with pytest.raises(AlreadyCommitted):
            TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 7), {TOPIC_TOTAL: 7})
    assert [d[:5] for d in snapshot(db)[1]] == [("j", "t", None, None, 7)]


def test_concurrent_partition_commits_on_shared_rows_neither_deadlock_nor_lose_updates(
    database_url: str, db: psycopg.Connection
) -> None:
    partitions, rounds = 6, 15
    seed(db, "j", "t", {p: 0 for p in range(partitions)})
    keys = [f"k{i}" for i in range(8)]
    errors: list[BaseException] = []

    def worker(partition: int) -> None:
        try:
            with connect(database_url) as conn:
                sink = TransactionalSink(conn, "j")
                for r in range(rounds):
                    # Every partition touches every key, listed in a different order each time.
                    rotated = keys[partition:] + keys[:partition]
                    deltas = {TOPIC_TOTAL: 1, **{by_key(k): 1 for k in reversed(rotated)}}
                    sink.commit(OffsetRange("t", partition, r, r + 1), deltas)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(partitions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    data = {(d[2]): d[4] for d in snapshot(db)[1]}
    assert data == {None: partitions * rounds, **{k: partitions * rounds for k in keys}}


def test_two_tasks_racing_on_the_same_range_commit_it_once(database_url: str, db: psycopg.Connection) -> None:
    seed(db, "j", "t", {0: 0})
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def attempt() -> None:
        with connect(database_url) as conn:
            barrier.wait(timeout=10)
            try:
                TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 50), {TOPIC_TOTAL: 50})
                outcomes.append("committed")
            except AlreadyCommitted:
                outcomes.append("already")

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["already", "already", "already", "committed"]
    assert [d[:5] for d in snapshot(db)[1]] == [("j", "t", None, None, 50)]


def test_start_rows_are_created_once_when_two_instances_start_together(
    database_url: str, db: psycopg.Connection
) -> None:
    with connect(database_url) as a, connect(database_url) as b:
        won = store.create_start_rows(
            a, "j", [StartDecision("t", 0, 5, "latest"), StartDecision("t", 1, 0, "e")]
        )
        lost = store.create_start_rows(
            b, "j", [StartDecision("t", 0, 9, "latest"), StartDecision("t", 1, 0, "e")]
        )
        assert won == {("t", 0), ("t", 1)}
        assert lost == set()
        assert store.committed_offsets(b, "j", ["t"]) == {("t", 0): 5, ("t", 1): 0}


def test_a_worker_reuses_its_connection_and_replaces_one_the_server_closed(
    database_url: str, db: psycopg.Connection
) -> None:
    from txstore.postgres.db import forget_worker_connection, worker_connection

    first = worker_connection(database_url)
    try:
        assert worker_connection(database_url) is first
        db.execute("SELECT pg_terminate_backend(%s)", (first.info.backend_pid,))
        replaced = worker_connection(database_url)
        assert replaced is not first
        assert replaced.execute("SELECT 1").fetchone() == (1,)
    finally:
        forget_worker_connection(database_url)


def test_a_batch_commit_moves_every_offset_and_adds_every_result_or_nothing(
    database_url: str, db: psycopg.Connection
) -> None:
    seed(db, "j", "a", {0: 0, 1: 0})
    seed(db, "j", "b", {0: 5})
    batch = [OffsetRange("a", 0, 0, 10), OffsetRange("a", 1, 0, 4), OffsetRange("b", 0, 5, 8)]
    deltas = {("a", TOPIC_TOTAL): 14, ("a", by_key("k")): 14, ("b", TOPIC_TOTAL): 3}
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j")
        sink.commit_batch(batch, deltas)
        committed = snapshot(db)
        # The same batch again (a retry after a lost acknowledgement): recognised, nothing added.
        with pytest.raises(AlreadyCommitted):
            sink.commit_batch(batch, deltas)
        assert snapshot(db) == committed
        # The next batch with one range starting past the stored offset: a gap, nothing moves.
        with pytest.raises(OffsetGap, match="'a' partition 1 range 6 -> 9: gap, stored offset 4"):
            sink.commit_batch(
                [OffsetRange("a", 0, 10, 12), OffsetRange("a", 1, 6, 9)], {("a", TOPIC_TOTAL): 5}
            )
        assert snapshot(db) == committed
        # Another writer committed one of the ranges meanwhile: committing the rest would double count.
        sink.commit(OffsetRange("b", 0, 8, 9), {TOPIC_TOTAL: 1})
        after_other = snapshot(db)
        with pytest.raises(OffsetOverlap, match="'b' partition 0 range 8 -> 9: overlap"):
            sink.commit_batch(
                [OffsetRange("a", 0, 10, 12), OffsetRange("b", 0, 8, 9)], {("a", TOPIC_TOTAL): 3}
            )
        assert snapshot(db) == after_other
    offsets = {(o[1], o[2]): o[3] for o in snapshot(db)[0]}
    assert offsets == {("a", 0): 10, ("a", 1): 4, ("b", 0): 9}
    data = {(d[1], d[6], d[2]): d[4] for d in snapshot(db)[1]}
    assert data == {("a", "topic", None): 14, ("a", "key", "k"): 14, ("b", "topic", None): 4}


def test_fractional_metrics_add_up_exactly(database_url: str, db: psycopg.Connection) -> None:
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j")
        for i in range(10):
            sink.commit(OffsetRange("t", 0, i, i + 1), {TOPIC_TOTAL: 0.1})
    assert db.execute("SELECT metric FROM txn_data").fetchone() == (Decimal("1.0"),)


def test_an_autocommit_connection_is_refused_before_anything_is_written(
    database_url: str, db: psycopg.Connection
) -> None:
    # In autocommit mode the upsert would commit on its own, and the rollback after a
    # refused offset move would leave results without their offsets.
    seed(db, "j", "t", {0: 10})
    before = snapshot(db)
    with connect(database_url, autocommit=True) as conn:
        with pytest.raises(ValueError, match="autocommit"):
            TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 5), {TOPIC_TOTAL: 5})
        with pytest.raises(ValueError, match="autocommit"):
            TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 10, 15), {TOPIC_TOTAL: 5})
    assert snapshot(db) == before
