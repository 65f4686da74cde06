"""The guards of exactly-once that issue 28's mutations removed unnoticed, one test each.

Each test names the behaviour it keeps, and fails when that guard is removed or weakened
(checked by applying the mutation by hand, and again by ``./dev mutate``). No Spark, no
broker: PostgreSQL where the guard is SQL, fakes of the Kafka client library elsewhere
(tests/helpers/fake_kafka.py), so each runs in about a second.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from confluent_kafka import KafkaError, Message

from tests.helpers.fake_kafka import FakeKafka, FakeLog, FakeProducer, install
from tests.helpers.fast_db import module_database
from tests.postgres.test_sink import seed, snapshot
from txstore.core.errors import OffsetOverlap, PublishFailed, TopicRecreated
from txstore.core.fingerprint import fingerprint
from txstore.core.ranges import OffsetRange, PartitionWatermarks
from txstore.core.results import TOPIC_TOTAL
from txstore.kafka.reader import RangeReader
from txstore.ops.reset import apply_reset
from txstore.ops.reset_plan import ResetMove
from txstore.planning import Planner
from txstore.postgres import outbox as outbox_module
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.idempotent import IdempotentSink
from txstore.postgres.outbox import OutboxPublisher
from txstore.postgres.sink import TransactionalSink
from txstore.settings import JobSettings

CONF = {"bootstrap.servers": "fake:9092"}


shared_database_url, database_url = module_database("guards")


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    return install(monkeypatch)


def offsets_read(r: OffsetRange, **kwargs: object) -> tuple[list[int], RangeReader]:
    reader = RangeReader(CONF, r, **kwargs)  # type: ignore[arg-type]
    got = [m.offset() for batch in reader for m in batch]
    assert reader.messages == len(got)
    return got, reader


def offset_row(db: psycopg.Connection, job: str = "j") -> list[tuple[object, ...]]:
    return db.execute(
        "SELECT part, off, generation FROM txn_offsets WHERE job = %s ORDER BY part", (job,)
    ).fetchall()


# 1. The generation condition of the conditional update.


def old_log_messages(n: int) -> list[Message]:
    return [
        Message(topic="t", partition=0, offset=o, key=b"k", value=b"old", timestamp=(1, o)) for o in range(n)
    ]


@pytest.mark.parametrize("commit", ["per-range", "per-batch", "idempotent"])
def test_a_range_planned_in_an_older_generation_never_commits_after_a_reset_to_a_new_generation(
    database_url: str, db: psycopg.Connection, commit: str
) -> None:
    """The old log's range [0, 10) was counted; the topic was recreated and reset to offset 0
    in generation 1. A retry of the old range (a speculative or late task, planned in
    generation 0) finds the offset at its ``from`` again, but must not count the old log's
    messages into the new generation."""
    seed(db, "j", "t", {0: 0, 1: 0})
    old = OffsetRange("t", 0, 0, 10, generation=0)
    with connect(database_url) as conn:
        transactional = TransactionalSink(conn, "j")
        idempotent = IdempotentSink(conn, "j")

        def run(r: OffsetRange, other: OffsetRange | None = None) -> None:
            if commit == "per-range":
                transactional.commit(r, {TOPIC_TOTAL: r.size})
            elif commit == "per-batch":
                transactional.commit_batch([r, other or OffsetRange("t", 1, 0, 1)], {("t", TOPIC_TOTAL): 1})
            else:
                idempotent.store(r, [old_log_messages(r.until_offset)[r.from_offset :]])

        run(old)
        apply_reset(conn, "j", [ResetMove("t", 0, 10, 0, generation=0, new_generation=1, reason="test")])
        before = snapshot(db)
        with pytest.raises(OffsetOverlap, match="stored offset 0 does not match the range start"):
            run(old, OffsetRange("t", 1, 1, 2))
        assert snapshot(db) == before
        assert offset_row(db)[0] == (0, 0, 1)
        # The new generation's own range commits.
        run(OffsetRange("t", 0, 0, 4, generation=1), OffsetRange("t", 1, 1, 2))
    assert offset_row(db)[0] == (0, 4, 1)


# 2. A range that ends on a transaction marker.


def test_a_range_ending_on_a_transaction_marker_stops_below_until_and_the_next_range_starts_there(
    fake_kafka: FakeKafka,
) -> None:
    """Offset 4 is a commit marker: asked for 5 messages from 0, the consumer returns 0-3 and
    5. The message at 5 belongs to the next range [5, 7), never to this one."""
    fake_kafka.add(FakeLog.of("t", 0, [0, 1, 2, 3, 5, 6], high=7))
    got, reader = offsets_read(OffsetRange("t", 0, 0, 5))
    assert got == [0, 1, 2, 3]
    assert reader.last is not None and reader.last.offset == 3
    assert offsets_read(OffsetRange("t", 0, 5, 7))[0] == [5, 6]


def test_a_range_ending_on_a_marker_delivers_nothing_past_until_even_in_small_batches(
    fake_kafka: FakeKafka,
) -> None:
    fake_kafka.add(FakeLog.of("t", 0, [0, 1, 2, 4, 5, 7, 8], high=9))
    got, _ = offsets_read(OffsetRange("t", 0, 0, 7), batch_size=2)
    assert got == [0, 1, 2, 4, 5]


# 3. An end-of-partition event below `until`.


def test_an_end_of_partition_event_below_until_does_not_end_the_read(fake_kafka: FakeKafka) -> None:
    """The consumer first sees the log end at 4 (a fetch not caught up yet) and says so with an
    EOF event; the range [0, 10) was planned from a log end of 10, and its commit will move the
    offset to 10, so every message up to 10 must still be read."""
    fake_kafka.add(FakeLog.of("t", 0, range(10), visible_ends=[4, 4, 7]))
    got, reader = offsets_read(OffsetRange("t", 0, 0, 10))
    assert got == list(range(10))
    assert reader.last is not None and reader.last.offset == 9


def test_an_end_of_partition_event_at_until_ends_a_read_whose_last_offsets_are_holes(
    fake_kafka: FakeKafka,
) -> None:
    """Offsets 8 and 9 are markers and the log ends at 10: the EOF event says nothing more will
    come below 10, and the read ends there instead of waiting for its idle timeout."""
    fake_kafka.add(FakeLog.of("t", 0, range(8), high=10))
    got, _ = offsets_read(OffsetRange("t", 0, 0, 10), idle_timeout=0.5)
    assert got == list(range(8))


# 4. A publish chunk delivered only in part.


@pytest.fixture
def committed_outbox(database_url: str, db: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """Four commits of job j, each with one outbox row (ids in commit order)."""
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j", publish_to="out")
        for i in range(4):
            sink.commit(OffsetRange("t", 0, i, i + 1), {TOPIC_TOTAL: 1})
        yield conn


def outbox_state(db: psycopg.Connection) -> list[tuple[bool, bool]]:
    """Per row in id order: (sent, set aside)."""
    rows = db.execute(
        "SELECT sent_at IS NOT NULL, failed_at IS NOT NULL FROM txn_outbox WHERE job = 'j' ORDER BY id"
    ).fetchall()
    return [(bool(s), bool(f)) for s, f in rows]


def publish_with(
    monkeypatch: pytest.MonkeyPatch, conn: psycopg.Connection, producer: FakeProducer, **kwargs: object
) -> Callable[[], int]:
    monkeypatch.setattr(outbox_module, "shared_producer", lambda conf: producer)
    publisher = OutboxPublisher(CONF, "j", timeout=1, **kwargs)  # type: ignore[arg-type]
    return lambda: publisher.publish_pending(conn)


def test_a_publish_chunk_delivered_in_part_marks_only_the_delivered_rows_sent(
    monkeypatch: pytest.MonkeyPatch, committed_outbox: psycopg.Connection, db: psycopg.Connection
) -> None:
    """Row 1 delivered, row 2 timed out (a passing failure: publishing stops there), rows 3-4
    never produced. Only row 1 is sent; the rest stay pending, not set aside, and the next
    publish sends exactly them."""
    producer = FakeProducer(outcome=lambda i: KafkaError._MSG_TIMED_OUT if i == 1 else None)
    with pytest.raises(PublishFailed, match="3 committed results stay in txn_outbox"):
        publish_with(monkeypatch, committed_outbox, producer)()
    assert len(producer.produced) == 2
    assert outbox_state(db) == [(True, False), (False, False), (False, False), (False, False)]

    again = FakeProducer()
    assert publish_with(monkeypatch, committed_outbox, again)() == 3
    keys = [k for (k,) in db.execute("SELECT dedup_key FROM txn_outbox WHERE job = 'j' ORDER BY id")]
    assert [key.decode() for _, _, key, _ in producer.produced] == keys[:2]
    assert [key.decode() for _, _, key, _ in again.produced] == keys[1:]
    assert outbox_state(db) == [(True, False)] * 4


def test_rows_kafka_has_not_confirmed_when_the_flush_times_out_stay_pending(
    monkeypatch: pytest.MonkeyPatch, committed_outbox: psycopg.Connection, db: psycopg.Connection
) -> None:
    producer = FakeProducer(unconfirmed=lambda i: i >= 2)
    with pytest.raises(PublishFailed, match="2 messages not confirmed within 1s"):
        publish_with(monkeypatch, committed_outbox, producer)()
    assert outbox_state(db) == [(True, False), (True, False), (False, False), (False, False)]


def test_a_row_kafka_refuses_for_good_is_set_aside_and_the_chunk_goes_on(
    monkeypatch: pytest.MonkeyPatch, committed_outbox: psycopg.Connection, db: psycopg.Connection
) -> None:
    # Message 1 refused as too large in a record batch, and again sent alone (message 3).
    producer = FakeProducer(
        outcome=lambda i: KafkaError.MSG_SIZE_TOO_LARGE if i in (1, 3) else None,
        refuse_at_produce=lambda i: KafkaError.MSG_SIZE_TOO_LARGE if i == 2 else None,
    )
    assert publish_with(monkeypatch, committed_outbox, producer, chunk_rows=3)() == 2
    assert outbox_state(db) == [(True, False), (False, True), (False, True), (True, False)]
    keys = [k for (k,) in db.execute("SELECT dedup_key FROM txn_outbox WHERE job = 'j' ORDER BY id")]
    assert [key.decode() for _, _, key, _ in producer.produced] == [
        keys[0],
        keys[1],
        keys[2],
        keys[1],
        keys[3],
    ]
    reasons = db.execute("SELECT failed_reason FROM txn_outbox WHERE failed_at IS NOT NULL").fetchall()
    assert all(r.startswith("the message is too large for Kafka") for (r,) in reasons)


# 5. --fail-on-data-loss false and another instance.


def test_a_lost_range_is_neither_recorded_nor_moved_once_another_instance_moved_the_offset(
    database_url: str, db: psycopg.Connection
) -> None:
    """Two instances planned from offset 3 while Kafka's log starts at 10. One moved the offset
    to 10, recorded 3 -> 10 as lost, and counted 10 -> 15. The other one's skip comes late: it
    must neither move the offset back to 10 (15 -> 10: counted twice) nor record the loss again."""
    seed(db, "j", "t", {0: 3, 1: 0})
    lost = [OffsetRange("t", 0, 3, 10)]
    with connect(database_url) as conn:
        assert store.record_lost_ranges(conn, "j", lost) == lost
        TransactionalSink(conn, "j").commit(OffsetRange("t", 0, 10, 15), {TOPIC_TOTAL: 5})
        assert store.record_lost_ranges(conn, "j", [*lost, OffsetRange("t", 1, 0, 4)]) == [
            OffsetRange("t", 1, 0, 4)
        ]
    assert offset_row(db) == [(0, 15, 0), (1, 4, 0)]
    assert db.execute("SELECT part, from_off, until_off FROM txn_lost_ranges ORDER BY id").fetchall() == [
        (0, 3, 10),
        (1, 0, 4),
    ]


# 6. Topic IDs are stored once, never overwritten.


def test_a_stored_topic_id_is_not_overwritten_when_a_partition_without_one_appears(
    database_url: str, db: psycopg.Connection
) -> None:
    """Topic t was counted with ID OLD in one partition. It was deleted and recreated, ID NEW,
    with two partitions: partition 1 is new and has no ID. Planning refuses partition 0
    (OLD != NEW), stores NEW for partition 1 only, and refuses again on every rerun."""
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        store.record_topic_ids(conn, "j", {"t": "OLD"})
        settings = JobSettings("j", ("t",), "fake:9092", database_url)
        marks = [PartitionWatermarks("t", 0, 0, 5), PartitionWatermarks("t", 1, 0, 5)]
        planner = Planner(settings, lambda conf, topics: marks, lambda conf, topics: {"t": "NEW"})  # type: ignore[arg-type]
        for _ in range(2):
            with pytest.raises(TopicRecreated, match="stored topic ID OLD; found topic ID NEW"):
                planner.plan(lambda: conn)
        assert db.execute("SELECT part, topic_id FROM txn_offsets ORDER BY part").fetchall() == [
            (0, "OLD"),
            (1, "NEW"),
        ]


def test_topic_ids_are_recorded_only_in_rows_without_one(database_url: str, db: psycopg.Connection) -> None:
    seed(db, "j", "t", {0: 0, 1: 0})
    seed(db, "j", "u", {0: 0})
    seed(db, "other", "t", {0: 0})
    with connect(database_url) as conn:
        store.record_topic_ids(conn, "j", {"t": "A"})
        store.record_topic_ids(conn, "j", {"t": "B", "u": "C"})
    assert db.execute("SELECT job, topic, part, topic_id FROM txn_offsets ORDER BY 1, 2, 3").fetchall() == [
        ("j", "t", 0, "A"),
        ("j", "t", 1, "A"),
        ("j", "u", 0, "C"),
        ("other", "t", 0, None),
    ]


def test_a_fingerprint_is_of_the_message_the_reader_delivers_last(fake_kafka: FakeKafka) -> None:
    log = fake_kafka.add(FakeLog.of("t", 0, range(6)))
    _, reader = offsets_read(OffsetRange("t", 0, 2, 5))
    assert reader.last == fingerprint(log.messages[4])
