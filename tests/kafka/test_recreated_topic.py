"""A deleted and recreated topic: detected before anything is counted, and reset into a new generation.

Against real Spark, PostgreSQL and the mock broker (which deletes and
recreates topics, but has no topic IDs: those are tested on Tansu).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.conftest import produce_in_transactions, send, send_one_by_one
from tests.helpers.counting import Counting, totals
from tests.helpers.recreated import NEW_TS, OLD_TS, fill, mismatch_line, snapshot, topic_id_changed_line
from tests.spark.source.test_datasource import read as read_frame
from txstore import register
from txstore.core.errors import BatchFailed, TopicRecreated, UnknownTopic
from txstore.core.fingerprint import Fingerprint, digest
from txstore.core.ranges import OffsetRange, PartitionHistory
from txstore.core.starting import StartDecision
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader
from txstore.kafka.topic_ids import TopicIds, fetch_topic_ids
from txstore.ops.reset import apply_reset, plan_job_reset
from txstore.ops.reset_plan import ResetTarget
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.idempotent import IdempotentSink
from txstore.postgres.sink import TransactionalSink
from txstore.spark.ranges.tasks import spark_failure_reason
from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import RealKafkaCluster

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    "settings",
    [{}, {"commit": "per-batch"}, {"commit": "per-batch", "min_partitions": 4}],
    ids=["per-range", "per-batch", "per-batch-pieces"],
)
def test_a_recreated_topic_refilled_past_the_stored_offset_stops_the_job_and_counts_nothing(
    counting: Counting, settings: dict[str, Any]
) -> None:
    topic = counting.new_topic(2)
    fill(counting.kafka, topic, 5, 2, b"old", OLD_TS)
    counting.job(topic, **settings).run_batch()
    assert counting.totals(topic) == {topic: 10}
    last = counting.db.execute(
        "SELECT part, last_off, last_timestamp, last_digest FROM txn_offsets ORDER BY part"
    )
    assert last.fetchall() == [
        (p, 4, OLD_TS + 4, digest(b"k", b"old-%d-4" % p)) for p in range(2)
    ]  # the last piece's last message, also when a range is read in pieces
    counting.kafka.recreate_topic(topic, 2)
    fill(counting.kafka, topic, 8, 2, b"new", NEW_TS)
    before = snapshot(counting.db)
    with pytest.raises(BatchFailed) as raised:
        counting.job(topic, **settings).run()
    assert str(raised.value) == mismatch_line("count_topic", topic, 0, 4)
    assert not raised.value.transient
    assert snapshot(counting.db) == before


def test_a_range_that_delivered_no_message_keeps_the_last_counted_message(database_url: str) -> None:
    """Transaction markers or aborted messages only: the range moves the offset, the fingerprint stays."""
    kept = Fingerprint(4, OLD_TS + 4, digest(b"k", b"old"))
    with connect(database_url) as conn:
        store.create_start_rows(conn, "j", [StartDecision("t", p, 0, "test") for p in range(2)])
        sink = TransactionalSink(conn, "j")
        sink.commit_batch([OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 5)], {}, last={("t", 0): kept})
        sink.commit_batch([OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 5, 7)], {}, last={("t", 1): kept})
        messages = IdempotentSink(conn, "j")
        messages.store(OffsetRange("t", 0, 9, 12), [[], []])
        _, history = store.committed_state(conn, "j", ["t"])
    assert history == {("t", 0): PartitionHistory(last=kept), ("t", 1): PartitionHistory(last=kept)}


def test_a_last_counted_message_no_longer_in_the_log_is_not_an_error(counting: Counting) -> None:
    """Compaction removes a message: the offset then holds nothing, and reading from it delivers a
    later offset first. Here the stored last message points at a transaction marker, which the reader
    sees exactly like a compacted-away message: nothing to compare, the range is counted."""
    topic = counting.new_topic(1)
    produce_in_transactions(
        counting.kafka.bootstrap_servers, topic, transactions=3, per_transaction=2, partitions=1
    )
    counting.job(topic).run_batch()  # offsets 0-8: 6 messages, 3 markers
    assert counting.totals(topic) == {topic: 6}
    assert counting.db.execute("SELECT off, last_off FROM txn_offsets").fetchone() == (9, 7)
    counting.db.execute(
        "UPDATE txn_offsets SET last_off = 8, last_digest = 'gone'"
    )  # offset 8: the last marker
    produce_in_transactions(
        counting.kafka.bootstrap_servers, topic, transactions=2, per_transaction=2, partitions=1
    )
    report = counting.job(topic).run_batch()
    assert report.messages == 4
    assert counting.totals(topic) == {topic: 10}
    assert counting.db.execute("SELECT off, last_off FROM txn_offsets").fetchone() == (15, 13)


def test_a_last_counted_message_that_aged_out_is_not_an_error(counting: Counting) -> None:
    """Retention dropped the last message counted (and more): skipped with --fail-on-data-loss false,
    the rest is counted; the old fingerprint, now below the log start, is not looked for."""
    topic = counting.new_topic(1)
    send(counting.kafka.bootstrap_servers, topic, ((0, b"k", b"x" * 100_000, None) for _ in range(3)))
    counting.job(topic).run_batch()
    send(counting.kafka.bootstrap_servers, topic, ((0, b"k", b"y" * 100_000, None) for _ in range(80)))
    counting.job(topic, fail_on_data_loss=False).run_batch()
    lost_from, low = counting.db.execute("SELECT from_off, until_off FROM txn_lost_ranges").fetchone()
    assert lost_from == 3
    assert counting.totals(topic) == {topic: 3 + (83 - low)}
    assert counting.offsets(topic) == {0: 83}


def idempotent_job(counting: Counting, topic: str) -> TransactionalJob:
    """Job 'store': ``topic``'s messages kept by the idempotent sink."""
    return TransactionalJob(counting.spark, counting.settings("store", topic, sink="idempotent"))


