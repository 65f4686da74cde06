"""The idempotent per-message sink and publishing results through the outbox, against real servers."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from confluent_kafka import Message

from tests.conftest import send
from tests.helpers.counting import Counting, offsets
from tests.helpers.real_kafka_fixture import AnyKafka
from tests.postgres.test_sink import seed, snapshot
from txstore.core.errors import AlreadyCommitted, OffsetGap, PublishFailed
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL, by_key
from txstore.count_topic import CountMessages
from txstore.job import TransactionalJob
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.producers import close_producers
from txstore.kafka.reader import RangeReader
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.idempotent import IdempotentSink
from txstore.postgres.outbox import OutboxPublisher, pending_count
from txstore.postgres.sink import TransactionalSink
from txstore.spark.ranges.range_task import ALREADY_COMMITTED, COMMITTED, RangeTask
from txstore.testing.mock_kafka import MockKafkaCluster

PRODUCE_API = 0
REQUEST_TIMED_OUT = 7
NOT_ENOUGH_REPLICAS = 19
MIB = 1024 * 1024


def stored_messages(db: psycopg.Connection, job: str) -> list[tuple[Any, ...]]:
    rows = db.execute(
        "SELECT topic, part, off, key, value FROM txn_messages WHERE job = %s ORDER BY 1, 2, 3", (job,)
    ).fetchall()
    return [
        (t, p, o, None if k is None else bytes(k), None if v is None else bytes(v)) for t, p, o, k, v in rows
    ]


def read_topic(kafka: AnyKafka, topic: str) -> list[Message]:
    """Every message in ``topic`` now, read by offset range."""
    conf = client_config(kafka.bootstrap_servers)
    found: list[Message] = []
    for w in fetch_watermarks(conf, [topic]):
        for batch in RangeReader(conf, OffsetRange(topic, w.partition, w.low, w.high)):
            found += batch
    return found


@pytest.mark.spark
def test_the_idempotent_sink_stores_every_message_once_even_when_offsets_are_reset(
    any_counting: Counting,
) -> None:
    # max.message.bytes for Apache Kafka, whose default is 1 MB
    topic = any_counting.new_topic(2, config={"max.message.bytes": str(4 * MIB)})
    big = b"x" * MIB
    outgoing = [
        (0, b"a", b"1", None),
        (0, None, b"null key", None),
        (1, b"\xff\xfe", b"\x00\x81 not utf-8", None),
        (1, b"b", big, None),
        (0, b"a", None, None),
    ]
    any_counting.send(topic, outgoing)
    s = any_counting.settings("copy", topic, sink="idempotent")
    with TransactionalJob(any_counting.spark, s) as job:
        assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}
    first = stored_messages(any_counting.db, "copy")
    assert Counter((p, k, v) for _, p, _, k, v in first) == Counter((p, k, v) for p, k, v, _ in outgoing)
    assert any_counting.offsets(topic, "copy") == any_counting.log_ends(topic)

    # A forced replay: the offsets go back to the start and the job runs again.
    any_counting.db.execute("UPDATE txn_offsets SET off = 0 WHERE job = 'copy'")
    with TransactionalJob(any_counting.spark, s) as job:
        assert {r.outcome for r in job.run_batch().ranges} == {COMMITTED}
    assert stored_messages(any_counting.db, "copy") == first
    assert any_counting.offsets(topic, "copy") == any_counting.log_ends(topic)


@pytest.mark.spark
def test_an_idempotent_job_stores_what_its_transform_returns(counting: Counting) -> None:
    topic = counting.new_topic(1)
    send(counting.kafka.bootstrap_servers, topic, [(0, b"keep", b"abc", None), (0, b"drop", b"x", None)])

    def upper_if_kept(m: Message) -> tuple[bytes | None, bytes | None] | None:
        return (m.key(), (m.value() or b"").upper()) if m.key() == b"keep" else None

    s = counting.settings("upper", topic, sink="idempotent")
    with TransactionalJob(counting.spark, s, transform=upper_if_kept) as job:
        job.run_batch()
    assert stored_messages(counting.db, "upper") == [(topic, 0, 0, b"keep", b"ABC")]
    assert counting.offsets(topic, "upper") == {0: 2}


def test_an_idempotent_replay_changes_nothing_but_a_gap_is_refused(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    send(kafka.bootstrap_servers, topic, [(0, b"k", str(i).encode(), None) for i in range(20)])
    conf = client_config(kafka.bootstrap_servers)
    seed(db, "j", topic, {0: 0})
    with connect(database_url) as conn:
        sink = IdempotentSink(conn, "j")
        assert sink.store(OffsetRange(topic, 0, 0, 10), RangeReader(conf, OffsetRange(topic, 0, 0, 10))) == 10
        before = stored_messages(db, "j")
        with pytest.raises(AlreadyCommitted):
            sink.store(OffsetRange(topic, 0, 0, 10), RangeReader(conf, OffsetRange(topic, 0, 0, 10)))
        # A range overlapping what is stored is fine: the new part is stored, the rest ignored.
        sink.store(OffsetRange(topic, 0, 5, 15), RangeReader(conf, OffsetRange(topic, 0, 5, 15)))
        assert len(stored_messages(db, "j")) == 15
        assert stored_messages(db, "j")[:10] == before
        with pytest.raises(OffsetGap, match="gap, stored offset 15 is below 17"):
            sink.store(OffsetRange(topic, 0, 17, 20), RangeReader(conf, OffsetRange(topic, 0, 17, 20)))
    assert len(stored_messages(db, "j")) == 15
    assert offsets(db, topic, "j") == {0: 15}


def test_a_commit_writes_its_results_to_the_outbox_in_the_same_transaction(
    database_url: str, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0, 1: 0})
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j", publish_to="results")
        sink.commit(OffsetRange("t", 0, 0, 10), {TOPIC_TOTAL: 10, by_key(None): 4, by_key("a"): 6})
        sink.commit(OffsetRange("t", 1, 0, 5), {TOPIC_TOTAL: 5, by_key("a"): 5})
        before = snapshot(db)
        with pytest.raises(AlreadyCommitted):
            sink.commit(OffsetRange("t", 1, 0, 5), {TOPIC_TOTAL: 5})
    assert snapshot(db) == before
    rows = db.execute(
        "SELECT destination, dedup_key, headers, payload FROM txn_outbox ORDER BY id"
    ).fetchall()
    commits = [h["txstore-commit"] for _, _, h, _ in rows]
    assert all(re.fullmatch("[0-9a-f]{32}", c) for c in commits) and commits[0] != commits[1]
    assert [(d, k) for d, k, _, _ in rows] == [
        ("results", f"j/t/0/10/{commits[0]}/1"),
        ("results", f"j/t/1/5/{commits[1]}/1"),
    ]
    assert rows[1][2] == {
        "txstore-job": "j",
        "txstore-commit": commits[1],
        "txstore-topic": "t",
        "txstore-partition": "1",
        "txstore-until": "5",
    }
    payload = rows[1][3]
    assert payload["ranges"] == [{"topic": "t", "partition": 1, "from": 0, "until": 5}]
    assert (payload["job"], payload["commit"], payload["part"], payload["parts"]) == ("j", commits[1], 1, 1)
    results = {(r["grain"], r["key"]): (r["delta"], r["total"]) for r in payload["results"]}
    assert results == {("topic", None): (5, 15), ("key", "a"): (5, 11)}


def test_a_refused_commit_writes_no_outbox_row(database_url: str, db: psycopg.Connection) -> None:
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j", publish_to="results")
        with pytest.raises(OffsetGap):
            sink.commit(OffsetRange("t", 0, 3, 10), {TOPIC_TOTAL: 7})
    assert db.execute("SELECT count(*) FROM txn_outbox").fetchone() == (0,)


def published(kafka: AnyKafka, topic: str) -> Counter[str]:
    """How often each dedup key arrived in ``topic``, checking each message's headers match its key."""
    seen: Counter[str] = Counter()
    for m in read_topic(kafka, topic):
        key = (m.key() or b"").decode()
        headers = {k: (v or b"").decode() for k, v in m.headers() or []}
        suffix = f"/{headers['txstore-commit']}/{headers['txstore-part']}"
        if "txstore-offsets" in headers:  # a per-batch commit
            assert key.startswith(headers["txstore-job"] + "/batch/") and key.endswith(suffix)
        else:
            assert (
                key
                == "/".join(
                    headers[h] for h in ("txstore-job", "txstore-topic", "txstore-partition", "txstore-until")
                )
                + suffix
            )
        assert headers["txstore-parts"] == "1"
        assert json.loads(m.value() or b"")["results"]
        assert int(headers["txstore-outbox-id"]) > 0
        seen[key] += 1
    return seen


