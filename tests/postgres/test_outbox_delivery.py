"""Publishing through the outbox when commits are big, Kafka refuses rows, batches fail or offsets are reset."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, Message

from tests.helpers.any_outbox import publish_one_batch
from tests.helpers.cli import txstore
from tests.helpers.counting import BrokerDb, Counting
from tests.helpers.real_kafka_fixture import AnyKafka
from tests.postgres.test_idempotent_and_outbox import read_topic
from tests.postgres.test_sink import seed
from txstore.core.errors import BatchFailed
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL, by_key
from txstore.count_topic import CountMessages
from txstore.job import TransactionalJob
from txstore.kafka.client_settings import client_config
from txstore.kafka.producers import close_producers, set_aside_reason
from txstore.postgres.db import connect
from txstore.postgres.outbox import OutboxPublisher, pending_count
from txstore.postgres.sink import PUBLISH_MAX_BYTES, TransactionalSink

PRODUCE_API = 0
TOPIC_AUTHORIZATION_FAILED = 29


def headers_of(m: Message) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in m.headers() or []}


def message_size(m: Message) -> int:
    """What Kafka counts against its size limit: value, key and headers."""
    return (
        len(m.value() or b"")
        + len(m.key() or b"")
        + sum(len(k) + len(v or b"") for k, v in m.headers() or [])
    )


def outbox_rows(db: psycopg.Connection, job: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT id, sent_at IS NOT NULL, failed_at IS NOT NULL, failed_reason FROM txn_outbox "
        "WHERE job = %s ORDER BY id",
        (job,),
    ).fetchall()


def untils(kafka: AnyKafka, topic: str) -> list[int]:
    """Where the (first) range of each message's commit in ``topic`` ends, in the topic's order."""
    return [json.loads(m.value() or b"")["ranges"][0]["until"] for m in read_topic(kafka, topic)]


@pytest.fixture
def results(broker_db: BrokerDb) -> str:
    """A new topic for job 'j' to publish its results to; 'j' has its offset row for topic 't'
    partition 0, at 0 (its commits: :func:`sink_of_j`)."""
    topic = broker_db.new_topic(1, prefix="results")
    seed(broker_db.db, "j", "t", {0: 0})
    return topic


@contextmanager
def sink_of_j(broker_db: BrokerDb, publish_to: str) -> Iterator[tuple[psycopg.Connection, TransactionalSink]]:
    """A connection to ``broker_db``'s database and job 'j''s sink on it, publishing to ``publish_to``;
    the outbox's producers are closed when it ends, also on a failure."""
    try:
        with connect(broker_db.database_url) as conn:
            yield conn, TransactionalSink(conn, "j", publish_to=publish_to)
    finally:
        close_producers()


def publish_j(broker_db: BrokerDb, conn: psycopg.Connection, retry_failed: bool = False) -> int:
    """Job 'j''s waiting outbox rows published on ``conn`` to ``broker_db``'s broker by a new
    publisher (with ``retry_failed`` the set-aside ones too): how many were sent."""
    publisher = OutboxPublisher(client_config(broker_db.kafka.bootstrap_servers), "j")
    return publisher.publish_pending(conn, retry_failed=retry_failed)