def reset(counting: Counting, job: str, topic: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``txstore reset --job JOB --topic TOPIC FLAGS...`` on ``counting``'s database and broker."""
    return counting.txstore("reset", "--job", job, "--topic", topic, *flags)


def stored_generations(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    """Job 'store's messages as (generation, offset, value), in that order."""
    return db.execute("SELECT generation, off, value FROM txn_messages ORDER BY generation, off").fetchall()


def test_the_suggested_reset_starts_a_new_generation_and_the_new_topic_is_stored_apart(
    counting: Counting,
) -> None:
    topic = counting.new_topic(1)
    fill(counting.kafka, topic, 5, 1, b"old", OLD_TS)
    idempotent_job(counting, topic).run()
    counting.kafka.recreate_topic(topic, 1)
    fill(counting.kafka, topic, 8, 1, b"new", NEW_TS)
    with pytest.raises(BatchFailed) as raised:
        idempotent_job(counting, topic).run()
    assert str(raised.value) == mismatch_line("store", topic, 0, 4)
    assert counting.db.execute("SELECT count(*) FROM txn_messages").fetchone() == (5,)

    command = str(raised.value).split(": ")[-1].split()
    assert command[:2] == ["txstore", "reset"]
    dry = counting.txstore(*[a for a in command[1:] if a != "--execute"])
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[1] == (
        f"  {topic}/0: 5 -> 0, new generation 1 (the message at offset 4 is not the one last counted); "
        "the new log is counted from there, results so far are kept"
    )
    applied = counting.txstore(*command[1:])
    assert applied.returncode == 0, applied.stderr
    assert counting.db.execute(
        "SELECT off, generation, last_off, last_timestamp, last_digest, topic_id FROM txn_offsets"
    ).fetchone() == (0, 1, None, None, None, None)

    idempotent_job(counting, topic).run()
    stored = stored_generations(counting.db)
    assert stored == [(0, i, b"old-0-%d" % i) for i in range(5)] + [(1, i, b"new-0-%d" % i) for i in range(8)]
    status = counting.txstore("status", "--json")
    assert [(r["offset"], r["generation"]) for r in json.loads(status.stdout)] == [(8, 1)]


def test_reset_starts_a_new_generation_for_an_offset_beyond_the_log_end_or_when_told(
    counting: Counting,
) -> None:
    topic = counting.new_topic(2)
    fill(counting.kafka, topic, 5, 2, b"old", OLD_TS)
    counting.job(topic).run()
    counting.kafka.recreate_topic(topic, 2)
    fill(counting.kafka, topic, 3, 2, b"new", NEW_TS)
    result = reset(counting, "count_topic", topic, "--to-earliest")
    assert result.stdout.splitlines()[1:3] == [
        f"  {topic}/{p}: 5 -> 0, new generation 1 (stored offset 5 is beyond the log end 3); "
        "the new log is counted from there, results so far are kept"
        for p in range(2)
    ]
    result = reset(
        counting, "count_topic", topic, "--to-latest", "--new-generation", "--partition", "0", "--execute"
    )
    assert result.returncode == 0, result.stderr
    assert counting.db.execute("SELECT part, off, generation FROM txn_offsets ORDER BY part").fetchall() == [
        (0, 3, 1),
        (1, 5, 0),
    ]


def admin_topic(bootstrap: str, topic: str, create: bool) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, 1, 1)]) if create else admin.delete_topics([topic])
    for future in futures.values():
        future.result(10)