@pytest.mark.spark
def test_every_committed_result_is_published_through_broker_faults(counting: Counting) -> None:
    topic, results = counting.new_topic(3), counting.new_topic(1, prefix="results")
    s = counting.settings("pub", topic, publish_topic=results)

    def committed_keys() -> set[str]:
        return {
            r[0] for r in counting.db.execute("SELECT dedup_key FROM txn_outbox WHERE job = 'pub'").fetchall()
        }

    try:
        with TransactionalJob(counting.spark, s, CountMessages(by_key=True)) as job:
            send(
                counting.kafka.bootstrap_servers,
                topic,
                [(p, b"k", b"v", None) for p in (0, 1, 2) for _ in range(50)],
            )
            # Retriable produce errors: the idempotent producer retries them without duplicates.
            counting.kafka.push_request_errors(
                PRODUCE_API, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT
            )
            job.run_batch()
            assert pending_count(counting.db, "pub") == 0
            assert set(published(counting.kafka, results)) == committed_keys()
        close_producers()

        # Committed while the broker is down (the commit needs only PostgreSQL): publishing
        # fails fast on the first undelivered message and the rows wait in the outbox.
        send(
            counting.kafka.bootstrap_servers,
            topic,
            [(p, b"k", b"v", None) for p in (0, 1) for _ in range(10)],
        )
        with connect(counting.database_url) as conn:
            sink = TransactionalSink(conn, "pub", publish_to=results)
            counting.kafka.set_broker_down(1)
            try:
                for p in (0, 1):
                    end = counting.offsets(topic, "pub")[p]
                    sink.commit(OffsetRange(topic, p, end, end + 10), {TOPIC_TOTAL: 10, by_key("k"): 10})
                with pytest.raises(PublishFailed, match="2 committed results stay in txn_outbox"):
                    OutboxPublisher(s.kafka_conf, "pub", timeout=3.0).publish_pending(conn)
            finally:
                counting.kafka.set_broker_up(1)
        assert pending_count(counting.db, "pub") == 2
        # The next run sends them first, even with no new data to count.
        with TransactionalJob(counting.spark, s, CountMessages(by_key=True)) as job:
            assert job.run_batch().ranges == ()
        assert pending_count(counting.db, "pub") == 0
        seen = published(counting.kafka, results)
        assert set(seen) == committed_keys()
        assert len(committed_keys()) == 5
    finally:
        counting.kafka.clear_request_errors(PRODUCE_API)
        close_producers()


