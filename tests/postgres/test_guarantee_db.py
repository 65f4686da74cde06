"""The SQL side of exactly-once, against PostgreSQL but without Spark or a broker: planning a
batch (fake watermarks and topic IDs), the sink's statements, the offset store, the idempotent
sink and the outbox publisher (a fake of confluent-kafka's Producer). About a second each."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from tests.helpers.fake_kafka import FakeLog, FakeProducer, install_with_admin, message
from tests.helpers.fast_db import module_database
from tests.postgres.test_sink import seed
from txstore import planning as planning_module
from txstore.core.errors import (
    AlreadyCommitted,
    BadMessage,
    DatabaseUnavailable,
    DataLoss,
    OffsetGap,
    OffsetOverlap,
    PermissionDenied,
    PublishFailed,
    TopicRecreated,
    UnknownTopic,
)
from txstore.core.failpoints import FailPoints, InjectedFailure
from txstore.core.fingerprint import Fingerprint, fingerprint
from txstore.core.ranges import IDLE_TOPIC_ID_SECONDS, OffsetRange, PartitionWatermarks
from txstore.core.results import TOPIC_TOTAL, by_key, by_key_and_window, by_window
from txstore.core.starting import LATEST, StartDecision, StartingOffsets
from txstore.kafka.bad_messages import BadOffset
from txstore.kafka.client import Watermarks
from txstore.kafka.producers import producer_config, set_aside_reason
from txstore.planning import Planner
from txstore.postgres import outbox as outbox_module
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.idempotent import IdempotentSink
from txstore.postgres.outbox import (
    OutboxPublisher,
    outbox_counts,
    pending_count,
    retry_set_aside,
)
from txstore.postgres.sink import (
    TransactionalSink,
    commit_if_offsets_move,
    move_offsets_params,
    outbox_params,
)
from txstore.settings import JobSettings

CONF = {"bootstrap.servers": "fake:9092"}


shared_database_url, database_url = module_database("core")


WHEN = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    with connect(database_url) as c:
        yield c


def rows(db: psycopg.Connection, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return db.execute(sql, params).fetchall()


def offsets(db: psycopg.Connection, job: str = "j") -> dict[tuple[str, int], int]:
    return {(t, p): o for t, p, o in rows(db, "SELECT topic, part, off FROM txn_offsets WHERE job = %s", job)}


def data(db: psycopg.Connection, job: str = "j") -> dict[tuple[Any, ...], Decimal]:
    found = rows(db, "SELECT topic, grain, key, window_start, metric FROM txn_data WHERE job = %s", job)
    return {(t, g, k, w): m for t, g, k, w, m in found}


# Planning a batch.


def planner(
    database_url: str,
    marks: Sequence[PartitionWatermarks],
    topic_ids: dict[str, str] | None = None,
    **settings: Any,
) -> Planner:
    s = JobSettings("j", tuple(sorted({m.topic for m in marks})), "fake:9092", database_url, **settings)
    source = (lambda conf, topics: dict(topic_ids)) if topic_ids is not None else None
    return Planner(s, lambda conf, topics: [m for m in marks if m.topic in topics], source)  # type: ignore[arg-type]


def test_a_first_plan_starts_every_partition_and_plans_its_backlog(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    marks = [
        PartitionWatermarks("t", 0, 2, 9),
        PartitionWatermarks("t", 1, 0, 0),
        PartitionWatermarks("u", 0, 0, 4),
    ]
    p = planner(database_url, marks)
    assert p.plan(lambda: conn) == [OffsetRange("t", 0, 2, 9), OffsetRange("u", 0, 0, 4)]
    assert offsets(db) == {("t", 0): 2, ("t", 1): 0, ("u", 0): 0}
    assert p.backlog == {("t", 0): 7, ("t", 1): 0, ("u", 0): 4}
    latest = planner(
        database_url, [PartitionWatermarks("v", 0, 3, 8)], starting_offsets=StartingOffsets(LATEST)
    )
    assert latest.plan(lambda: conn) == []
    assert offsets(db)[("v", 0)] == 8


def test_a_plan_is_capped_but_its_backlog_is_the_whole_of_it(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 10, 1: 0})
    marks = [PartitionWatermarks("t", 0, 0, 40), PartitionWatermarks("t", 1, 0, 10)]
    p = planner(database_url, marks, max_offsets_per_batch=8)
    assert p.plan(lambda: conn) == [OffsetRange("t", 0, 10, 16), OffsetRange("t", 1, 0, 2)]
    assert p.backlog == {("t", 0): 30, ("t", 1): 10}


def test_a_plan_carries_each_partitions_generation_and_last_counted_message(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    last = Fingerprint(4, 1_004, "d")
    TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 5), {TOPIC_TOTAL: 5}, last=last)
    db.execute("UPDATE txn_offsets SET generation = 2")
    (planned,) = planner(database_url, [PartitionWatermarks("t", 0, 0, 9)]).plan(lambda: conn)
    assert (planned, planned.verify, planned.generation, planned.log_end) == (
        OffsetRange("t", 0, 5, 9),
        last,
        2,
        9,
    )


def test_aged_out_offsets_stop_the_plan_or_are_skipped_and_recorded_beside_a_new_partition(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    seed(db, "j", "t", {0: 3})
    marks = [PartitionWatermarks("t", 0, 10, 20), PartitionWatermarks("t", 1, 4, 6)]
    with pytest.raises(DataLoss, match="stored offset 3 is below the log-start offset 10"):
        planner(database_url, marks).plan(lambda: conn)
    assert rows(db, "SELECT count(*) FROM txn_lost_ranges") == [(0,)]
    with caplog.at_level(logging.WARNING, logger="txstore"):
        ranges = planner(database_url, marks, fail_on_data_loss=False).plan(lambda: conn)
    assert ranges == [OffsetRange("t", 0, 10, 20), OffsetRange("t", 1, 4, 6)]
    assert rows(db, "SELECT part, from_off, until_off FROM txn_lost_ranges") == [(0, 3, 10)]
    assert "t/0: offsets 3 -> 10 (7 messages) aged out of Kafka before they were counted" in caplog.text
    assert planner(database_url, marks, fail_on_data_loss=False).plan(lambda: conn) == ranges
    assert rows(db, "SELECT count(*) FROM txn_lost_ranges") == [(1,)]


def test_a_missing_topic_named_as_a_typo_or_if_counted_as_perhaps_being_recreated_and_stop_the_plan(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """Kafka has no topic ``t``: a typo for a job that stored nothing for it ("check --topic", as
    the client says), but a topic deleted, perhaps mid-recreation, for a job with offsets stored
    for it; its line says so and what to run, naming the job."""
    typo = UnknownTopic("topic 't' does not exist on Kafka at fake:9092; check --topic", "t", "fake:9092")

    def missing(conf: Any, topics: Sequence[str]) -> list[PartitionWatermarks]:
        if "t" in topics:  # as Kafka: asked no topic, it names none missing
            raise typo
        return [PartitionWatermarks(topic, 0, 0, 0) for topic in topics]

    with pytest.raises(UnknownTopic) as raised:
        Planner(JobSettings("j", ("t",), "fake:9092", database_url), missing).plan(lambda: conn)
    assert raised.value is typo
    seed(db, "j", "t", {0: 4, 1: 0})
    seed(db, "j", "u", {0: 0})
    seed(db, "k", "t", {2: 0})
    with pytest.raises(UnknownTopic) as raised:
        Planner(JobSettings("j", ("t", "u"), "fake:9092", database_url), missing).plan(lambda: conn)
    assert str(raised.value) == (
        "job 'j' topic 't' does not exist on Kafka at fake:9092 now, though the job stored offsets "
        "for 2 of its partitions: it may be being deleted and recreated. Run the job again once the "
        "topic exists (a recreated topic then stops it in one line naming the reset to run); if it "
        "was deleted for good, forget its offsets: txstore reset --job j --topic t --forget --execute"
    )
    assert (raised.value.topic, raised.value.servers, raised.value.transient) == ("t", "fake:9092", False)
    assert offsets(db) == {("t", 0): 4, ("t", 1): 0, ("u", 0): 0}


def test_topic_ids_are_stored_where_missing_and_a_changed_one_stops_the_plan(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    marks = [PartitionWatermarks("t", 0, 0, 3), PartitionWatermarks("u", 0, 0, 2)]
    assert planner(database_url, marks, {"t": "T1"}).plan(lambda: conn) == [
        OffsetRange("t", 0, 0, 3),
        OffsetRange("u", 0, 0, 2),
    ]
    assert rows(db, "SELECT topic, topic_id FROM txn_offsets ORDER BY 1") == [("t", "T1"), ("u", None)]
    assert planner(database_url, marks).plan(lambda: conn) != []  # no topic IDs asked: none compared
    assert planner(database_url, marks, {}).plan(lambda: conn) != []
    assert rows(db, "SELECT topic, topic_id FROM txn_offsets ORDER BY 1") == [("t", "T1"), ("u", None)]


def test_a_topic_recreated_with_the_same_offsets_stops_even_an_idle_plan(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """Refilled to exactly the stored offsets, the new log has nothing to read and only its
    topic ID tells. A new planner asks it at once; a running one asks an idle topic's ID every
    IDLE_TOPIC_ID_SECONDS (not every plan), and every time a range of the topic is planned."""
    marks = [PartitionWatermarks("t", 0, 0, 3)]
    assert planner(database_url, marks, {"t": "T1"}).plan(lambda: conn)
    db.execute("UPDATE txn_offsets SET off = 3")
    assert planner(database_url, marks, {"t": "T1"}).plan(lambda: conn) == []  # idle
    with pytest.raises(TopicRecreated, match="the topic was deleted and recreated"):
        planner(database_url, marks, {"t": "T2"}).plan(lambda: conn)

    ids = {"t": "T1"}
    settings = JobSettings("j", ("t",), "fake:9092", database_url)
    running = Planner(settings, lambda conf, topics: list(marks), lambda conf, topics: dict(ids))
    assert running.plan(lambda: conn) == []  # asked: its first plan
    ids["t"] = "T2"
    started = time.monotonic()
    assert running.plan(lambda: conn) == []  # idle: its ID was asked just now, not asked again
    with pytest.raises(TopicRecreated, match="the topic was deleted and recreated"):
        while time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 10:
            assert running.plan(lambda: conn) == []  # idle, its ID not asked again yet
            time.sleep(0.1)
    assert time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 2
    ids["t"] = "T1"
    assert running.plan(lambda: conn) == []
    marks[0] = PartitionWatermarks("t", 0, 0, 4)
    ids["t"] = "T2"  # a range planned: asked at once
    with pytest.raises(TopicRecreated, match="the topic was deleted and recreated"):
        running.plan(lambda: conn)
    assert rows(db, "SELECT off, topic_id FROM txn_offsets") == [(3, "T1")]


def test_with_fail_on_data_loss_false_a_recreated_topic_stops_the_plan_before_any_loss_is_recorded(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """A recreated topic whose new log is already trimmed past the stored offset is not an
    aged-out range of the old one: nothing recorded as lost, the offset left, the topic ID stop."""
    assert planner(database_url, [PartitionWatermarks("t", 0, 0, 3)], {"t": "T1"}).plan(lambda: conn)
    db.execute("UPDATE txn_offsets SET off = 3")
    # Not "aged out, rerun with --fail-on-data-loss false": that advice would record a loss.
    with pytest.raises(TopicRecreated, match="the topic was deleted and recreated"):
        planner(database_url, [PartitionWatermarks("t", 0, 12, 20)], {"t": "T2"}).plan(lambda: conn)
    recreated = planner(
        database_url, [PartitionWatermarks("t", 0, 12, 20)], {"t": "T2"}, fail_on_data_loss=False
    )
    with pytest.raises(TopicRecreated, match="the topic was deleted and recreated"):
        recreated.plan(lambda: conn)
    assert rows(db, "SELECT count(*) FROM txn_lost_ranges") == [(0,)]
    assert offsets(db) == {("t", 0): 3}


def test_a_starting_timestamp_is_looked_up_only_for_the_topics_first_partitions(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[tuple[str, int]]] = []

    def lookup(conf: Any, wanted: dict[tuple[str, int], int], admin: Any) -> dict[tuple[str, int], int]:
        assert admin is None  # a planner without the job's own client asks through a new one
        assert set(wanted.values()) == {1}  # the one time asked for
        asked.append(sorted(wanted))
        return {k: 5 for k in wanted}

    monkeypatch.setattr(planning_module, "offsets_for_times", lookup)
    seed(db, "j", "t", {0: 0})
    marks = [
        PartitionWatermarks("t", 0, 0, 9),
        PartitionWatermarks("t", 1, 1, 9),
        PartitionWatermarks("u", 0, 0, 9),
    ]
    p = planner(database_url, marks, starting_offsets=StartingOffsets(timestamp_ms=1))
    p.plan(lambda: conn)
    assert asked == [[("u", 0)]]
    assert offsets(db) == {("t", 0): 0, ("t", 1): 1, ("u", 0): 5}
    p.plan(lambda: conn)
    assert len(asked) == 1


def test_a_plan_asks_kafka_once_unless_it_started_or_skipped_partitions(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    asked: list[int] = []
    marks = [PartitionWatermarks("t", 0, 5, 9)]
    settings = JobSettings("j", ("t",), "fake:9092", database_url, fail_on_data_loss=False)
    p = Planner(settings, lambda conf, topics: asked.append(1) or marks)  # type: ignore[func-returns-value]
    assert p.plan(lambda: conn) == [OffsetRange("t", 0, 5, 9)] and len(asked) == 2  # started: read again
    assert p.plan(lambda: conn) == [OffsetRange("t", 0, 5, 9)] and len(asked) == 3
    db.execute("UPDATE txn_offsets SET off = 2")
    assert p.plan(lambda: conn) == [OffsetRange("t", 0, 5, 9)] and len(asked) == 5  # skipped: read again


def test_a_partition_another_instance_started_first_keeps_its_start_and_says_so(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    marks = [PartitionWatermarks("t", 0, 0, 9), PartitionWatermarks("t", 1, 0, 9)]
    p = planner(database_url, marks, starting_offsets=StartingOffsets(LATEST))
    seed(db, "j", "t", {1: 4})  # after this planner read the offsets, before it created rows
    with caplog.at_level(logging.INFO, logger="txstore"):
        assert p._start_new_partitions(conn, {}, marks) is True
    assert offsets(db) == {("t", 0): 9, ("t", 1): 4}
    assert "job j: t/0 starts at latest offset 9 (--starting-offsets)" in caplog.text
    assert "job j: t/1 was started by another instance" in caplog.text
    assert p._start_new_partitions(conn, offsets(db), marks) is False


def test_planning_failures_in_postgresql_are_one_line(database_url: str) -> None:
    p = planner(database_url, [PartitionWatermarks("t", 0, 0, 1)])

    def denied() -> psycopg.Connection:
        raise psycopg.errors.InsufficientPrivilege("permission denied for table txn_offsets")

    def down() -> psycopg.Connection:
        raise psycopg.OperationalError("connection refused\nDETAIL: more")

    with pytest.raises(
        PermissionDenied, match="planning job 'j': PostgreSQL said permission denied for table"
    ):
        p.plan(denied)
    with pytest.raises(
        DatabaseUnavailable, match=r"planning job 'j' failed in PostgreSQL: connection refused$"
    ):
        p.plan(down)


# The transactional sink's statements.


def test_every_grain_is_upserted_and_added_to_exactly(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0, 1: 0})
    sink = TransactionalSink(conn, "j")
    deltas = {TOPIC_TOTAL: 3, by_key(None): 1, by_key("a"): Decimal("0.1"), by_window(WHEN): 2.5}
    deltas[by_key_and_window("a", WHEN)] = -1
    sink.commit(OffsetRange("t", 0, 0, 3), deltas)
    sink.commit_batch(
        [OffsetRange("t", 0, 3, 5), OffsetRange("t", 1, 0, 2)],
        {("t", TOPIC_TOTAL): 4, ("t", by_key("a")): 0.2, ("u", by_key(None)): 7},
    )
    assert data(db) == {
        ("t", "topic", None, None): 7,
        ("t", "key", None, None): 1,
        ("t", "key", "a", None): Decimal("0.3"),
        ("t", "window", None, WHEN): Decimal("2.5"),
        ("t", "key+window", "a", WHEN): -1,
        ("u", "key", None, None): 7,
    }
    assert offsets(db) == {("t", 0): 5, ("t", 1): 2}


def test_a_commit_without_results_still_moves_its_offset(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 4), {})
    assert (offsets(db), data(db)) == ({("t", 0): 4}, {})
    TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 4, 4), {})
    assert offsets(db) == {("t", 0): 4}


def test_a_commit_moves_only_its_own_jobs_topics_and_partitions_offsets(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    for job in ("j", "k"):
        seed(db, job, "t", {0: 0, 1: 0})
        seed(db, job, "u", {0: 0})
    TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 5), {TOPIC_TOTAL: 5})
    TransactionalSink(conn, "j").commit_batch([OffsetRange("t", 1, 0, 2), OffsetRange("u", 0, 0, 3)], {})
    assert offsets(db, "j") == {("t", 0): 5, ("t", 1): 2, ("u", 0): 3}
    assert offsets(db, "k") == {("t", 0): 0, ("t", 1): 0, ("u", 0): 0}


@pytest.mark.parametrize("stored", [4, 6])
def test_a_range_is_committed_only_from_exactly_its_start(
    conn: psycopg.Connection, db: psycopg.Connection, stored: int
) -> None:
    seed(db, "j", "t", {0: stored})
    with pytest.raises(OffsetGap if stored < 5 else OffsetOverlap):
        TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 5, 9), {TOPIC_TOTAL: 4})
    assert (offsets(db), data(db)) == ({("t", 0): stored}, {})
    if stored < 5:
        with pytest.raises(OffsetGap):
            IdempotentSink(conn, "j").store(OffsetRange("t", 0, 5, 9), [_messages(range(5, 9))])
        assert offsets(db) == {("t", 0): stored}
    else:  # the idempotent sink stores over what it stored: from <= stored < until is fine
        IdempotentSink(conn, "j").store(OffsetRange("t", 0, 5, 9), [_messages(range(5, 9))])
        assert offsets(db) == {("t", 0): 9}


def test_a_commit_moves_exactly_its_own_row_whatever_the_names_around_it(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """Rows of other jobs, topics and partitions at the same offset and generation sort both
    before and after the committed one: none of them moves."""
    for job in ("j", "k"):
        for topic in ("t", "u"):
            seed(db, job, topic, {0: 0, 1: 0})
    TransactionalSink(conn, "k").commit(OffsetRange("u", 1, 0, 3), {})
    TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 2), {})
    moved = rows(db, "SELECT job, topic, part, off FROM txn_offsets WHERE off <> 0 ORDER BY 1, 2, 3")
    assert moved == [("j", "t", 0, 2), ("k", "u", 1, 3)]


@pytest.mark.parametrize("generation", [0, 2])
def test_a_range_of_any_other_generation_is_refused(
    conn: psycopg.Connection, db: psycopg.Connection, generation: int
) -> None:
    """Older (planned before a reset) or newer (planned before the row was forgotten and made
    again): either way another log's messages."""
    seed(db, "j", "t", {0: 0})
    db.execute("UPDATE txn_offsets SET generation = 1")
    with pytest.raises(OffsetOverlap):
        TransactionalSink(conn, "j").commit(
            OffsetRange("t", 0, 0, 3, generation=generation), {TOPIC_TOTAL: 3}
        )
    with pytest.raises(OffsetOverlap):
        IdempotentSink(conn, "j").store(
            OffsetRange("t", 0, 0, 3, generation=generation), [_messages(range(3))]
        )
    assert (offsets(db), data(db), stored(db)) == ({("t", 0): 0}, {}, [])