@pytest.mark.spark
def test_a_commit_too_big_for_one_kafka_message_is_published_in_parts_that_reassemble_to_its_results(
    any_counting: Counting,
) -> None:
    topic, results = any_counting.new_topic(1), any_counting.new_topic(1, prefix="results")
    keys = 20_000  # about 2 MB of results: twice Kafka's default maximum message size
    any_counting.send(topic, [(0, b"key-%05d" % i, b"v", None) for i in range(keys)])
    publish_one_batch(any_counting.spark, any_counting.settings("parts", topic, publish_topic=results))
    assert pending_count(any_counting.db, "parts") == 0
    messages = read_topic(any_counting.kafka, results)
    assert len(messages) >= 3
    assert all(message_size(m) <= PUBLISH_MAX_BYTES for m in messages)
    headers = [headers_of(m) for m in messages]
    assert len({h["txstore-commit"] for h in headers}) == 1
    assert sorted(int(h["txstore-part"]) for h in headers) == list(range(1, len(messages) + 1))
    assert {h["txstore-parts"] for h in headers} == {str(len(messages))}
    assert len({m.key() for m in messages}) == len(messages)  # a compacted topic keeps every part
    payloads = [json.loads(m.value() or b"") for m in messages]
    assert {(p["part"], p["parts"]) for p in payloads} == {
        (int(h["txstore-part"]), len(messages)) for h in headers
    }
    reassembled = [r for p in sorted(payloads, key=lambda p: p["part"]) for r in p["results"]]
    assert len(reassembled) == keys + 1
    assert {(r["grain"], r["key"]): (r["delta"], r["total"]) for r in reassembled} == {
        ("topic", None): (keys, keys),
        **{("key", f"key-{i:05d}"): (1, 1) for i in range(keys)},
    }


def test_parts_stay_under_the_limit_and_a_small_commit_stays_one_message(
    database_url: str, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0, 1: 0})
    limit = 4096
    deltas: dict[Any, int] = {TOPIC_TOTAL: 300, **{by_key(f"k{i:03d}"): 1 for i in range(300)}}
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "j", publish_to="out", publish_max_bytes=limit)
        sink.commit(OffsetRange("t", 0, 0, 300), deltas)
        sink.commit(OffsetRange("t", 1, 0, 1), {TOPIC_TOTAL: 1})
    rows = db.execute(
        "SELECT dedup_key, headers, payload, part, parts, "
        "octet_length(payload::text) + octet_length(dedup_key) + octet_length(headers::text) "
        "FROM txn_outbox ORDER BY id"
    ).fetchall()
    big, small = rows[:-1], rows[-1]
    assert len(big) >= 5
    assert [(part, parts) for _, _, _, part, parts, _ in big] == [
        (i, len(big)) for i in range(1, len(big) + 1)
    ]
    assert all(size <= limit - 256 for *_, size in big)  # room left for the per-message headers
    assert len({h["txstore-commit"] for _, h, *_ in big}) == 1
    assert all(
        p["ranges"] == [{"topic": "t", "partition": 0, "from": 0, "until": 300}] for _, _, p, *_ in big
    )
    results = [r for _, _, p, *_ in big for r in p["results"]]
    assert len(results) == 301
    assert {(r["grain"], r["key"]): r["delta"] for r in results} == {
        ("topic", None): 300,
        **{("key", f"k{i:03d}"): 1 for i in range(300)},
    }
    assert (small[3], small[4]) == (1, 1) and small[2]["results"][0]["total"] == 301


def test_a_per_batch_commit_is_split_into_parts_the_same_way(
    database_url: str, db: psycopg.Connection
) -> None:
    seed(db, "b", "t", {0: 0, 1: 0})
    ranges = [OffsetRange("t", 0, 0, 200), OffsetRange("t", 1, 0, 100)]
    with connect(database_url) as conn:
        sink = TransactionalSink(conn, "b", publish_to="out", publish_max_bytes=4096)
        sink.commit_batch(
            ranges, {("t", TOPIC_TOTAL): 300, **{("t", by_key(f"k{i:03d}")): 1 for i in range(300)}}
        )
    rows = db.execute(
        "SELECT dedup_key, headers, payload, part, parts, "
        "octet_length(payload::text) + octet_length(dedup_key) + octet_length(headers::text) "
        "FROM txn_outbox ORDER BY id"
    ).fetchall()
    assert len(rows) >= 5 and all(size <= 4096 - 256 for *_, size in rows)
    commit = rows[0][1]["txstore-commit"]
    assert all(
        h == {"txstore-job": "b", "txstore-commit": commit, "txstore-offsets": "t/0/200,t/1/100"}
        for _, h, *_ in rows
    )
    assert all(re.fullmatch(f"b/batch/[0-9a-f]{{32}}/{commit}/{part}", key) for key, _, _, part, _, _ in rows)
    assert [(p["part"], p["parts"]) for _, _, p, *_ in rows] == [
        (i, len(rows)) for i in range(1, len(rows) + 1)
    ]
    assert sum(len(p["results"]) for _, _, p, *_ in rows) == 301