def test_a_recreated_topic_is_known_by_its_topic_id_even_with_the_same_messages(
    spark: Any, tansu: str, database_url: str, db: psycopg.Connection
) -> None:
    """On Tansu (topic IDs): the new topic holds byte-identical messages, so only the ID tells."""
    topic = "ids"
    same = [(0, b"k", b"same-%d" % i, OLD_TS + i) for i in range(3)]
    admin_topic(tansu, topic, create=True)
    send_one_by_one(tansu, topic, same)
    settings = JobSettings("count_topic", (topic,), tansu, database_url)
    TransactionalJob(spark, settings, count_messages).run()
    old_id = fetch_topic_ids(client_config(tansu), [topic])[topic]
    assert db.execute("SELECT off, last_off, topic_id FROM txn_offsets").fetchone() == (3, 2, old_id)

    admin_topic(tansu, topic, create=False)
    admin_topic(tansu, topic, create=True)
    send_one_by_one(tansu, topic, [*same, *same])
    new_id = fetch_topic_ids(client_config(tansu), [topic])[topic]
    assert new_id != old_id
    before = snapshot(db)
    with pytest.raises(TopicRecreated) as raised:
        TransactionalJob(spark, settings, count_messages).run()
    assert str(raised.value) == topic_id_changed_line(topic, old_id, new_id)
    assert snapshot(db) == before

    with connect(database_url) as conn:
        moves = plan_job_reset(conn, client_config(tansu), "count_topic", topic, [0], ResetTarget("earliest"))
        assert [m.describe() for m in moves] == [
            f"{topic}/0: 3 -> 0, new generation 1 (topic ID {old_id} is now {new_id}); "
            "the new log is counted from there, results so far are kept"
        ]
        apply_reset(conn, "count_topic", moves)
    TransactionalJob(spark, settings, count_messages).run()
    assert totals(db, topic) == {topic: 9}
    assert db.execute("SELECT off, generation, topic_id FROM txn_offsets").fetchone() == (6, 1, new_id)


def test_a_dataframe_aggregate_also_stops_at_a_recreated_topic(counting: Counting) -> None:
    """DataFrame aggregates verify the last message recorded by an earlier (plain Python) run."""
    from pyspark.sql import functions as F

    topic = counting.new_topic(1)
    fill(counting.kafka, topic, 5, 1, b"old", OLD_TS)
    counting.job(topic).run()
    counting.kafka.recreate_topic(topic, 1)
    fill(counting.kafka, topic, 8, 1, b"new", NEW_TS)
    before = snapshot(counting.db)
    settings = counting.settings("count_topic", topic)

    def total(frame: Any) -> Any:
        return frame.groupBy("topic").agg(F.count("*").alias("metric"))

    with pytest.raises(BatchFailed) as raised:
        TransactionalJob(counting.spark, settings, dataframe_aggregate=total).run()
    assert str(raised.value) == (
        f"job 'count_topic' batch 1 failed: TopicRecreated: {mismatch_line('count_topic', topic, 0, 4)}"
    )
    assert not raised.value.transient
    assert snapshot(counting.db) == before


def read(kafka: MockKafkaCluster, r: OffsetRange, job: str = "j") -> tuple[list[int], Fingerprint | None]:
    reader = RangeReader(client_config(kafka.bootstrap_servers), r, job=job)
    got = [m.offset() for batch in reader for m in batch]
    assert reader.messages == len(got)
    return got, reader.last