def test_an_empty_range_refused_for_its_generation_has_nothing_to_count(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 4})
    db.execute("UPDATE txn_offsets SET generation = 1")
    with pytest.raises(AlreadyCommitted):
        TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 4, 4), {})


def test_a_batch_refused_in_part_is_classified_from_the_offsets_as_they_were(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """One range at its start, the other committed by another writer: the update moved one row
    of two, and the rollback undoes it before the offsets are read, so the refusal names the
    committed range (an overlap), not a batch "already committed"."""
    seed(db, "j", "t", {0: 0, 1: 5})
    with pytest.raises(OffsetOverlap) as raised:
        TransactionalSink(conn, "j").commit_batch([OffsetRange("t", 0, 0, 3), OffsetRange("t", 1, 2, 5)], {})
    assert (raised.value.offset_range, raised.value.stored_offset) == (OffsetRange("t", 1, 2, 5), 5)
    with pytest.raises(OffsetGap) as gap:
        TransactionalSink(conn, "j").commit_batch([OffsetRange("t", 0, 0, 3), OffsetRange("t", 1, 7, 9)], {})
    assert gap.value.offset_range == OffsetRange("t", 1, 7, 9)
    assert offsets(db) == {("t", 0): 0, ("t", 1): 5}
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize(
    "point", ["before-upsert", "between-upsert-and-offsets", "before-commit", "after-commit"]
)
def test_a_failure_at_any_point_of_a_commit_leaves_all_or_nothing_and_no_open_transaction(
    conn: psycopg.Connection, db: psycopg.Connection, point: str
) -> None:
    seed(db, "j", "t", {0: 0})
    bad = [BadOffset("t", 0, 1, "E: x")]
    failing = FailPoints.parse(point)
    commits: list[tuple[Callable[[], Any], int]] = [
        (
            lambda: TransactionalSink(conn, "j", failing, publish_to="out").commit(
                OffsetRange("t", 0, 0, 3), {TOPIC_TOTAL: 2}, bad=bad
            ),
            1,
        ),
        (
            lambda: IdempotentSink(conn, "j", failing).store(
                OffsetRange("t", 0, 0, 3), [_messages(range(3))]
            ),
            0,
        ),
    ]
    for commit, bad_rows in commits:
        with pytest.raises(InjectedFailure):
            commit()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        committed = point == "after-commit"
        assert offsets(db) == {("t", 0): 3 if committed else 0}
        assert rows(db, "SELECT count(*) FROM txn_bad_messages") == [(bad_rows if committed else 0,)]
        db.execute("UPDATE txn_offsets SET off = 0")
        db.execute("DELETE FROM txn_bad_messages")
    assert len(rows(db, "SELECT * FROM txn_outbox")) == (1 if point == "after-commit" else 0)
    assert len(stored(db)) == (3 if point == "after-commit" else 0)


def test_a_commits_step_after_the_offsets_runs_only_once_every_offset_moved_and_commits_with_them(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """``then`` of the shared conditional commit (a results table's merge): never run for a batch
    whose offsets did not all move, and committed or rolled back with them."""
    seed(db, "j", "t", {0: 0, 1: 5})
    ran: list[int] = []

    def then(cur: psycopg.Cursor[Any]) -> None:
        ran.append(len(ran))
        cur.execute("INSERT INTO txn_data (job, topic, grain, metric) VALUES ('j', 't', 'test', 1)")

    def commit(ranges: list[OffsetRange], failpoints: FailPoints) -> None:
        params = move_offsets_params("j", ranges)
        commit_if_offsets_move(conn, "j", ranges, params, failpoints, 0, (), lambda cur: None, then)

    with pytest.raises(OffsetOverlap):
        commit([OffsetRange("t", 0, 0, 3), OffsetRange("t", 1, 2, 5)], FailPoints())
    assert (ran, offsets(db), data(db)) == ([], {("t", 0): 0, ("t", 1): 5}, {})
    with pytest.raises(InjectedFailure):
        commit([OffsetRange("t", 0, 0, 3)], FailPoints.parse("before-commit"))
    assert (ran, offsets(db), data(db)) == ([0], {("t", 0): 0, ("t", 1): 5}, {})
    commit([OffsetRange("t", 0, 0, 3), OffsetRange("t", 1, 5, 7)], FailPoints())
    assert (ran, offsets(db)) == ([0, 1], {("t", 0): 3, ("t", 1): 7})
    assert data(db) == {("t", "test", None, None): 1}


def test_only_a_connection_with_autocommit_off_is_taken(database_url: str) -> None:
    with connect(database_url, autocommit=True) as auto:
        with pytest.raises(ValueError, match="TransactionalSink needs a connection with autocommit off"):
            TransactionalSink(auto, "j")
        with pytest.raises(ValueError, match="IdempotentSink needs a connection with autocommit off"):
            IdempotentSink(auto, "j")


def test_a_batch_with_a_duplicate_partition_is_refused(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError, match="a batch commit needs one range per partition"):
        TransactionalSink(conn, "j").commit_batch([OffsetRange("t", 0, 0, 1), OffsetRange("t", 0, 1, 2)], {})
    TransactionalSink(conn, "j").commit_batch([], {})


def test_the_last_message_is_stored_beside_the_offset_and_kept_by_a_range_without_one(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0, 1: 0})
    sink = TransactionalSink(conn, "j")
    sink.commit(OffsetRange("t", 0, 0, 5), {}, last=Fingerprint(4, 1_004, "d4"))
    sink.commit_batch(
        [OffsetRange("t", 0, 5, 7), OffsetRange("t", 1, 0, 3)],
        {},
        last={("t", 1): Fingerprint(2, None, "d2")},
    )
    found = rows(db, "SELECT part, last_off, last_timestamp, last_digest FROM txn_offsets ORDER BY part")
    assert found == [(0, 4, 1_004, "d4"), (1, 2, None, "d2")]
    history = store.committed_state(conn, "j", ["t"])[1]
    assert history[("t", 0)].last == Fingerprint(4, 1_004, "d4")
    assert history[("t", 1)].last == Fingerprint(2, None, "d2")


def test_the_backlog_each_range_started_from_is_kept_for_the_last_five_commits(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    sink = TransactionalSink(conn, "j")
    for i in range(7):
        sink.commit(OffsetRange("t", 0, i, i + 1, log_end=10 + 2 * i), {})
    sink.commit(OffsetRange("t", 0, 7, 8), {})  # log end not known: no sample
    assert rows(db, "SELECT lag_samples FROM txn_offsets") == [([12, 13, 14, 15, 16],)]


def test_bad_messages_are_recorded_in_the_generation_their_range_was_read_in(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0, 1: 0})
    seed(db, "j", "s", {0: 0})
    seed(db, "j", "u", {0: 0})
    seed(db, "k", "t", {0: 0})
    seed(db, "a", "t", {0: 0, 1: 0})
    db.execute("UPDATE txn_offsets SET generation = 7 WHERE job = 'a'")
    db.execute("UPDATE txn_offsets SET generation = 3 WHERE job = 'j' AND topic = 't' AND part = 0")
    db.execute("UPDATE txn_offsets SET generation = 5 WHERE job = 'j' AND (topic <> 't' OR part <> 0)")
    bad = [BadOffset("t", 0, 4, "E: b"), BadOffset("t", 0, 2, "E: a")]
    TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 0, 5, generation=3), {TOPIC_TOTAL: 3}, bad=bad)
    assert rows(db, "SELECT job, part, generation, off, reason FROM txn_bad_messages ORDER BY off") == [
        ("j", 0, 3, 2, "E: a"),
        ("j", 0, 3, 4, "E: b"),
    ]
    with pytest.raises(AlreadyCommitted):
        TransactionalSink(conn, "j").commit(
            OffsetRange("t", 0, 0, 5, generation=3), {TOPIC_TOTAL: 3}, bad=bad
        )
    assert rows(db, "SELECT count(*) FROM txn_bad_messages") == [(2,)]
    TransactionalSink(conn, "j").commit(
        OffsetRange("t", 1, 0, 2, generation=5), {TOPIC_TOTAL: 1}, bad=[BadOffset("t", 1, 1, "E: c")]
    )
    assert rows(db, "SELECT job, part, generation, off FROM txn_bad_messages WHERE part = 1") == [
        ("j", 1, 5, 1)
    ]