def test_a_commit_with_no_results_is_still_announced_in_one_message(
    database_url: str, db: psycopg.Connection
) -> None:
    seed(db, "j", "t", {0: 0})
    with connect(database_url) as conn:
        TransactionalSink(conn, "j", publish_to="out").commit(OffsetRange("t", 0, 0, 5), {})
    ((key, payload, part, parts),) = db.execute(
        "SELECT dedup_key, payload, part, parts FROM txn_outbox"
    ).fetchall()
    assert re.fullmatch("j/t/0/5/[0-9a-f]{32}/1", key) and (part, parts) == (1, 1)
    assert (payload["results"], payload["part"], payload["parts"]) == ([], 1, 1)
    assert payload["ranges"] == [{"topic": "t", "partition": 0, "from": 0, "until": 5}]


def test_delivery_errors_retrying_cannot_fix_are_told_apart_from_passing_ones() -> None:
    for code in (
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_RECORD,
        KafkaError.POLICY_VIOLATION,
    ):
        assert set_aside_reason(code), KafkaError(code).name()
    for code in (
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._QUEUE_FULL,
        KafkaError._FATAL,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,  # the producer as a whole, not one row
    ):
        assert set_aside_reason(code) is None, KafkaError(code).name()
    assert "too large" in (set_aside_reason(KafkaError.MSG_SIZE_TOO_LARGE) or "")
    assert "not authorized" in (set_aside_reason(KafkaError.TOPIC_AUTHORIZATION_FAILED) or "")
    assert "does not exist" in (set_aside_reason(KafkaError._UNKNOWN_TOPIC) or "")


@pytest.mark.slow
def test_a_row_too_large_for_kafka_is_set_aside_while_later_rows_are_sent_and_retry_failed_sends_it(
    broker_db: BrokerDb, results: str, caplog: pytest.LogCaptureFixture
) -> None:
    with sink_of_j(broker_db, results) as (_, sink):
        sink.commit(OffsetRange("t", 0, 0, 1), {TOPIC_TOTAL: 1})
        sink.commit(
            OffsetRange("t", 0, 1, 101), {TOPIC_TOTAL: 100, **{by_key(f"k{i}"): 1 for i in range(100)}}
        )
        sink.commit(OffsetRange("t", 0, 101, 102), {TOPIC_TOTAL: 1})
    # A producer whose maximum message size is below the second commit's message.
    small = {**client_config(broker_db.kafka.bootstrap_servers), "message.max.bytes": 4000}
    try:
        with connect(broker_db.database_url) as conn, caplog.at_level(logging.WARNING, logger="txstore"):
            assert OutboxPublisher(small, "j").publish_pending(conn) == 2
    finally:
        close_producers()
    rows = outbox_rows(broker_db.db, "j")
    assert [(sent, failed) for _, sent, failed, _ in rows] == [(True, False), (False, True), (True, False)]
    assert "too large" in rows[1][3] and "MSG_SIZE_TOO_LARGE" in rows[1][3]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert all(
        part in warnings[0]
        for part in (
            "job 'j'",
            repr(results),
            f"outbox id {rows[1][0]}",
            "txstore publish --job j --retry-failed",
        )
    )
    assert untils(broker_db.kafka, results) == [1, 102]
    assert pending_count(broker_db.db, "j") == 0

    status = txstore("status", "--job", "j", url=broker_db.database_url)
    assert status.returncode == 0, status.stderr
    outbox_table = status.stdout.split("\n\n")[1].splitlines()
    assert [line.split() for line in outbox_table] == [
        ["JOB", "OUTBOX-PENDING", "OUTBOX-SET-ASIDE"],
        ["j", "0", "1"],
    ]
    assert "txstore publish --job j --retry-failed" in status.stderr
    as_json = json.loads(txstore("status", "--job", "j", "--json", url=broker_db.database_url).stdout)
    assert {(r["outbox_pending"], r["outbox_set_aside"]) for r in as_json} == {(0, 1)}

    # Without the small limit (the cause is gone) the set-aside row is sent.
    retried = broker_db.txstore("publish", "--job", "j", "--retry-failed")
    assert retried.returncode == 0, retried.stderr
    assert "published 1 results of job 'j'; 0 waiting, 0 set aside" in retried.stdout
    assert [(sent, failed, reason) for _, sent, failed, reason in outbox_rows(broker_db.db, "j")] == [
        (True, False, None)
    ] * 3
    assert untils(broker_db.kafka, results) == [1, 102, 101]