def test_a_verified_range_delivers_exactly_from_to_until_and_its_last_message(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce_in_transactions(kafka.bootstrap_servers, topic, transactions=4, per_transaction=2, partitions=1)
    # offsets 0,1 (2 marker) 3,4 (5) 6,7 (8) 9,10 (11): the last counted before 6 is 4, two offsets back
    got, last_counted = read(kafka, OffsetRange(topic, 0, 0, 5))
    assert got == [0, 1, 3, 4]
    assert last_counted is not None and last_counted.offset == 4
    got, last = read(kafka, OffsetRange(topic, 0, 6, 12, verify=last_counted))
    assert got == [6, 7, 9, 10]
    assert last is not None and last.offset == 10 and last.digest == digest(None, b"x")
    with pytest.raises(
        TopicRecreated, match=r"partition 0: the topic was deleted and recreated \(stored last"
    ):
        read(kafka, OffsetRange(topic, 0, 6, 12, verify=Fingerprint(4, last_counted.timestamp, "other")))


def test_a_message_to_verify_that_aged_out_after_planning_is_not_an_error(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """Planned while the last counted message was in the log; retention dropped it before the read."""
    topic = new_topic(1)
    send(kafka.bootstrap_servers, topic, ((0, b"k", b"x" * 100_000, None) for _ in range(80)))
    marks = fetch_watermarks(client_config(kafka.bootstrap_servers), [topic])[0]
    assert marks.low > 2
    gone = Fingerprint(marks.low - 2, 1, "aged out")
    got, _ = read(kafka, OffsetRange(topic, 0, marks.low, marks.high, verify=gone))
    assert got == list(range(marks.low, marks.high))


def test_a_broker_without_topic_ids_is_asked_once_and_answers_at_once(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    ids = TopicIds()
    started = time.monotonic()
    assert ids(client_config(kafka.bootstrap_servers), [topic]) == {}
    assert time.monotonic() - started < 2  # the mock names no controller: no DescribeTopics wait
    kafka.set_broker_down(1)
    try:
        started = time.monotonic()
        assert ids(client_config(kafka.bootstrap_servers), [topic]) == {}  # not asked again
        assert time.monotonic() - started < 0.1
    finally:
        kafka.set_broker_up(1)


def test_a_counted_topic_deleted_and_not_yet_created_again_stops_the_job_saying_so_and_what_to_run(
    counting: Counting,
) -> None:
    """A recreation's gap (deleted, not created yet; a real broker's, chaos seed 6101): the job that
    counted the topic is told it does not exist now and may be being recreated, and what to run,
    not to check a --topic it has been counting all along."""
    topic = counting.new_topic(2)
    fill(counting.kafka, topic, 3, 2, b"old", OLD_TS)
    counting.job(topic).run()
    before = snapshot(counting.db)
    counting.kafka.delete_topic(topic)
    with pytest.raises(UnknownTopic) as raised:
        counting.job(topic).run()
    assert str(raised.value) == (
        f"job 'count_topic' topic {topic!r} does not exist on Kafka at {counting.kafka.bootstrap_servers} now, "
        "though the job stored offsets for 2 of its partitions: it may be being deleted and recreated. "
        "Run the job again once the topic exists (a recreated topic then stops it in one line naming "
        "the reset to run); if it was deleted for good, forget its offsets: "
        f"txstore reset --job count_topic --topic {topic} --forget --execute"
    )
    assert snapshot(counting.db) == before


@pytest.mark.parametrize("recreated_by", ["the job", "a reset"])
def test_a_forgotten_partition_that_returns_starts_a_new_generation_and_collides_with_nothing(
    counting: Counting, recreated_by: str
) -> None:
    """``--forget`` drops the offset row, not the stored messages: a partition that comes back (the
    topic recreated) is a new log, so its row starts above every generation still stored. Otherwise
    the new log's first offsets would collide with the old messages and be dropped while the offset
    moves on."""
    topic = counting.new_topic(1)
    fill(counting.kafka, topic, 5, 1, b"old", OLD_TS)
    idempotent_job(counting, topic).run()
    counting.kafka.delete_topic(topic)
    forgot = reset(counting, "store", topic, "--forget", "--execute")
    assert forgot.returncode == 0, forgot.stderr
    counting.kafka.create_topic(topic, 1)
    fill(counting.kafka, topic, 8, 1, b"new", NEW_TS)
    if recreated_by == "a reset":
        again = reset(counting, "store", topic, "--to-earliest", "--execute")
        assert again.returncode == 0, again.stderr
        assert counting.db.execute("SELECT off, generation FROM txn_offsets").fetchall() == [(0, 1)]

    idempotent_job(counting, topic).run()
    stored = stored_generations(counting.db)
    assert stored == [(0, i, b"old-0-%d" % i) for i in range(5)] + [(1, i, b"new-0-%d" % i) for i in range(8)]
    assert counting.db.execute("SELECT off, generation FROM txn_offsets").fetchall() == [(8, 1)]


@pytest.mark.parametrize("verified", [False, True], ids=["first-range", "verified-range"])
def test_a_topic_recreated_while_its_range_is_read_is_caught_before_anything_is_counted(
    kafka: MockKafkaCluster, new_topic: Callable[..., str], verified: bool
) -> None:
    """Found by the long chaos run (seed 4017): the check before the read passed on the old log,
    the topic was deleted and recreated mid-read, and the consumer went on at the next offset in
    the new log, so one range held both logs' messages. The message the read started from is
    compared again once the range is read: the new log holds another message there."""
    topic = new_topic(1)
    send_one_by_one(
        kafka.bootstrap_servers, topic, ((0, b"k", b"old-0-%d" % i, OLD_TS + i) for i in range(12))
    )
    start = 4 if verified else 0
    verify = None
    if verified:
        _, verify = read(kafka, OffsetRange(topic, 0, 0, start))
    # Fetch one message set at a time, so most of the range is fetched after the recreation.
    conf = client_config(
        kafka.bootstrap_servers, {"queued.min.messages": "1", "max.partition.fetch.bytes": "1"}
    )
    reader = RangeReader(conf, OffsetRange(topic, 0, start, 12, verify=verify), batch_size=1, job="j")
    delivered = []
    with pytest.raises(TopicRecreated) as raised:
        for batch in reader:
            delivered += [m.value() for m in batch]
            if len(delivered) == 1:
                kafka.recreate_topic(topic, 1)
                send_one_by_one(
                    kafka.bootstrap_servers,
                    topic,
                    ((0, b"k", b"new-0-%d" % i, NEW_TS + i) for i in range(20)),
                )
    assert delivered[0] == b"old-0-%d" % start
    assert any(v.startswith(b"new-") for v in delivered)  # the mixed read really happened
    anchor = start - 1 if verified else start
    assert str(raised.value).startswith(
        f"job 'j' topic '{topic}' partition 0: the topic was deleted and recreated while offsets "
        f"{start} -> 12 were read ("
    )
    assert f"found offset {anchor}, timestamp {NEW_TS + anchor}, " in str(raised.value)
    assert str(raised.value).endswith(
        f"txstore reset --job j --topic {topic} --partition 0 --to-earliest --new-generation --execute"
    )


@pytest.mark.parametrize("verified", [False, True], ids=["first-range", "verified-range"])
def test_a_range_planned_on_the_old_log_that_the_new_one_ends_below_is_a_recreation_not_data_loss(
    kafka: MockKafkaCluster, new_topic: Callable[..., str], verified: bool
) -> None:
    """Found by a chaos trial on Spark Connect (seed 132): planned on the old log, read after a
    recreation refilled below the planned offsets. Kafka answers 'out of range' as for messages
    that aged out, but the log now ends below the offset: it is another log, not data loss."""
    topic = new_topic(1)
    fill(kafka, topic, 10, 1, b"old", OLD_TS)
    _, verify = read(kafka, OffsetRange(topic, 0, 0, 5))
    kafka.recreate_topic(topic, 1)
    fill(kafka, topic, 3, 1, b"new", NEW_TS)
    planned = OffsetRange(topic, 0, 5, 10, verify=verify if verified else None)
    with pytest.raises(TopicRecreated) as raised:
        read(kafka, planned)
    assert str(raised.value) == (
        f"job 'j' topic '{topic}' partition 0: the log now ends at offset 3, below offset 5 that "
        "the range 5 -> 10 was planned to read: the topic was deleted and recreated (or an unclean "
        "leader election); nothing was counted. To count the new topic from its start as a new "
        f"generation: txstore reset --job j --topic {topic} --partition 0 --to-earliest --new-generation --execute"
    )


@pytest.mark.parametrize("mode", ["dataframe", "results-table"])
def test_dataframe_and_results_table_jobs_record_their_last_message_and_stop_at_a_recreated_topic(
    counting: Counting, mode: str
) -> None:
    """Modes where Spark, not txstore, reads the messages used to store no fingerprint, so a job
    that only ever ran them counted a recreated topic refilled past its offsets as the old one.
    The driver now reads each range's last message before the Spark job; the readers must end on
    it and the commit stores it."""
    from pyspark.sql import functions as F

    from tests.postgres.results.test_results_table import SALES, sales_table
    from txstore.aggregate import SqlAggregate

    topic = counting.new_topic(1)
    fill(counting.kafka, topic, 5, 1, b"old", OLD_TS)
    settings = counting.settings("frames", topic)

    def total(frame: Any) -> Any:
        return frame.groupBy("topic").agg(F.count("*").alias("metric"))

    def job() -> TransactionalJob:
        if mode == "dataframe":
            return TransactionalJob(counting.spark, settings, dataframe_aggregate=total)
        query = (
            "SELECT 'all' AS country, CAST(count(*) AS DECIMAL(18, 2)) AS revenue, count(*) AS orders, "
            "CAST(NULL AS DECIMAL(12, 2)) AS smallest, CAST(NULL AS DECIMAL(12, 2)) AS largest, "
            "min(timestamp) AS first_seen, max(timestamp) AS last_seen FROM batch"
        )
        return TransactionalJob(
            counting.spark, settings, dataframe_aggregate=SqlAggregate(query), results_table=sales_table()
        )

    if mode == "results-table":
        counting.db.execute(SALES.format(name="sales"))
    job().run()
    assert counting.db.execute("SELECT off, last_off, last_timestamp FROM txn_offsets").fetchall() == [
        (5, 4, OLD_TS + 4)
    ]
    counting.kafka.recreate_topic(topic, 1)
    fill(counting.kafka, topic, 8, 1, b"new", NEW_TS)
    with pytest.raises(BatchFailed) as raised:
        job().run()
    assert f"TopicRecreated: {mismatch_line('frames', topic, 0, 4)}" in str(raised.value)
    assert counting.db.execute("SELECT off FROM txn_offsets").fetchall() == [(5,)]


def test_a_txstore_job_read_of_a_recreated_topic_refuses_like_the_job_never_reads_the_new_log(
    any_counting: Counting,
) -> None:
    """``spark.read.format("txstore").option("txstore.job", J)`` previews J's next batch: on a topic
    deleted and recreated, refilled past J's offsets, it read the new log from the old offsets
    (J's own next batch stops). On Apache Kafka the new log holds byte-identical messages, so only
    the topic ID tells; on the mock cluster (no topic IDs) the last counted message does."""
    kafka = any_counting.kafka
    real = isinstance(kafka, RealKafkaCluster)
    register(any_counting.spark)
    topic = any_counting.new_topic(2)
    fill(kafka, topic, 5, 2, b"old", OLD_TS)
    any_counting.job(topic).run()
    assert any_counting.totals(topic) == {topic: 10}
    kafka.recreate_topic(topic, 2)
    fill(kafka, topic, 8, 2, b"old" if real else b"new", OLD_TS if real else NEW_TS)
    before = snapshot(any_counting.db)
    frame = read_frame(
        any_counting.spark,
        topic,
        kafka,
        **{"txstore.job": "count_topic", "txstore.databaseUrl": any_counting.database_url},
    )
    with pytest.raises(Exception) as caught:
        frame.collect()
    reason = spark_failure_reason(caught.value)
    advice = f"txstore reset --job count_topic --topic {topic} --partition 0 --to-earliest --execute"
    if real:
        ids = fetch_topic_ids(client_config(kafka.bootstrap_servers), [topic])
        assert (
            f"job 'count_topic' topic '{topic}' partition 0: the topic was deleted and recreated " in reason
        )
        assert f"; found topic ID {ids[topic]}); nothing was counted." in reason
        assert reason.endswith(advice)
    else:
        # Each partition's task meets its own recreated log; which one Spark stops the read on
        # first (local[2,4]: two at once, each tried up to four times) is Spark's scheduling.
        lines = [mismatch_line("count_topic", topic, p, 4) for p in (0, 1)]
        assert any(reason.endswith(line) for line in lines), reason
    assert snapshot(any_counting.db) == before