def test_a_batch_retried_after_its_commit_counts_once(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0, 1: 0})
    ranges = [OffsetRange("t", 0, 0, 3), OffsetRange("t", 1, 0, 2)]
    TransactionalSink(conn, "j").commit_batch(ranges, {("t", TOPIC_TOTAL): 5})
    with pytest.raises(AlreadyCommitted):
        TransactionalSink(conn, "j").commit_batch(ranges, {("t", TOPIC_TOTAL): 5})
    assert data(db) == {("t", "topic", None, None): 5}


def test_a_commit_writes_one_outbox_row_with_its_results_delta_and_total(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    sink = TransactionalSink(conn, "j", publish_to="out")
    sink.commit(OffsetRange("t", 0, 0, 2), {TOPIC_TOTAL: 2, by_key(None): 1, by_key("a"): 1})
    sink.commit(OffsetRange("t", 0, 2, 3), {TOPIC_TOTAL: 1, by_key_and_window("a", WHEN): Decimal("0.5")})
    found = rows(db, "SELECT destination, part, parts, payload FROM txn_outbox ORDER BY id")
    assert [(d, p, n) for d, p, n, _ in found] == [("out", 1, 1), ("out", 1, 1)]
    first, second = (payload for *_, payload in found)
    assert first["ranges"] == [{"topic": "t", "partition": 0, "from": 0, "until": 2}]
    assert [(r["grain"], r["key"], r["delta"], r["total"]) for r in first["results"]] == [
        ("key", None, 1, 1),
        ("key", "a", 1, 1),
        ("topic", None, 2, 2),
    ]
    assert [(r["grain"], r["key"], r["window_start"], r["delta"], r["total"]) for r in second["results"]] == [
        ("key+window", "a", "2026-01-01T00:00:00+00:00", 0.5, 0.5),
        ("topic", None, None, 1, 3),
    ]


def test_a_batch_outbox_row_gives_each_result_the_total_of_its_own_row(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """Two topics with the same grains and keys, a null key beside an empty one, a window beside
    none: each result's delta and total are its own row's, never another's."""
    seed(db, "j", "t", {0: 0})
    seed(db, "j", "u", {0: 0})
    sink = TransactionalSink(conn, "j", publish_to="out")
    sink.commit_batch([OffsetRange("t", 0, 0, 1), OffsetRange("u", 0, 0, 1)], {("t", TOPIC_TOTAL): 100})
    deltas = {
        ("t", TOPIC_TOTAL): 1,
        ("u", TOPIC_TOTAL): 2,
        ("t", by_key(None)): 3,
        ("t", by_key("")): 4,
        ("u", by_key("")): 5,
        ("t", by_window(None)): 6,
        ("t", by_window(WHEN)): 7,
        ("t", by_key_and_window(None, WHEN)): 8,
        ("t", by_key_and_window("", None)): 9,
    }
    sink.commit_batch([OffsetRange("t", 0, 1, 2), OffsetRange("u", 0, 1, 2)], deltas)
    ((payload,),) = rows(
        db, "SELECT payload FROM txn_outbox WHERE payload->>'results' <> '[]' ORDER BY id DESC LIMIT 1"
    )
    found = {
        (r["topic"], r["grain"], r["key"], r["window_start"]): (r["delta"], r["total"])
        for r in payload["results"]
    }
    when = "2026-01-01T00:00:00+00:00"
    assert len(payload["results"]) == len(found) == 9
    assert found == {
        ("t", "topic", None, None): (1, 101),
        ("u", "topic", None, None): (2, 2),
        ("t", "key", None, None): (3, 3),
        ("t", "key", "", None): (4, 4),
        ("u", "key", "", None): (5, 5),
        ("t", "window", None, None): (6, 6),
        ("t", "window", None, when): (7, 7),
        ("t", "key+window", None, when): (8, 8),
        ("t", "key+window", "", None): (9, 9),
    }


def test_outbox_parts_are_cut_in_result_order_under_the_size_limit(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    deltas = {by_key(f"key-{i:03d}"): i for i in range(60)}
    TransactionalSink(conn, "j", publish_to="out", publish_max_bytes=3_000).commit(
        OffsetRange("t", 0, 0, 60), deltas
    )
    found = rows(db, "SELECT part, parts, payload, headers, dedup_key FROM txn_outbox ORDER BY part")
    assert len(found) > 2 and all(parts == len(found) for _, parts, *_ in found)
    assert [part for part, *_ in found] == list(range(1, len(found) + 1))
    keys = [r["key"] for _, _, payload, *_ in found for r in payload["results"]]
    assert keys == [f"key-{i:03d}" for i in range(60)]
    for _, _, payload, headers, key in found:
        assert len(json.dumps(payload)) + len(json.dumps(headers)) + len(key) < 3_000
    sizes = [len(payload["results"]) for _, _, payload, *_ in found]
    assert max(sizes) - min(sizes[:-1]) <= 2  # evenly cut, the last part holding what is left


def test_outbox_parts_are_cut_where_the_running_size_of_the_results_crosses_each_step(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """The cut, step by step: each result's size is its JSON text and a separator (2); a part
    ends where the running size crosses a multiple of the step, the budget less the biggest
    result (at least half the budget), so a part never exceeds the budget."""
    seed(db, "j", "t", {0: 0})
    deltas = {by_key(f"k{i:02d}" + "x" * (i * 7 % 23)): i for i in range(40)}
    ranges = [OffsetRange("t", 0, 0, 40)]
    TransactionalSink(conn, "j", publish_to="out", publish_max_bytes=2_400).commit(ranges[0], deltas)
    budget = outbox_params("j", "out", ranges, 2_400)["budget"]
    found = rows(
        db,
        "SELECT o.part, octet_length(r.value::text) + 2 FROM txn_outbox o, "
        "jsonb_array_elements(o.payload->'results') WITH ORDINALITY AS r(value, n) ORDER BY o.part, r.n",
    )
    sizes = [size for _, size in found]
    step = max(budget - max(sizes), budget // 2, 1)
    upto, expected = 0, []
    for size in sizes:
        upto += size
        expected.append((upto - 1) // step)
    ranks = {cut: n + 1 for n, cut in enumerate(sorted(set(expected)))}
    assert [part for part, _ in found] == [ranks[cut] for cut in expected]
    assert len(ranks) >= 3
    per_part: dict[int, int] = {}
    for part, size in found:
        per_part[part] = per_part.get(part, 0) + size
    assert max(per_part.values()) <= budget


def test_the_message_keys_and_the_topic_of_a_batch_commit(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0, 1: 0})
    TransactionalSink(conn, "j", publish_to="out").commit_batch(
        [OffsetRange("t", 1, 0, 1), OffsetRange("t", 0, 0, 2)], {}
    )
    ((key, headers, payload),) = rows(db, "SELECT dedup_key, headers, payload FROM txn_outbox")
    assert key.startswith("j/batch/") and key.endswith("/1")
    assert headers["txstore-offsets"] == "t/0/2,t/1/1"
    assert payload["ranges"] == [
        {"topic": "t", "partition": 1, "from": 0, "until": 1},
        {"topic": "t", "partition": 0, "from": 0, "until": 2},
    ]
    assert payload["results"] == [] and payload["commit"] == headers["txstore-commit"]


# The offset store.


def test_start_rows_begin_a_forgotten_partition_in_a_new_generation(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    decisions = [StartDecision("t", 0, 0, "x"), StartDecision("t", 1, 3, "x")]
    assert store.create_start_rows(conn, "j", decisions) == {("t", 0), ("t", 1)}
    assert store.create_start_rows(conn, "j", decisions) == set()
    assert store.create_start_rows(conn, "j", []) == set()
    IdempotentSink(conn, "j").store(OffsetRange("t", 0, 0, 2, generation=0), [_messages(range(2))])
    TransactionalSink(conn, "j").commit(
        OffsetRange("t", 1, 3, 5), {}, bad=[BadOffset("t", 1, 3, "E"), BadOffset("t", 1, 4, "E")]
    )
    db.execute("UPDATE txn_bad_messages SET generation = 4 WHERE off = 4")
    db.execute("DELETE FROM txn_offsets")
    assert store.create_start_rows(conn, "j", decisions) == {("t", 0), ("t", 1)}
    assert rows(db, "SELECT part, off, generation FROM txn_offsets ORDER BY part") == [(0, 0, 1), (1, 3, 5)]
    assert store.create_start_rows(conn, "k", decisions) == {("t", 0), ("t", 1)}
    assert rows(db, "SELECT generation FROM txn_offsets WHERE job = 'k'") == [(0,), (0,)]


def test_committed_state_is_the_jobs_rows_for_its_topics(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 4, 1: 0})
    seed(db, "j", "u", {0: 2})
    seed(db, "k", "t", {0: 9})
    db.execute("UPDATE txn_offsets SET last_off = 3, last_timestamp = 7, last_digest = 'd' WHERE part = 0")
    db.execute("UPDATE txn_offsets SET last_off = 3, last_digest = NULL WHERE topic = 'u'")
    committed, history = store.committed_state(conn, "j", ["t"])
    assert committed == {("t", 0): 4, ("t", 1): 0}
    assert history[("t", 0)].last == Fingerprint(3, 7, "d") and history[("t", 1)].last is None
    assert store.committed_state(conn, "j", ["u"])[1][("u", 0)].last is None
    assert store.committed_offsets(conn, "j", ["t", "u"]) == {("t", 0): 4, ("t", 1): 0, ("u", 0): 2}
    assert store.topic_totals(conn, "j", ["t"]) == {"t": 0}
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_stored_offsets_are_read_for_the_refused_ranges_only(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 4, 1: 6})
    seed(db, "k", "t", {2: 1})
    ranges = [OffsetRange("t", 1, 0, 1), OffsetRange("t", 2, 0, 1)]
    assert store.stored_offsets(conn, "j", ranges) == {("t", 1): 6, ("t", 2): None}


# The idempotent sink.


def _messages(offsets: Any, value: bytes = b"v") -> list[Message]:
    return [
        Message(topic="t", partition=0, offset=o, key=b"k%d" % o, value=value, timestamp=(1, 1_000 + o))
        for o in offsets
    ]


def stored(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    found = rows(
        db, "SELECT generation, off, key, value, timestamp FROM txn_messages ORDER BY generation, off"
    )
    return [
        (g, o, bytes(k) if k is not None else None, bytes(v) if v is not None else None, t)
        for g, o, k, v, t in found
    ]


def test_the_idempotent_sink_stores_each_message_once_and_its_last_fingerprint(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    sink = IdempotentSink(conn, "j")
    batches = [_messages([0, 1]), [], _messages([3])]
    assert sink.store(OffsetRange("t", 0, 0, 4, log_end=6), batches) == 3
    assert stored(db) == [
        (0, 0, b"k0", b"v", datetime.fromtimestamp(1.0, timezone.utc)),
        (0, 1, b"k1", b"v", datetime.fromtimestamp(1.001, timezone.utc)),
        (0, 3, b"k3", b"v", datetime.fromtimestamp(1.003, timezone.utc)),
    ]
    found = rows(db, "SELECT off, last_off, last_timestamp, last_digest, lag_samples FROM txn_offsets")
    assert found == [(4, 3, 1_003, fingerprint(batches[2][0]).digest, [6])]
    with pytest.raises(AlreadyCommitted):
        sink.store(OffsetRange("t", 0, 0, 4), batches)
    with pytest.raises(AlreadyCommitted):
        sink.store(OffsetRange("t", 0, 2, 4), batches[2:])
    assert sink.store(OffsetRange("t", 0, 4, 6), [[]]) == 0
    assert rows(db, "SELECT off, last_off FROM txn_offsets") == [(6, 3)]


def test_an_idempotent_replay_overlapping_the_stored_offset_changes_nothing_it_stored(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """After ``txstore reset`` back to 2, the range [2, 6) stores 4 and 5 and keeps 2 and 3."""
    seed(db, "j", "t", {0: 0})
    sink = IdempotentSink(conn, "j")
    sink.store(OffsetRange("t", 0, 0, 4), [_messages(range(4))])
    db.execute("UPDATE txn_offsets SET off = 2")
    sink.store(OffsetRange("t", 0, 2, 6), [_messages(range(2, 6), b"again")])
    assert [(o, v) for _, o, _, v, _ in stored(db)] == [
        (0, b"v"),
        (1, b"v"),
        (2, b"v"),
        (3, b"v"),
        (4, b"again"),
        (5, b"again"),
    ]
    assert offsets(db) == {("t", 0): 6}


def test_the_idempotent_sink_stores_what_the_transform_returns_and_skips_or_refuses_bad_messages(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})

    def transform(m: Message) -> tuple[bytes | None, bytes | None] | None:
        offset = m.offset() or 0
        if offset == 1:
            return None
        if offset in (2, 4):
            raise ValueError(f"bad {offset}")
        return None, b"x%d" % offset

    sink = IdempotentSink(conn, "j")
    with pytest.raises(BadMessage, match="offset 2"):
        sink.store(OffsetRange("t", 0, 0, 6), [_messages(range(6))], transform)
    assert (stored(db), offsets(db), sink.skipped) == ([], {("t", 0): 0}, ())
    assert (
        sink.store(
            OffsetRange("t", 0, 0, 6), [_messages(range(3)), _messages(range(3, 6))], transform, skip_bad=True
        )
        == 3
    )
    assert [(o, k, v) for _, o, k, v, _ in stored(db)] == [
        (0, None, b"x0"),
        (3, None, b"x3"),
        (5, None, b"x5"),
    ]
    assert [b.offset for b in sink.skipped] == [2, 4]
    assert rows(db, "SELECT off, reason FROM txn_bad_messages ORDER BY off") == [
        (2, "ValueError: bad 2"),
        (4, "ValueError: bad 4"),
    ]


def test_the_idempotent_sink_inserts_large_ranges_in_chunks(
    conn: psycopg.Connection, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txstore.postgres import idempotent

    monkeypatch.setattr(idempotent, "CHUNK_BYTES", 300)
    seed(db, "j", "t", {0: 0})
    assert (
        IdempotentSink(conn, "j").store(OffsetRange("t", 0, 0, 10), [_messages(range(10), b"y" * 50)]) == 10
    )
    assert [o for _, o, *_ in stored(db)] == list(range(10))


# The outbox publisher.


@pytest.fixture
def committed(conn: psycopg.Connection, db: psycopg.Connection) -> psycopg.Connection:
    """Five commits of job j, each with one outbox row, and three each of jobs a and k (before
    and after j): pending, set aside, and sent 30 days ago. j's publisher never sends, sets
    aside, retries, prunes or counts them."""
    for job in ("a", "j", "k"):
        seed(db, job, "t", {0: 0})
    for job in ("a", "k"):
        for i in range(3):
            TransactionalSink(conn, job, publish_to="out").commit(
                OffsetRange("t", 0, i, i + 1), {TOPIC_TOTAL: 1}
            )
    for i in range(5):
        TransactionalSink(conn, "j", publish_to="out").commit(OffsetRange("t", 0, i, i + 1), {TOPIC_TOTAL: 1})
    for job in ("a", "k"):
        first = rows(db, "SELECT min(id) FROM txn_outbox WHERE job = %s", job)[0][0]
        db.execute("UPDATE txn_outbox SET failed_at = now(), failed_reason = 'x' WHERE id = %s", (first + 1,))
        db.execute("UPDATE txn_outbox SET sent_at = now() - interval '30 days' WHERE id = %s", (first + 2,))
    return conn


def others_untouched(db: psycopg.Connection) -> None:
    found = rows(
        db,
        "SELECT job, sent_at IS NOT NULL, failed_at IS NOT NULL FROM txn_outbox WHERE job <> 'j' ORDER BY id",
    )
    each = [(False, False), (False, True), (True, False)]
    assert found == [(job, sent, failed) for job in ("a", "k") for sent, failed in each]


def state(db: psycopg.Connection, job: str = "j") -> list[tuple[bool, bool]]:
    found = rows(
        db,
        "SELECT sent_at IS NOT NULL, failed_at IS NOT NULL FROM txn_outbox WHERE job = %s ORDER BY id",
        job,
    )
    return [(bool(s), bool(f)) for s, f in found]


def publisher(monkeypatch: pytest.MonkeyPatch, producer: FakeProducer, **kwargs: Any) -> OutboxPublisher:
    monkeypatch.setattr(outbox_module, "shared_producer", lambda conf: producer)
    kwargs.setdefault("timeout", 1)
    return OutboxPublisher(CONF, "j", **kwargs)


def test_every_pending_row_of_the_job_is_sent_in_chunks_in_commit_order_with_its_headers(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    producer = FakeProducer()
    assert publisher(monkeypatch, producer, chunk_rows=2).publish_pending(committed) == 5
    assert state(db) == [(True, False)] * 5
    others_untouched(db)
    keys = [k for (k,) in rows(db, "SELECT dedup_key FROM txn_outbox WHERE job = 'j' ORDER BY id")]
    assert [key.decode() for _, _, key, _ in producer.produced] == keys
    topic, value, _, headers = producer.produced[0]
    assert topic == "out" and json.loads(value)["parts"] == 1
    names = dict(headers)
    assert names["txstore-job"] == "j" and names["txstore-part"] == "1" and names["txstore-parts"] == "1"
    assert names["txstore-outbox-id"] == str(rows(db, "SELECT min(id) FROM txn_outbox WHERE job = 'j'")[0][0])
    assert publisher(monkeypatch, FakeProducer()).publish_pending(committed) == 0
    assert committed.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert pending_count(committed, "j") == 0 and outbox_counts(committed, "a") == (1, 1)
    assert committed.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    others_untouched(db)


def test_a_chunk_is_bounded_by_its_payload_too(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    """Rows are locked 50 at a time until the chunk holds ``chunk_bytes`` of payload."""
    db.execute(
        "INSERT INTO txn_outbox (job, destination, dedup_key, headers, payload, part, parts) "
        "SELECT job, destination, dedup_key || '/' || g, headers, payload, part, parts "
        "FROM txn_outbox, generate_series(1, 23) g WHERE job = 'j'"
    )
    size = max(len(p) for (p,) in rows(db, "SELECT payload::text FROM txn_outbox WHERE job = 'j'"))
    p = publisher(monkeypatch, FakeProducer(), chunk_bytes=60 * size)
    assert p._publish_chunk(committed) == (100, True)
    assert p._publish_chunk(committed) == (20, False)
    assert p._publish_chunk(committed) == (0, False)
    assert committed.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # no rows stay locked
    db.execute("UPDATE txn_outbox SET sent_at = NULL")
    p = publisher(monkeypatch, FakeProducer(), chunk_rows=60)
    assert p._publish_chunk(committed) == (60, True)
    assert p._publish_chunk(committed) == (60, True)
    assert p._publish_chunk(committed) == (0, False)


def test_set_aside_rows_wait_for_retry_failed_and_then_are_sent(
    monkeypatch: pytest.MonkeyPatch,
    committed: psycopg.Connection,
    db: psycopg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = FakeProducer(outcome=lambda i: KafkaError.TOPIC_AUTHORIZATION_FAILED if i in (0, 3) else None)
    with caplog.at_level(logging.WARNING, logger="txstore"):
        assert publisher(monkeypatch, producer).publish_pending(committed) == 3
    assert state(db) == [(False, True), (True, False), (True, False), (False, True), (True, False)]
    assert outbox_counts(committed, "j") == (0, 2) and pending_count(committed, "j") == 0
    assert "set aside 2 outbox rows for Kafka topic 'out'" in caplog.text
    assert publisher(monkeypatch, FakeProducer()).publish_pending(committed) == 0
    TransactionalSink(committed, "j", publish_to="out").commit(OffsetRange("t", 0, 5, 6), {TOPIC_TOTAL: 1})
    assert outbox_counts(committed, "j") == (1, 2)
    assert retry_set_aside(committed, "j") == 2
    assert state(db) == [
        (False, False),
        (True, False),
        (True, False),
        (False, False),
        (True, False),
        (False, False),
    ]
    db.execute("UPDATE txn_outbox SET failed_at = now() WHERE job = 'j' AND sent_at IS NULL")
    others_untouched(db)
    assert publisher(monkeypatch, FakeProducer()).publish_pending(committed, retry_failed=True) == 3
    assert state(db) == [(True, False)] * 6
    assert rows(db, "SELECT count(*) FROM txn_outbox WHERE job = 'j' AND failed_reason IS NOT NULL") == [(0,)]


def test_a_passing_failure_leaves_the_rest_pending_in_order(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    producer = FakeProducer(outcome=lambda i: KafkaError._MSG_TIMED_OUT if i == 2 else None)
    with pytest.raises(
        PublishFailed, match="publishing results of job 'j' to Kafka topic 'out' at fake:9092 failed"
    ):
        publisher(monkeypatch, producer, chunk_rows=2).publish_pending(committed)
    assert state(db) == [(True, False), (True, False), (False, False), (False, False), (False, False)]
    assert len(producer.produced) == 3  # row 3 is not produced once row 2 failed


def test_a_full_local_queue_is_drained_before_producing_again(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    class Full(FakeProducer):
        def __init__(self) -> None:
            super().__init__()
            self.full = 3
            self.polls = 0

        def produce(self, *args: Any, **kwargs: Any) -> None:
            if self.full:
                raise BufferError("queue full")
            super().produce(*args, **kwargs)

        def poll(self, timeout: float = 0) -> int:
            self.polls += 1
            if timeout > 0:  # waiting drains the queue; poll(0) after each message does not
                self.full = max(self.full - 1, 0)
            return super().poll(timeout)

    producer = Full()
    assert publisher(monkeypatch, producer).publish_pending(committed) == 5
    assert producer.polls >= 3 and state(db) == [(True, False)] * 5

    class Stuck(FakeProducer):
        def produce(self, *args: Any, **kwargs: Any) -> None:
            raise BufferError("queue full")

    db.execute("UPDATE txn_outbox SET sent_at = NULL")
    with pytest.raises(PublishFailed, match="Local: Queue full"):
        publisher(monkeypatch, Stuck(), timeout=0.05).publish_pending(committed)
    assert state(db) == [(False, False)] * 5


def test_sent_rows_are_pruned_after_their_retention_and_unsent_ones_never(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    db.execute(
        "UPDATE txn_outbox SET sent_at = now() - interval '8 days' WHERE id IN (SELECT min(id) FROM txn_outbox WHERE job = 'j')"
    )
    db.execute(
        "UPDATE txn_outbox SET sent_at = now() - interval '6 days' WHERE id IN (SELECT max(id) FROM txn_outbox WHERE job = 'j')"
    )
    db.execute(
        "UPDATE txn_outbox SET failed_at = now() - interval '30 days' WHERE job = 'j' AND sent_at IS NULL"
    )
    p = publisher(monkeypatch, FakeProducer())
    assert p.prune_sent(committed) == 1
    assert rows(db, "SELECT count(*) FROM txn_outbox WHERE job = 'j'") == [(4,)]
    assert p.prune_sent(committed, keep_days=1) == 1
    assert p.prune_sent(committed, keep_days=6.0001) == 0
    others_untouched(db)


@pytest.mark.parametrize(("age", "pruned"), [("6 days - 3 seconds", 0), ("6 days 3 seconds", 1)])
def test_the_retention_of_sent_rows_is_counted_in_whole_days_of_seconds(
    monkeypatch: pytest.MonkeyPatch,
    committed: psycopg.Connection,
    db: psycopg.Connection,
    age: str,
    pruned: int,
) -> None:
    db.execute(
        f"UPDATE txn_outbox SET sent_at = now() - interval '{age}' "
        "WHERE id IN (SELECT min(id) FROM txn_outbox WHERE job = 'j')"
    )
    assert publisher(monkeypatch, FakeProducer()).prune_sent(committed, keep_days=6) == pruned


def test_a_publisher_prunes_sent_rows_at_its_first_publish_and_then_once_an_hour(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    old_sent = "UPDATE txn_outbox SET sent_at = now() - interval '8 days' WHERE id IN (SELECT min(id) FROM txn_outbox WHERE job = 'j' AND sent_at IS NULL)"
    p = publisher(monkeypatch, FakeProducer())
    db.execute(old_sent)
    assert p.publish_pending(committed) == 4
    assert rows(db, "SELECT count(*) FROM txn_outbox WHERE job = 'j'") == [(4,)]
    db.execute("UPDATE txn_outbox SET sent_at = now() - interval '8 days' WHERE job = 'j'")
    p.publish_pending(committed)
    assert rows(db, "SELECT count(*) FROM txn_outbox WHERE job = 'j'") == [(4,)]
    assert p._pruned_at is not None
    p._pruned_at -= outbox_module.PRUNE_EVERY_SECONDS + 1
    p.publish_pending(committed)
    assert rows(db, "SELECT count(*) FROM txn_outbox WHERE job = 'j'") == [(0,)]


def test_the_producer_keeps_acks_all_and_idempotence_whatever_the_options() -> None:
    conf = producer_config(
        {"acks": "1", "enable.idempotence": False, "linger.ms": 50, "message.timeout.ms": 1}, 2
    )
    assert conf["acks"] == "all" and conf["enable.idempotence"] is True
    assert conf["message.timeout.ms"] == 2_000 and conf["linger.ms"] == 50
    assert producer_config({}, 2)["topic.metadata.propagation.max.ms"] == 1_000
    assert producer_config({}, 2)["linger.ms"] == 5
    # --publish-max-bytes: no record batch bigger than the topic takes; without it, librdkafka's own.
    assert producer_config({}, 2, batch_bytes=900_000)["batch.size"] == 900_000
    assert "batch.size" not in producer_config({}, 2)


def test_a_producer_refused_for_its_topic_or_failing_fatally_is_replaced_and_one_refusing_a_message_is_not(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    dropped: list[Any] = []
    monkeypatch.setattr(outbox_module, "drop_producer", dropped.append)
    too_large = FakeProducer(outcome=lambda i: KafkaError.MSG_SIZE_TOO_LARGE if i == 0 else None)
    publisher(monkeypatch, too_large).publish_pending(committed)
    assert dropped == []
    db.execute("UPDATE txn_outbox SET sent_at = NULL, failed_at = NULL WHERE job = 'j'")
    no_topic = FakeProducer(outcome=lambda i: KafkaError._UNKNOWN_TOPIC if i == 0 else None)
    publisher(monkeypatch, no_topic).publish_pending(committed)
    assert dropped == [no_topic]
    db.execute("UPDATE txn_outbox SET sent_at = NULL, failed_at = NULL WHERE job = 'j'")
    fatal = FakeProducer(outcome=lambda i: KafkaError._FATAL if i == 1 else None)
    with pytest.raises(PublishFailed, match=r"failed: Local: Fatal error \(_FATAL\);"):
        publisher(monkeypatch, fatal).publish_pending(committed)
    assert dropped == [no_topic, fatal]
    timed_out = FakeProducer(outcome=lambda i: KafkaError._MSG_TIMED_OUT if i == 0 else None)
    with pytest.raises(PublishFailed):
        publisher(monkeypatch, timed_out).publish_pending(committed)
    assert dropped == [no_topic, fatal]


def test_a_producer_failing_outright_leaves_every_row_pending_with_the_error_in_one_line(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    dropped: list[Any] = []
    monkeypatch.setattr(outbox_module, "drop_producer", dropped.append)

    class Broken(FakeProducer):
        def poll(self, timeout: float = 0) -> int:
            return 0

        def flush(self, timeout: float = -1) -> int:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers down"))

    broken = Broken()
    with pytest.raises(PublishFailed, match="failed: all brokers down; 5 committed results stay"):
        publisher(monkeypatch, broken).publish_pending(committed)
    assert dropped == [broken] and state(db) == [(False, False)] * 5

    class Refusing(FakeProducer):
        def produce(self, *args: Any, **kwargs: Any) -> None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "connection reset"))

    refusing = Refusing()
    with pytest.raises(PublishFailed, match="failed: connection reset; 5 committed results stay"):
        publisher(monkeypatch, refusing).publish_pending(committed)
    assert dropped == [broken, refusing] and state(db) == [(False, False)] * 5


# The offset store among other jobs, topics and partitions.


@pytest.fixture
def neighbours(conn: psycopg.Connection, db: psycopg.Connection) -> psycopg.Connection:
    """Rows of jobs a, j, z, topics s, t, v, partitions 0-2, all at offset 3; a and z each have
    one more partition of t (7 at 1 and 8 at 5) that j has not."""
    for job, off in (("a", 3), ("j", 3), ("z", 3)):
        for topic in ("s", "t", "v"):
            seed(db, job, topic, {p: off for p in range(3)})
    seed(db, "a", "t", {7: 1})
    seed(db, "z", "t", {8: 5})
    return conn


def test_committed_state_and_stored_offsets_read_the_jobs_own_rows_only(
    neighbours: psycopg.Connection, db: psycopg.Connection
) -> None:
    committed, history = store.committed_state(neighbours, "j", ["t"])
    assert neighbours.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert committed == {("t", 0): 3, ("t", 1): 3, ("t", 2): 3} and set(history) == set(committed)
    stored_now = store.stored_offsets(neighbours, "j", [OffsetRange("t", 1, 0, 1), OffsetRange("t", 7, 0, 1)])
    assert neighbours.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert stored_now == {("t", 1): 3, ("t", 7): None}


def test_topic_ids_and_lost_ranges_touch_the_jobs_own_rows_only(
    neighbours: psycopg.Connection, db: psycopg.Connection
) -> None:
    store.record_topic_ids(neighbours, "j", {"t": "X"})
    assert rows(db, "SELECT job, topic FROM txn_offsets WHERE topic_id IS NOT NULL GROUP BY 1, 2") == [
        ("j", "t")
    ]
    recorded = store.record_lost_ranges(
        neighbours, "j", [OffsetRange("t", 1, 3, 10), OffsetRange("t", 2, 4, 10)]
    )
    assert recorded == [OffsetRange("t", 1, 3, 10)]
    assert rows(db, "SELECT job, topic, part, off FROM txn_offsets WHERE off NOT IN (1, 3, 5)") == [
        ("j", "t", 1, 10)
    ]
    assert rows(db, "SELECT job, topic, part, from_off, until_off FROM txn_lost_ranges") == [
        ("j", "t", 1, 3, 10)
    ]


def test_a_returning_partition_starts_above_the_highest_generation_it_stored_in(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    sink = IdempotentSink(conn, "j")
    sink.store(OffsetRange("t", 0, 0, 2), [_messages(range(2))])
    db.execute("UPDATE txn_offsets SET generation = 3, off = 0")
    sink.store(OffsetRange("t", 0, 0, 2, generation=3), [_messages(range(2))])
    db.execute("DELETE FROM txn_offsets")
    store.create_start_rows(conn, "j", [StartDecision("t", 0, 0, "x")])
    assert rows(db, "SELECT generation FROM txn_offsets") == [(4,)]


# The idempotent sink among other rows, and its chunks.


def test_the_idempotent_sink_moves_exactly_its_own_row(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    for job in ("j", "k"):
        for topic in ("t", "u"):
            seed(db, job, topic, {0: 0, 1: 0})
    IdempotentSink(conn, "k").store(OffsetRange("u", 1, 0, 3), [[]])
    IdempotentSink(conn, "j").store(OffsetRange("t", 0, 0, 2), [[]])
    moved = rows(db, "SELECT job, topic, part, off FROM txn_offsets WHERE off <> 0 ORDER BY 1, 2, 3")
    assert moved == [("j", "t", 0, 2), ("k", "u", 1, 3)]
    with pytest.raises(OffsetOverlap, match="no offset row"):
        IdempotentSink(conn, "j").store(OffsetRange("t", 5, 0, 2), [[]])


def test_a_range_without_messages_keeps_the_last_message_stored(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    batch = _messages([0, 1])
    IdempotentSink(conn, "j").store(OffsetRange("t", 0, 0, 2), [batch])
    IdempotentSink(conn, "j").store(OffsetRange("t", 0, 2, 4), [[], []])
    found = rows(db, "SELECT off, last_off, last_timestamp, last_digest FROM txn_offsets")
    assert found == [(4, 1, 1_001, fingerprint(batch[1]).digest)]


def test_a_transform_failing_for_another_reason_than_its_message_is_raised_not_skipped(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})

    def transform(m: Message) -> tuple[bytes | None, bytes | None]:
        raise DatabaseUnavailable("the lookup's database is down")

    with pytest.raises(DatabaseUnavailable):
        IdempotentSink(conn, "j").store(
            OffsetRange("t", 0, 0, 2), [_messages([0, 1])], transform, skip_bad=True
        )
    assert offsets(db) == {("t", 0): 0}


@pytest.mark.parametrize(("chunk_bytes", "chunks"), [(348, [3, 3, 3, 1]), (349, [4, 4, 2])])
def test_the_idempotent_sink_cuts_chunks_by_the_bytes_of_keys_and_values(
    conn: psycopg.Connection,
    db: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    chunk_bytes: int,
    chunks: list[int],
) -> None:
    """Each row counts its key (2 bytes here), its value (50) and 64: 116; a chunk is written
    once it holds ``chunk_bytes``."""
    from txstore.postgres import idempotent

    monkeypatch.setattr(idempotent, "CHUNK_BYTES", chunk_bytes)
    sizes: list[int] = []
    insert = IdempotentSink._insert

    def counted(cur: Any, params: dict[str, Any], chunk: list[Any]) -> None:
        sizes.append(len(chunk))
        insert(cur, params, chunk)

    monkeypatch.setattr(IdempotentSink, "_insert", staticmethod(counted))
    seed(db, "j", "t", {0: 0})
    batches = [_messages(range(5), b"y" * 50), _messages(range(5, 10), b"y" * 50)]
    assert IdempotentSink(conn, "j").store(OffsetRange("t", 0, 0, 10), batches) == 10
    assert sizes == chunks
    assert [o for _, o, *_ in stored(db)] == list(range(10))


# A planner's topic pattern and subscription (fast: fake watermarks and topic lists).


def pattern_planner(
    database_url: str,
    marks: list[PartitionWatermarks],
    listed: Callable[[], list[str]],
    topic_ids: dict[str, str] | None = None,
    **settings: Any,
) -> Planner:
    """A planner of ``--topic-pattern 't-.*'``: Kafka lists ``listed()``, and answers the
    watermarks of ``marks`` (a listed topic without marks is unknown: deleted since listed)."""
    s = JobSettings("j", (), "fake:9092", database_url, topic_pattern="t-.*", **settings)

    def watermarks(conf: Any, topics: Sequence[str]) -> list[PartitionWatermarks]:
        for topic in topics:
            if not any(m.topic == topic for m in marks):
                raise UnknownTopic(f"topic {topic!r} does not exist", topic, "fake:9092")
        return [m for m in marks if m.topic in topics]

    source = (lambda conf, topics: dict(topic_ids)) if topic_ids is not None else None
    return Planner(s, watermarks, source, topic_names=lambda conf: listed())  # type: ignore[arg-type]


def test_a_pattern_planner_leaves_out_a_topic_kafka_deleted_after_listing_it_and_plans_the_rest(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    marks = [PartitionWatermarks("t-a", 0, 0, 3)]
    p = pattern_planner(database_url, marks, lambda: ["t-a", "t-gone", "other"])
    assert p.plan(lambda: conn) == [OffsetRange("t-a", 0, 0, 3)]
    assert p.topics == ("t-a",)
    assert offsets(db) == {("t-a", 0): 0}


def test_a_pattern_planner_says_what_it_matches_once_each_time_it_changes(
    database_url: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    marks: list[PartitionWatermarks] = []
    listed: list[str] = []
    p = pattern_planner(database_url, marks, lambda: list(listed))
    with caplog.at_level(logging.INFO, logger="txstore"):
        assert p.plan(lambda: conn) == []
        assert p.plan(lambda: conn) == []
        marks.append(PartitionWatermarks("t-a", 0, 0, 2))
        listed.append("t-a")
        p.plan(lambda: conn)
        p.plan(lambda: conn)
    said = [r.getMessage() for r in caplog.records if "--topic-pattern" in r.getMessage()]
    assert said == [
        "job j: --topic-pattern 't-.*' matches no topic on Kafka yet; nothing to read",
        "job j: --topic-pattern 't-.*' matches 1 topic: t-a",
    ]


def test_a_pattern_planner_starts_a_topic_that_matches_later_and_a_new_partition_of_a_started_one_at_earliest(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """The first run's topics start at --starting-offsets (latest here); a topic that starts
    matching later, and a partition added to a topic the job started, start at their earliest
    offset: their messages came after the job began, and none may be skipped."""
    marks = [PartitionWatermarks("t-a", 0, 0, 4)]
    listed = ["t-a"]
    p = pattern_planner(database_url, marks, lambda: list(listed), starting_offsets=StartingOffsets(LATEST))
    assert p.plan(lambda: conn) == []
    assert offsets(db) == {("t-a", 0): 4}
    marks += [PartitionWatermarks("t-a", 1, 1, 3), PartitionWatermarks("t-b", 0, 2, 5)]
    listed.append("t-b")
    assert sorted(p.plan(lambda: conn)) == [OffsetRange("t-a", 1, 1, 3), OffsetRange("t-b", 0, 2, 5)]
    assert offsets(db) == {("t-a", 0): 4, ("t-a", 1): 1, ("t-b", 0): 2}


def test_a_pattern_planner_plans_the_topics_it_started_rows_for_and_a_topic_listed_meanwhile_next_time(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """A plan that stores start rows reads the job's rows again for the same topics: a topic Kafka
    lists only after the plan's first look joins at the next plan, with its own start row."""
    marks = [PartitionWatermarks("t-a", 0, 0, 2), PartitionWatermarks("t-b", 0, 0, 3)]
    looks = iter([["t-a"], ["t-a", "t-b"], ["t-a", "t-b"]])
    p = pattern_planner(database_url, marks, lambda: next(looks))
    assert p.plan(lambda: conn) == [OffsetRange("t-a", 0, 0, 2)]
    assert offsets(db) == {("t-a", 0): 0}
    assert sorted(p.plan(lambda: conn)) == [OffsetRange("t-a", 0, 0, 2), OffsetRange("t-b", 0, 0, 3)]


def test_a_planner_records_how_the_job_names_its_partitions(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    p = pattern_planner(database_url, [PartitionWatermarks("t-a", 0, 0, 1)], lambda: ["t-a"])
    p.plan(lambda: conn)
    recorded = store.subscriptions(db, "j")["j"]
    assert (recorded.kind, recorded.pattern) == ("pattern", "t-.*")


def test_a_recreated_topic_s_aged_out_offsets_are_no_lost_range_the_plan_stops_on_its_topic_id(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """--fail-on-data-loss false skips offsets Kafka aged out, recording them: not those of a
    topic that was recreated (its offsets are another log's), which stops the plan instead."""
    marks = [PartitionWatermarks("t", 0, 0, 3)]
    assert planner(database_url, marks, {"t": "T1"}, fail_on_data_loss=False).plan(lambda: conn)
    db.execute("UPDATE txn_offsets SET off = 2")
    marks[0] = PartitionWatermarks("t", 0, 5, 8)  # offsets 2-4 gone, and the topic is another
    with pytest.raises(TopicRecreated, match="the topic was deleted and recreated"):
        planner(database_url, marks, {"t": "T2"}, fail_on_data_loss=False).plan(lambda: conn)
    assert rows(db, "SELECT count(*) FROM txn_lost_ranges") == [(0,)]
    assert offsets(db) == {("t", 0): 2}
    # The same topic, aged out: skipped and recorded.
    assert planner(database_url, marks, {"t": "T1"}, fail_on_data_loss=False).plan(lambda: conn) == [
        OffsetRange("t", 0, 5, 8)
    ]
    assert rows(db, "SELECT from_off, until_off FROM txn_lost_ranges") == [(2, 5)]


def test_set_aside_rows_say_why_a_message_too_large_on_its_own_and_a_topic_kafka_lacks(
    monkeypatch: pytest.MonkeyPatch, committed: psycopg.Connection, db: psycopg.Connection
) -> None:
    """A message Kafka refuses as too large in a batch with others is sent again alone; refused
    alone too, it is set aside with what to raise. A refusal for its topic says so."""
    too_large = FakeProducer(outcome=lambda i: KafkaError.MSG_SIZE_TOO_LARGE if i in (0, 5) else None)
    publisher(monkeypatch, too_large).publish_pending(committed)
    assert len(too_large.produced) == 6  # five in a batch, the refused one again alone
    reasons = rows(db, "SELECT failed_reason FROM txn_outbox WHERE job = 'j' AND failed_at IS NOT NULL")
    assert len(reasons) == 1
    assert reasons[0][0].startswith(
        "the message is too large for Kafka topic 'out': on its own it is a record batch"
    )
    expected = set_aside_reason(KafkaError._UNKNOWN_TOPIC)
    assert expected is not None
    for refusals in (
        {0: KafkaError._UNKNOWN_TOPIC},  # in the batch
        {0: KafkaError.MSG_SIZE_TOO_LARGE, 5: KafkaError._UNKNOWN_TOPIC},  # sent alone: its topic gone
    ):
        db.execute(
            "UPDATE txn_outbox SET sent_at = NULL, failed_at = NULL, failed_reason = NULL WHERE job = 'j'"
        )
        no_topic = FakeProducer(outcome=lambda i, given=dict(refusals): given.get(i))  # type: ignore[misc]
        publisher(monkeypatch, no_topic).publish_pending(committed)
        reasons = rows(db, "SELECT failed_reason FROM txn_outbox WHERE job = 'j' AND failed_at IS NOT NULL")
        assert len(reasons) == 1 and reasons[0][0].startswith(expected + ": "), reasons


# -- an idle plan taken as the last one (txstore.core.idle), with the job's own Kafka client ----


def kept_client_planner(database_url: str) -> Planner:
    return Planner(JobSettings("j", ("t",), "fake:9092", database_url), Watermarks())


def set_offset(db: psycopg.Connection, partition: int, offset: int) -> None:
    db.execute("UPDATE txn_offsets SET off = %s WHERE job = 'j' AND part = %s", (offset, partition))
    db.commit()


def spans(ranges: Sequence[OffsetRange]) -> list[tuple[int, int, int]]:
    return [(r.partition, r.from_offset, r.until_offset) for r in ranges]


def test_an_idle_plan_ends_at_a_new_message_or_a_changed_row_at_once(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install_with_admin(monkeypatch)
    log = fake.add(FakeLog.of("t", 0, range(3)))
    planner = kept_client_planner(database_url)
    assert spans(planner.plan(lambda: conn)) == [(0, 0, 3)]
    set_offset(db, 0, 3)  # as the batch's commit moves it
    for _ in range(3):
        assert planner.plan(lambda: conn) == []
    log.messages[3] = message("t", 0, 3, b"v", b"k", 1_003)
    log.high = 4
    assert spans(planner.plan(lambda: conn)) == [(0, 3, 4)]  # the log end moved: at once
    set_offset(db, 0, 4)
    for _ in range(3):
        assert planner.plan(lambda: conn) == []
    set_offset(db, 0, 1)  # a row moved under the idle job: at once
    assert spans(planner.plan(lambda: conn)) == [(0, 1, 4)]


def test_the_rows_version_changes_with_every_write_to_the_jobs_rows_and_nothing_else(
    conn: psycopg.Connection, db: psycopg.Connection
) -> None:
    """What an idle plan compares instead of the rows (txstore.core.idle): read with the rows in
    one statement, or alone; any write to one of the job's rows of these topics changes it, even
    of the same values; a refused conditional update, a row lock, another job's or another
    topic's rows do not."""
    assert store.rows_version(conn, "j", ["t"]) == "" and store.versioned_rows(conn, "j", ["t"]) == ([], "")
    seed(db, "j", "t", {0: 5, 1: 7})
    seed(db, "j", "u", {0: 1})
    seed(db, "other", "t", {0: 3})
    read, version = store.versioned_rows(conn, "j", ["t"])
    assert read == store.offset_rows(conn, "j", ["t"]) and [r[:3] for r in read] == [("t", 0, 5), ("t", 1, 7)]
    assert store.rows_version(conn, "j", ["t"]) == version and len(version.split(",")) == 2
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # no read left open
    unchanged = [
        "UPDATE txn_offsets SET off = 9 WHERE job = 'j' AND topic = 't' AND part = 0 AND off = 4",
        "SELECT off FROM txn_offsets WHERE job = 'j' FOR UPDATE",
        "UPDATE txn_offsets SET off = 4 WHERE job = 'other'",
        "UPDATE txn_offsets SET off = 2 WHERE job = 'j' AND topic = 'u'",
    ]
    for sql in unchanged:
        db.execute(sql)
        db.commit()
        assert store.rows_version(conn, "j", ["t"]) == version, sql
    seen = {version}
    changes = [
        "UPDATE txn_offsets SET off = 5 WHERE job = 'j' AND topic = 't' AND part = 0",  # the same value
        "UPDATE txn_offsets SET off = 6 WHERE job = 'j' AND topic = 't' AND part = 1",
        "UPDATE txn_offsets SET off = 7 WHERE job = 'j' AND topic = 't' AND part = 1",  # back again
        "DELETE FROM txn_offsets WHERE job = 'j' AND topic = 't' AND part = 1",
    ]
    for sql in changes:
        db.execute(sql)
        db.commit()
        now = store.rows_version(conn, "j", ["t"])
        assert now not in seen and store.versioned_rows(conn, "j", ["t"])[1] == now, sql
        seen.add(now)
    seed(db, "j", "t", {1: 7})  # the same row as before it was deleted
    assert store.rows_version(conn, "j", ["t"]) not in seen
    assert store.rows_version(conn, "j", ["t", "u"]).count(",") == 2  # both topics' rows


def test_an_idle_plan_asks_for_new_partitions_only_once_it_is_due(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No metadata request while idle: a partition added meanwhile is started (from offset 0) at
    the first plan once the idle plan is due, not before."""
    monkeypatch.setattr(planning_module, "IDLE_TOPIC_ID_SECONDS", 1.0)
    fake = install_with_admin(monkeypatch)
    fake.add(FakeLog.of("t", 0, range(2)))
    planner = kept_client_planner(database_url)
    assert spans(planner.plan(lambda: conn)) == [(0, 0, 2)]
    set_offset(db, 0, 2)
    assert planner.plan(lambda: conn) == []  # idle: kept until 1 s from now
    started = time.monotonic()
    fake.add(FakeLog.of("t", 1, range(5)))
    assert planner.plan(lambda: conn) == []  # not asked yet
    assert time.monotonic() - started < 0.5, "the check above needs the idle plan not yet due"
    time.sleep(1.0)
    assert spans(planner.plan(lambda: conn)) == [(1, 0, 5)]
    assert rows(db, "SELECT part, off FROM txn_offsets WHERE job = 'j' ORDER BY part") == [(0, 2), (1, 0)]


def test_a_topic_deleted_under_an_idle_plan_stops_it_at_once_with_the_vanished_topic_line(
    database_url: str, conn: psycopg.Connection, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install_with_admin(monkeypatch)
    fake.add(FakeLog.of("t", 0, range(2)))
    planner = kept_client_planner(database_url)
    assert spans(planner.plan(lambda: conn)) == [(0, 0, 2)]
    set_offset(db, 0, 2)
    assert planner.plan(lambda: conn) == planner.plan(lambda: conn) == []
    del fake.logs[("t", 0)]
    with pytest.raises(
        UnknownTopic, match=r"topic 't' does not exist on Kafka at fake:9092 now, though the job"
    ):
        planner.plan(lambda: conn)