def test_rows_the_broker_refuses_as_not_authorized_are_set_aside_and_later_rows_flow(
    broker_db: BrokerDb, results: str
) -> None:
    try:
        with sink_of_j(broker_db, results) as (conn, sink):
            sink.commit(OffsetRange("t", 0, 0, 1), {TOPIC_TOTAL: 1})
            broker_db.kafka.push_request_errors(PRODUCE_API, TOPIC_AUTHORIZATION_FAILED)
            assert publish_j(broker_db, conn) == 0
            assert [(s, f) for _, s, f, _ in outbox_rows(broker_db.db, "j")] == [(False, True)]
            assert "not authorized" in outbox_rows(broker_db.db, "j")[0][3]
            # The cause is gone: new rows flow, the set-aside one waits for --retry-failed.
            sink.commit(OffsetRange("t", 0, 1, 2), {TOPIC_TOTAL: 1})
            assert publish_j(broker_db, conn) == 1
            assert [(s, f) for _, s, f, _ in outbox_rows(broker_db.db, "j")] == [(False, True), (True, False)]
            assert publish_j(broker_db, conn, retry_failed=True) == 1
        assert [(s, f) for _, s, f, _ in outbox_rows(broker_db.db, "j")] == [(True, False), (True, False)]
        assert untils(broker_db.kafka, results) == [2, 1]
    finally:
        broker_db.kafka.clear_request_errors(PRODUCE_API)


@pytest.mark.slow
def test_rows_for_a_topic_that_does_not_exist_are_set_aside_and_sent_once_it_does(
    broker_db: BrokerDb, results: str
) -> None:
    missing = f"{results}-missing"
    # A cluster that does not create topics on first use (the mock does unless told not to).
    conf = {**client_config(broker_db.kafka.bootstrap_servers), "allow.auto.create.topics": "false"}
    with sink_of_j(broker_db, missing) as (conn, sink):
        sink.commit(OffsetRange("t", 0, 0, 1), {TOPIC_TOTAL: 1})
        sink.commit(OffsetRange("t", 0, 1, 2), {TOPIC_TOTAL: 1})
        assert OutboxPublisher(conf, "j", timeout=4.0).publish_pending(conn) == 0
        rows = outbox_rows(broker_db.db, "j")
        assert [(s, f) for _, s, f, _ in rows] == [(False, True)] * 2
        assert all("does not exist" in reason for *_, reason in rows)
        broker_db.kafka.create_topic(missing, 1)
        assert OutboxPublisher(conf, "j", timeout=4.0).publish_pending(conn, retry_failed=True) == 2
    assert untils(broker_db.kafka, missing) == [1, 2]