def test_sent_outbox_rows_are_deleted_after_the_retention_and_pending_ones_never(
    database_url: str, db: psycopg.Connection, kafka: MockKafkaCluster
) -> None:
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j", publish_to="results")
        for i in range(3):
            sink.commit(OffsetRange("t", 0, i, i + 1), {TOPIC_TOTAL: 1})
    db.execute("UPDATE txn_outbox SET sent_at = now() - interval '8 days' WHERE dedup_key LIKE 'j/t/0/1/%'")
    db.execute("UPDATE txn_outbox SET sent_at = now() - interval '1 day' WHERE dedup_key LIKE 'j/t/0/2/%'")
    publisher = OutboxPublisher(client_config(kafka.bootstrap_servers), "j")
    with connect(database_url) as conn:
        assert publisher.prune_sent(conn) == 1
    left = db.execute("SELECT dedup_key, sent_at IS NULL FROM txn_outbox ORDER BY id").fetchall()
    assert [(k.rsplit("/", 2)[0], unsent) for k, unsent in left] == [("j/t/0/2", False), ("j/t/0/3", True)]


def test_a_task_with_several_ranges_commits_them_together_and_sorts_out_conflicts_range_by_range(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    send(
        kafka.bootstrap_servers,
        topic,
        [(p, b"k", b"v", None) for p, n in ((0, 10), (1, 20), (2, 30)) for _ in range(n)],
    )
    seed(db, "j", topic, {0: 0, 1: 0, 2: 0})
    task = RangeTask(
        "j", database_url, client_config(kafka.bootstrap_servers), CountMessages(), publish_to="out"
    )
    first = [OffsetRange(topic, p, 0, n) for p, n in ((0, 10), (1, 20), (2, 30))]
    with connect(database_url) as conn:  # another writer got partition 1's range in first
        TransactionalSink(conn, "j").commit(first[1], {TOPIC_TOTAL: 20})
    reports = task.run_together(first)
    assert {r.range.partition: r.outcome for r in reports} == {
        0: COMMITTED,
        1: ALREADY_COMMITTED,
        2: COMMITTED,
    }
    assert {r.range.partition: r.messages for r in reports} == {0: 10, 1: 20, 2: 30}
    # A retry of the whole task finds every range committed and adds nothing.
    assert {r.outcome for r in task.run_together(first)} == {ALREADY_COMMITTED}
    assert store.topic_totals(db, "j", [topic]) == {topic: 60}

    send(kafka.bootstrap_servers, topic, [(p, b"k", b"v", None) for p in (0, 1, 2) for _ in range(5)])
    second = [OffsetRange(topic, p, n, n + 5) for p, n in ((0, 10), (1, 20), (2, 30))]
    assert {r.outcome for r in task.run_together(second)} == {COMMITTED}
    assert store.topic_totals(db, "j", [topic]) == {topic: 75}
    # One transaction for the three ranges: one outbox row covering them all.
    keys = [
        k.rsplit("/", 2)[0] for (k,) in db.execute("SELECT dedup_key FROM txn_outbox ORDER BY id").fetchall()
    ]
    assert keys[:2] == [f"j/{topic}/0/10", f"j/{topic}/2/30"]  # committed one by one after the conflict
    assert len(keys) == 3 and keys[2].startswith("j/batch/")


def test_the_idempotent_sink_stores_each_message_timestamp_to_the_exact_millisecond_up_to_year_9999(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    # Producer-set (CreateTime) timestamps anywhere a Kafka timestamp and PostgreSQL's timestamptz
    # both reach: a float on the way (milliseconds / 1000.0 into to_timestamp) lands microseconds
    # off past about year 2255, and 8 microseconds off at 9999-12-31 23:59:59.999.
    stamps = [1, 999, 1_730_000_000_123, 9_007_199_254_741, 100_000_000_000_001, 253_402_300_799_999]
    topic = new_topic(1)
    send(kafka.bootstrap_servers, topic, [(0, b"k", str(i).encode(), ts) for i, ts in enumerate(stamps)])
    conf = client_config(kafka.bootstrap_servers)
    seed(db, "stamps", topic, {0: 0})
    whole = OffsetRange(topic, 0, 0, len(stamps))
    with connect(database_url) as conn:
        assert IdempotentSink(conn, "stamps").store(whole, RangeReader(conf, whole)) == len(stamps)
    stored = db.execute(
        "SELECT timestamp FROM txn_messages WHERE job = 'stamps' AND topic = %s ORDER BY off", (topic,)
    ).fetchall()
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert [row[0] for row in stored] == [epoch + timedelta(milliseconds=ts) for ts in stamps]