def test_a_publisher_holds_a_bounded_amount_of_payload_at_a_time(
    broker_db: BrokerDb, results: str, caplog: pytest.LogCaptureFixture
) -> None:
    with sink_of_j(broker_db, results) as (conn, sink):
        for i in range(120):
            sink.commit(OffsetRange("t", 0, i, i + 1), {TOPIC_TOTAL: 1})
        publisher = OutboxPublisher(client_config(broker_db.kafka.bootstrap_servers), "j", chunk_bytes=1)
        with caplog.at_level(logging.INFO, logger="txstore"):
            assert publisher.publish_pending(conn) == 120
    chunks = [r.getMessage() for r in caplog.records if "results to Kafka" in r.getMessage()]
    assert chunks == [f"job j: published {n} results to Kafka" for n in (50, 50, 20)]
    assert pending_count(broker_db.db, "j") == 0 and len(read_topic(broker_db.kafka, results)) == 120


@pytest.mark.spark
def test_results_committed_by_a_batch_that_then_failed_are_published_by_the_next_idle_batch(
    counting: Counting,
) -> None:
    topic, results = counting.new_topic(3), counting.new_topic(1, prefix="results")
    s = counting.settings("idle", topic, publish_topic=results)
    counting.send(topic, [(p, b"k", b"v", None) for p in (0, 1, 2) for _ in range(10)])
    try:
        with TransactionalJob(counting.spark, s, CountMessages()) as job:
            job.run_batch()
            assert pending_count(counting.db, "idle") == 0
            counting.send(topic, [(p, b"k", b"v", None) for p in (0, 1, 2) for _ in range(10)])
            ranges = job.plan()
            # Before the tasks run, another instance counts partition 2 further than this plan.
            counting.send(topic, [(2, b"k", b"v", None)] * 5)
            with connect(counting.database_url) as conn:
                TransactionalSink(conn, "idle").commit(OffsetRange(topic, 2, 10, 25), {TOPIC_TOTAL: 15})
            with pytest.raises(BatchFailed, match="overlap"):
                job.execute(ranges)  # partitions 0 and 1 committed, partition 2 refused
            assert pending_count(counting.db, "idle") >= 1
            assert job.run_batch().ranges == ()  # nothing new to count: an idle batch
            assert pending_count(counting.db, "idle") == 0
    finally:
        close_producers()
    until = sorted(
        (r["partition"], r["until"])
        for m in read_topic(counting.kafka, results)
        for r in json.loads(m.value() or b"")["ranges"]
    )
    assert until == [(0, 10), (0, 20), (1, 10), (1, 20), (2, 10)]


def test_a_recount_after_a_reset_is_published_under_a_new_identity_and_a_redelivery_under_the_same(
    broker_db: BrokerDb, results: str
) -> None:
    with sink_of_j(broker_db, results) as (conn, sink):
        sink.commit(OffsetRange("t", 0, 0, 10), {TOPIC_TOTAL: 10})
        broker_db.db.execute(
            "UPDATE txn_offsets SET off = 0 WHERE job = 'j'"
        )  # what `txstore reset --execute` does
        sink.commit(OffsetRange("t", 0, 0, 10), {TOPIC_TOTAL: 10})
        publish_j(broker_db, conn)
        first = read_topic(broker_db.kafka, results)
        broker_db.db.execute(
            "UPDATE txn_outbox SET sent_at = NULL WHERE id = (SELECT min(id) FROM txn_outbox)"
        )
        publish_j(broker_db, conn)  # a redelivery of the first commit
    messages = read_topic(broker_db.kafka, results)
    keys = [(m.key() or b"").decode() for m in messages]
    assert len(messages) == 3 and len(first) == 2
    assert keys[0] != keys[1] and all(k.startswith("j/t/0/10/") for k in keys)
    assert keys[2] == keys[0]
    commits = [headers_of(m)["txstore-commit"] for m in messages]
    assert commits[0] != commits[1] and commits[2] == commits[0]
    assert [json.loads(m.value() or b"")["results"][0]["total"] for m in messages] == [10, 20, 10]
