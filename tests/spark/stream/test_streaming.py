"""readStream/writeStream.format("txstore") on real Spark, real PostgreSQL and the mock broker.

Each checkpoint accident is made on a real query: stopped (or its batch
killed) and restarted, with the checkpoint kept, deleted, or replaced by an
older copy.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

import txstore
from tests.conftest import produce_in_transactions, send
from tests.helpers.cli import txstore as txstore_cli
from tests.helpers.counting import BrokerDb, Counting, offsets
from tests.helpers.streams import CLASSIC_AND_CONNECT, JOB, QueryFailed, run_available_now, sink
from txstore.spark.stream.stream_checkpoint import check_alignment, check_batch_ends
from txstore.spark.stream.stream_offsets import batch_ranges, offsets_dict, offsets_map
from txstore.spark.stream.stream_sink import RowsOutsideBatch, check_rows_in_batch

pytestmark = pytest.mark.spark

ADMISSION_CONTROL = importlib.util.find_spec("pyspark.sql.streaming.datasource") is not None
"""PySpark 4.2+: latestOffset(start, limit), ReadMaxRows, SupportsTriggerAvailableNow."""


# -- pure ----------------------------------------------------------------------------------------


def test_batch_ranges_come_from_start_and_end_and_a_new_partition_enters_empty() -> None:
    start = offsets_map({"t": {"0": 5, "1": 7}})
    end = offsets_map({"t": {"0": 9, "1": 7, "2": 3}})
    ranges = batch_ranges(start, end)
    assert [(r.partition, r.from_offset, r.until_offset) for r in ranges] == [(0, 5, 9), (1, 7, 7), (2, 3, 3)]
    assert offsets_dict(end) == {"t": {"0": 9, "1": 7, "2": 3}}


def test_alignment_commit_replay_or_one_line_mismatch() -> None:
    ranges = batch_ranges(offsets_map({"t": {"0": 5, "1": 7}}), offsets_map({"t": {"0": 9, "1": 8}}))
    assert check_alignment("j", ranges, {("t", 0): 5, ("t", 1): 7}) is True
    assert check_alignment("j", ranges, {("t", 0): 9, ("t", 1): 8}) is False
    with pytest.raises(txstore.TxstoreError) as e:
        check_alignment("j", ranges, {("t", 0): 12, ("t", 1): 7})
    line = str(e.value)
    assert "\n" not in line
    for part in ("'j'", "'t'", "partition 0", "offset 12", "at 5", "checkpointLocation"):
        assert part in line


def test_a_micro_batch_ending_a_partition_before_its_start_is_refused_in_one_line() -> None:
    start, end = {("t", 0): 8, ("t", 1): 2}, {("t", 0): 5, ("t", 1): 2}
    check_batch_ends("j", {("t", 0): 5}, end, {("t", 0): 5})  # in order: nothing to say
    with pytest.raises(txstore.TxstoreError) as behind:  # a replayed batch 0 the job went past
        check_batch_ends("j", start, end, {("t", 0): 8, ("t", 1): 2})
    line = str(behind.value)
    assert "\n" not in line and "checkpointLocation" in line
    assert (
        "'t' partition 0: txn_offsets stores offset 8 but the checkpoint ends this micro-batch at 5" in line
    )
    with pytest.raises(txstore.TxstoreError) as edited:  # not the stored offsets: a damaged checkpoint
        check_batch_ends("j", start, end, {("t", 0): 3})
    assert "starts this micro-batch at offset 8 and ends it at 5" in str(edited.value)


def test_rows_of_messages_outside_the_micro_batch_are_refused_in_one_line() -> None:
    ranges = batch_ranges(offsets_map({"t": {"0": 5, "1": 7}}), offsets_map({"t": {"0": 9, "1": 8}}))
    check_rows_in_batch("j", 3, ranges, {("t", 0): (5, 8), ("t", 1): (7, 7)})  # inside: no error
    for seen in ({("t", 0): (4, 8)}, {("t", 0): (5, 9)}, {("t", 2): (0, 0)}, {("t", 1): (-1, -1)}):
        with pytest.raises(RowsOutsideBatch) as e:
            check_rows_in_batch("j", 3, ranges, seen)
        line = str(e.value)
        assert "\n" not in line
        assert line.startswith("job 'j' micro-batch 3: the sink received rows of topic 't' partition")
        assert "nothing was written" in line


# -- real queries --------------------------------------------------------------------------------


def test_stream_counts_each_message_once_over_restarts(streaming: Counting, tmp_path: Path) -> None:
    topic = streaming.new_topic(3)
    checkpoint = tmp_path / "chk"
    streaming.produce(topic, {0: 30, 1: 20, 2: 1})
    streaming.run_available_now(topic, checkpoint)
    streaming.assert_counted_exactly(topic, 51, job=JOB)

    streaming.produce(topic, {1: 5})
    streaming.run_available_now(topic, checkpoint)
    streaming.assert_counted_exactly(topic, 56, job=JOB)


def test_max_offsets_per_trigger_cuts_batches_and_available_now_reads_them_all(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(2)
    streaming.produce(topic, {0: 40, 1: 10})
    query = streaming.run_available_now(topic, tmp_path / "chk", maxOffsetsPerTrigger="10")
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    if not ADMISSION_CONTROL:
        # PySpark before 4.2: latestOffset() gets no limit and Trigger.AvailableNow fixes its
        # end with one call, so each run reads one batch capped by the option.
        assert batches == [10]
        assert streaming.totals(topic, job=JOB) == {topic: 10}
        for _ in range(4):
            streaming.run_available_now(topic, tmp_path / "chk", maxOffsetsPerTrigger="10")
    else:
        assert len(batches) == 5, batches
    streaming.assert_counted_exactly(topic, 50, job=JOB)


@CLASSIC_AND_CONNECT
def test_checkpoint_deleted_starts_where_postgresql_says(streaming: Counting, tmp_path: Path) -> None:
    topic = streaming.new_topic(2)
    checkpoint = tmp_path / "chk"
    streaming.produce(topic, {0: 8, 1: 3})
    streaming.run_available_now(topic, checkpoint)
    shutil.rmtree(checkpoint)
    streaming.produce(topic, {0: 2, 1: 4})
    streaming.run_available_now(topic, checkpoint)
    streaming.assert_counted_exactly(topic, 17, job=JOB)


@CLASSIC_AND_CONNECT
def test_older_checkpoint_copy_stops_in_one_line_and_writes_nothing(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(2)
    checkpoint, old = tmp_path / "chk", tmp_path / "old"
    streaming.produce(topic, {0: 8, 1: 3})
    streaming.run_available_now(topic, checkpoint)
    shutil.copytree(checkpoint, old)
    streaming.produce(topic, {0: 5})
    streaming.run_available_now(topic, checkpoint)
    assert streaming.totals(topic, job=JOB) == {topic: 16}
    stored = streaming.offsets(topic, job=JOB)

    shutil.rmtree(checkpoint)
    shutil.copytree(old, checkpoint)  # the older copy "restored"
    streaming.produce(topic, {1: 2})
    stops_writing_nothing(
        streaming,
        topic,
        checkpoint,
        "txn_offsets stores offset 13 but the checkpoint starts this micro-batch at 8",
    )
    assert streaming.totals(topic, job=JOB) == {topic: 16}
    assert streaming.offsets(topic, job=JOB) == stored


def stops_writing_nothing(streaming: Counting, topic: str, checkpoint: Path, says: str) -> None:
    """The query on ``checkpoint`` stops before reading, its line naming partition 0 of ``topic``
    with ``says`` and the new checkpointLocation; the job's counts and offsets do not move."""
    totals, stored = streaming.totals(topic, job=JOB), streaming.offsets(topic, job=JOB)
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(topic, checkpoint)
    message = str(e.value)
    assert f"job '{JOB}' topic '{topic}' partition 0: {says}" in message, message
    assert "new checkpointLocation" in message and "invalid offset range" not in message
    assert streaming.totals(topic, job=JOB) == totals
    assert streaming.offsets(topic, job=JOB) == stored


def test_a_checkpoints_unfinished_batch_0_that_the_job_went_past_stops_in_one_line_and_writes_nothing(
    streaming: Counting, tmp_path: Path
) -> None:
    """Batch 0 of a checkpoint planned, then the query died before its commit; the job went on
    without it (another checkpoint's query counted past batch 0's end). Restarted on the first
    checkpoint, Spark replays batch 0 from ``initialOffset()`` again, now the stored offsets,
    which lie past the batch's logged end: a micro-batch that ends before it starts. Stopped in
    the checkpoint mismatch's one line, not an invalid range's traceback."""
    topic = streaming.new_topic(2)
    checkpoint, other = tmp_path / "chk", tmp_path / "other"
    streaming.produce(topic, {0: 5, 1: 2})
    with pytest.raises(QueryFailed):
        streaming.run_available_now(topic, checkpoint, failpoints="before-commit:exit")
    assert streaming.totals(topic, job=JOB).get(topic, 0) == 0  # died before its commit
    streaming.produce(topic, {0: 3})
    streaming.run_available_now(topic, other)
    streaming.assert_counted_exactly(topic, 10, job=JOB)
    stops_writing_nothing(
        streaming,
        topic,
        checkpoint,
        "txn_offsets stores offset 8 but the checkpoint ends this micro-batch at 5",
    )
    streaming.assert_counted_exactly(topic, 10, job=JOB)


@CLASSIC_AND_CONNECT
def test_batch_replayed_after_a_crash_is_recognised_as_committed_and_applied_once(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(2)
    checkpoint = tmp_path / "chk"
    streaming.produce(topic, {0: 6, 1: 4})
    streaming.run_available_now(topic, checkpoint)
    streaming.produce(topic, {0: 2})
    second = streaming.run_available_now(topic, checkpoint)
    last_batch = max(p.batchId for p in second.recentProgress if p.numInputRows > 0)
    assert last_batch >= 1  # a batch after the first, whose start comes from the checkpoint
    assert streaming.totals(topic, job=JOB) == {topic: 12}
    # The state a crash leaves between the sink's PostgreSQL commit and Spark's commit log:
    # the batch is in offsets/ but not in commits/. The restart replays it (same id, same ranges).
    (checkpoint / "commits" / str(last_batch)).unlink()
    (checkpoint / "commits" / f".{last_batch}.crc").unlink(missing_ok=True)
    again = streaming.run_available_now(topic, checkpoint)
    replayed = [p for p in again.recentProgress if p.batchId == last_batch]
    assert replayed and replayed[0].numInputRows == 2  # read again, not counted again
    assert streaming.totals(topic, job=JOB) == {topic: 12}
    streaming.produce(topic, {1: 3})
    streaming.run_available_now(topic, checkpoint)
    streaming.assert_counted_exactly(topic, 15, job=JOB)


@CLASSIC_AND_CONNECT
def test_a_second_query_on_the_same_job_is_refused(streaming: Counting, tmp_path: Path) -> None:
    topic = streaming.new_topic(2)
    streaming.produce(topic, {0: 5, 1: 5})
    running = (
        sink(streaming.stream(topic), streaming.database_url, tmp_path / "a")
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        running.processAllAvailable()
        with pytest.raises(QueryFailed) as e:
            streaming.run_available_now(topic, tmp_path / "b")
        # Both queries run in this test's Spark application: the line says so, and names both
        # ways that happens (a second query, or two sources of the job in one query).
        line = str(e.value)
        assert (
            f"job '{JOB}': another readStream.format('txstore') of this job in this Spark application" in line
        )
        assert "or a second running query of this job; nothing was read" in line
        streaming.produce(topic, {0: 2})
        running.processAllAvailable()
        assert running.isActive
    finally:
        running.stop()
    streaming.assert_counted_exactly(topic, 12, job=JOB)


def test_a_recreated_topic_stops_the_query_with_count_topics_line(
    streaming: Counting, tmp_path: Path
) -> None:
    topic = streaming.new_topic(1)
    checkpoint = tmp_path / "chk"
    streaming.produce(topic, {0: 8})
    streaming.run_available_now(topic, checkpoint)
    streaming.kafka.recreate_topic(topic, 1)
    streaming.produce(topic, {0: 2})
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(topic, checkpoint)
    expected = (
        f"job '{JOB}' topic '{topic}' partition 0: stored offset 8 is beyond the log-end offset 2 "
        "(topic deleted and recreated, or an unclean leader election); to start over from its "
        f"earliest offset: txstore reset --job {JOB} --topic {topic} --partition 0 --to-earliest --execute"
    )
    assert expected in str(e.value)
    assert streaming.totals(topic, job=JOB) == {topic: 8}


def test_a_topic_deleted_after_the_query_counted_it_stops_it_saying_so_not_check_the_topic(
    streaming: Counting, tmp_path: Path
) -> None:
    """Between a recreation's delete and its create the topic is gone: the job counted it, so
    its name is no typo. The query stops with count_topic's line for that (what to run then),
    not the client's "check --topic"."""
    topic = streaming.new_topic(2)
    checkpoint = tmp_path / "chk"
    streaming.produce(topic, {0: 3, 1: 2})
    streaming.run_available_now(topic, checkpoint)
    streaming.kafka.delete_topic(topic)
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(topic, checkpoint)
    assert (
        f"job '{JOB}' topic '{topic}' does not exist on Kafka at {streaming.kafka.bootstrap_servers} now, though the "
        "job stored offsets for 2 of its partitions: it may be being deleted and recreated." in str(e.value)
    )
    assert f"txstore reset --job {JOB} --topic {topic} --forget --execute" in str(e.value)
    assert "check --topic" not in str(e.value)
    assert streaming.totals(topic, job=JOB) == {topic: 5}


def test_a_partition_added_to_the_topic_between_micro_batches_is_read_from_its_start(
    streaming: Counting, tmp_path: Path
) -> None:
    """The test brokers cannot add partitions to a live topic (no CreatePartitions): the topic is
    recreated with one more partition and its old partitions' messages, byte for byte and with
    the same timestamps, which a consumer cannot tell from a partition added. The query, with
    its checkpoint, goes on: the new partition enters at its earliest offset."""
    topic = streaming.new_topic(2)
    checkpoint = tmp_path / "chk"
    old = [(i % 2, b"k", f"m{i}".encode(), 1_700_000_000_000 + i) for i in range(9)]
    send(streaming.kafka.bootstrap_servers, topic, old)
    streaming.run_available_now(topic, checkpoint)
    assert streaming.totals(topic, job=JOB) == {topic: 9}

    streaming.kafka.recreate_topic(topic, 3)  # "ALTER TOPIC ... PARTITIONS 3"
    send(streaming.kafka.bootstrap_servers, topic, old)
    assert streaming.log_ends(topic) == {0: 5, 1: 4, 2: 0}
    streaming.produce(topic, {2: 6, 0: 2})
    query = streaming.run_available_now(topic, checkpoint)
    assert streaming.totals(topic, job=JOB) == {topic: 17}
    assert streaming.offsets(topic, job=JOB) == streaming.log_ends(topic) == {0: 7, 1: 4, 2: 6}
    ends = [p["sources"][0]["endOffset"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert ends and json.loads(ends[-1]) == {topic: {"0": 7, "1": 4, "2": 6}}


def test_the_querys_progress_and_txstore_status_agree_with_what_txstore_committed(
    streaming: Counting, tmp_path: Path
) -> None:
    """Each micro-batch's numInputRows is its sources' endOffset - startOffset, the batches
    follow each other, the last end is txn_offsets and the rows sum to txn_data's count; and
    `txstore status` shows the streaming job like any other: offsets, lag, running."""
    topic = streaming.new_topic(2)
    streaming.produce(topic, {0: 23, 1: 12})
    query = (
        sink(
            streaming.stream(topic, maxOffsetsPerTrigger="10"),
            streaming.database_url,
            tmp_path / "c",
        )
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        status = json.loads(
            txstore_cli(
                "status", "--job", JOB, "--json", url=streaming.database_url, kafka=streaming.kafka
            ).stdout
        )
        assert [(r["partition"], r["offset"], r["lag"], r["running"]) for r in status] == [
            (0, 23, 0, True),
            (1, 12, 0, True),
        ]
    finally:
        query.stop()
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 4  # 35 messages, at most 10 a micro-batch
    previous_end = {topic: {"0": 0, "1": 0}}
    for progress in batches:
        (source,) = progress["sources"]
        start = json.loads(source["startOffset"] or "null")
        if start is None:  # Spark shows no start for a query's first micro-batch
            assert progress is batches[0]
            start = previous_end  # the initial offset: txn_offsets (none yet), else earliest
        end = json.loads(source["endOffset"])
        assert start == previous_end
        read = sum(end[topic][p] - start[topic].get(p, 0) for p in end[topic])
        assert progress["numInputRows"] == source["numInputRows"] == read <= 10
        previous_end = end
    assert {int(p): o for p, o in previous_end[topic].items()} == streaming.offsets(topic, job=JOB)
    assert sum(p["numInputRows"] for p in batches) == streaming.totals(topic, job=JOB)[topic] == 35

    streaming.produce(topic, {1: 4})
    stopped = txstore_cli("status", "--job", JOB, url=streaming.database_url, kafka=streaming.kafka)
    assert [line.split()[:8] + line.split()[9:10] for line in stopped.stdout.splitlines()[1:]] == [
        [JOB, topic, "0", "23", "0", "0", "23", "0", "no"],
        [JOB, topic, "1", "12", "0", "0", "16", "4", "no"],
    ]


def test_a_source_that_counts_its_messages_commits_the_counts_a_row_per_message_would(
    streaming: Counting, tmp_path: Path
) -> None:
    """txstore.countMessages: each task reads its range and yields one row with its count;
    transaction markers take offsets but are not messages, so the count is not end - start."""
    topic = streaming.new_topic(3)
    checkpoint = tmp_path / "chk"
    produce_in_transactions(
        streaming.kafka.bootstrap_servers, topic, transactions=4, per_transaction=5, partitions=3
    )
    streaming.produce(topic, {2: 3})
    query = streaming.run_available_now(topic, checkpoint, **{"txstore.countMessages": "true"})
    assert streaming.totals(topic, job=JOB) == {topic: 23}
    rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert rows == [3]  # one row per range, not per message
    streaming.produce(topic, {0: 4})
    streaming.run_available_now(topic, checkpoint, **{"txstore.countMessages": "true"})
    streaming.assert_counted_exactly(topic, 27, job=JOB)


@pytest.mark.parametrize("count_messages", ["true", "false"])
def test_min_partitions_reads_a_partition_s_range_in_several_tasks_and_counts_each_message_once(
    any_spark: Any, broker_db: BrokerDb, tmp_path: Path, count_messages: str
) -> None:
    """minPartitions 4 on one partition with transactions: 4 reading tasks a micro-batch, each a
    piece of the range (markers included), committed as the whole range, once. On classic Spark
    and through a Spark Connect client (the source and sink on its server)."""
    spark = any_spark
    txstore.register(spark)
    topic = broker_db.new_topic(1)
    checkpoint = tmp_path / "chk"
    produce_in_transactions(
        broker_db.kafka.bootstrap_servers, topic, transactions=3, per_transaction=7, partitions=1
    )
    options = {"minPartitions": "4", "txstore.countMessages": count_messages}
    query = run_available_now(spark, broker_db.kafka, broker_db.database_url, topic, checkpoint, **options)
    assert broker_db.totals(topic, job=JOB) == {topic: 21}
    if count_messages == "true":
        # The source's own numInputRows (its only source's): a Spark Connect client's progress
        # leaves out the query's total (None there; PySpark 4.3, any source, e.g. rate).
        rows = [p["sources"][0]["numInputRows"] for p in query.recentProgress]
        assert [n for n in rows if n > 0] == [4]  # a row a piece
    broker_db.produce(topic, {0: 9})
    run_available_now(spark, broker_db.kafka, broker_db.database_url, topic, checkpoint, **options)
    broker_db.assert_counted_exactly(topic, 30, job=JOB)


@pytest.mark.connect
def test_stream_through_spark_connect(spark_connect: Any, broker_db: BrokerDb, tmp_path: Path) -> None:
    """The same query from a Spark Connect client: source and sink run on the server."""
    txstore.register(spark_connect)
    topic = broker_db.new_topic(2)
    checkpoint = tmp_path / "chk"
    broker_db.produce(topic, {0: 7, 1: 2})
    run_available_now(spark_connect, broker_db.kafka, broker_db.database_url, topic, checkpoint)
    broker_db.produce(topic, {1: 4})
    run_available_now(spark_connect, broker_db.kafka, broker_db.database_url, topic, checkpoint)
    broker_db.assert_counted_exactly(topic, 13, job=JOB)


def test_sink_process_killed_after_its_commit_replays_the_batch_once(
    streaming: Counting, tmp_path: Path
) -> None:
    """The sink's process dies (like kill -9) right after PostgreSQL committed, before Spark's
    commit log has the batch: the restarted query replays it, which is recognised and skipped."""
    topic = streaming.new_topic(2)
    checkpoint = tmp_path / "chk"
    streaming.produce(topic, {0: 4, 1: 1})
    streaming.run_available_now(topic, checkpoint)
    streaming.produce(topic, {0: 3, 1: 6})
    with pytest.raises(QueryFailed):
        streaming.run_available_now(topic, checkpoint, failpoints="after-commit:exit")
    streaming.assert_counted_exactly(topic, 14, job=JOB)  # committed before the process died
    again = streaming.run_available_now(topic, checkpoint)
    replayed = [p["numInputRows"] for p in again.recentProgress if p["numInputRows"] > 0]
    assert replayed == [9]  # the same ranges read again, not counted again
    assert streaming.totals(topic, job=JOB) == {topic: 14}


def test_sink_process_killed_after_a_new_checkpoints_first_commit_replays_batch_0_from_the_stored_offsets(
    streaming: Counting, tmp_path: Path
) -> None:
    """Killed after PostgreSQL committed batch 0 of a new checkpoint: its offset log has batch 0's
    end but no start, so Spark asks ``initialOffset()`` again, which is now the stored offsets.
    The replay reads nothing (no "already committed" line: nothing is planned) and counts nothing
    twice; batches after it go on from batch 0's end."""
    topic = streaming.new_topic(2)
    checkpoint = tmp_path / "chk"
    streaming.produce(topic, {0: 5, 1: 2})
    with pytest.raises(QueryFailed):
        streaming.run_available_now(topic, checkpoint, failpoints="after-commit:exit")
    streaming.assert_counted_exactly(topic, 7, job=JOB)  # committed before the process died
    assert sorted(p.name for p in (checkpoint / "offsets").glob("[0-9]*")) == ["0"]
    assert not list((checkpoint / "commits").glob("[0-9]*"))  # Spark replays batch 0
    streaming.produce(topic, {1: 3})
    again = streaming.run_available_now(topic, checkpoint)
    rows = [(p["batchId"], p["numInputRows"]) for p in again.recentProgress]
    assert rows[0] == (0, 0)  # batch 0 again: from the stored offsets to its logged end, empty
    assert sum(n for _, n in rows) == 3  # then only what came after it
    assert streaming.totals(topic, job=JOB) == {topic: 10}


# -- a results table -------------------------------------------------------------------------------

SALES = {
    "txstore.table": "stream_sales",
    "txstore.key": "country",
    "txstore.merge": "revenue=sum,orders=sum,biggest=max",
}


def sales_rows(df: Any) -> Any:
    """One row per message: its country (the key), its amount (the value) and a count of 1."""
    amount = "CAST(CAST(value AS STRING) AS DECIMAL(12,2))"
    return df.selectExpr(
        "topic",
        "partition",
        "offset",
        "CAST(key AS STRING) AS country",
        f"{amount} AS revenue",
        "CAST(1 AS BIGINT) AS orders",
        f"{amount} AS biggest",
    )


def create_sales(db: psycopg.Connection, revenue: str = "numeric(18,2)") -> None:
    db.execute(
        f"CREATE TABLE stream_sales (country text PRIMARY KEY, revenue {revenue} NOT NULL, "
        "orders bigint NOT NULL, biggest numeric(12,2))"
    )


def sales(db: psycopg.Connection) -> dict[str, tuple[Decimal, int, Decimal]]:
    rows = db.execute("SELECT country, revenue, orders, biggest FROM stream_sales").fetchall()
    return {country: (revenue, orders, biggest) for country, revenue, orders, biggest in rows}


def expected_sales(
    messages: Sequence[tuple[int, bytes, bytes, None]],
) -> dict[str, tuple[Decimal, int, Decimal]]:
    out: dict[str, tuple[Decimal, int, Decimal]] = {}
    for _, key, value, _ in messages:
        country, amount = key.decode(), Decimal(value.decode())
        revenue, orders, biggest = out.get(country, (Decimal(0), 0, amount))
        out[country] = (revenue + amount, orders + 1, max(biggest, amount))
    return out


def sale_messages(n: int, partitions: int, seed: int) -> list[tuple[int, bytes, bytes, None]]:
    countries = (b"fr", b"de", b"it")
    return [
        (
            i % partitions,
            countries[(i * 7 + seed) % 3],
            f"{(i * 37 + seed) % 1000}.{(i * 13) % 100:02d}".encode(),
            None,
        )
        for i in range(n)
    ]


@CLASSIC_AND_CONNECT
def test_a_stream_merges_each_micro_batchs_rows_into_a_results_table_once_even_when_replayed(
    streaming: Counting, tmp_path: Path
) -> None:
    """Per-message rows, aggregated by the sink per micro-batch under the merge rules; a restart,
    more messages, and a micro-batch replayed after its commit change nothing twice."""
    create_sales(streaming.db)
    topic = streaming.new_topic(2)
    checkpoint = tmp_path / "chk"
    first, second = sale_messages(40, 2, 1), sale_messages(25, 2, 2)

    def run() -> Any:
        return streaming.run_available_now(
            topic, checkpoint, rows=sales_rows, sink_options=SALES, maxOffsetsPerTrigger="30"
        )

    send(streaming.kafka.bootstrap_servers, topic, first)
    run()
    if not ADMISSION_CONTROL:  # PySpark 4.0/4.1: one capped batch per AvailableNow run
        run()
    assert sales(streaming.db) == expected_sales(first)
    send(streaming.kafka.bootstrap_servers, topic, second)
    query = run()
    assert sales(streaming.db) == expected_sales(first + second)
    assert streaming.offsets(topic, job=JOB) == streaming.log_ends(topic)
    # The rows went to the table, not to txstore's own counts.
    assert streaming.db.execute("SELECT count(*) FROM txn_data WHERE job = %s", (JOB,)).fetchone() == (0,)

    # The crash between the sink's PostgreSQL commit and Spark's commit log: the batch replays.
    last_batch = max(p.batchId for p in query.recentProgress if p.numInputRows > 0)
    (checkpoint / "commits" / str(last_batch)).unlink()
    (checkpoint / "commits" / f".{last_batch}.crc").unlink(missing_ok=True)
    again = run()
    replayed = [p for p in again.recentProgress if p.batchId == last_batch]
    assert replayed and replayed[0].numInputRows > 0  # read again, merged once
    assert sales(streaming.db) == expected_sales(first + second)
    assert streaming.offsets(topic, job=JOB) == streaming.log_ends(topic)


def _nothing_committed(db: psycopg.Connection, topic: str) -> None:
    """Spark makes the sink's writer when it plans the first micro-batch's write: after the source
    planned it (its start rows and plan stored), before any task read a message."""
    assert set(offsets(db, topic, job=JOB).values()) <= {0}
    assert sales(db) == {}


def test_a_column_that_would_round_the_sums_is_refused_before_anything_is_read(
    streaming: Counting, tmp_path: Path
) -> None:
    create_sales(streaming.db, revenue="numeric(18,1)")  # the query's revenue has 2 decimal places
    topic = streaming.new_topic(1)
    send(streaming.kafka.bootstrap_servers, topic, sale_messages(5, 1, 0))
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(topic, tmp_path / "chk", rows=sales_rows, sink_options=SALES)
    message = str(e.value)
    line = next(x for x in message.splitlines() if "column revenue" in x)
    assert (
        f"job {JOB}: column revenue: the query's revenue is decimal(12,2), which stream_sales.revenue" in line
    )
    assert "ALTER TABLE stream_sales ALTER COLUMN revenue TYPE numeric(" in line
    _nothing_committed(streaming.db, topic)


def test_a_streaming_aggregations_running_totals_are_refused_in_one_line_before_they_double_count(
    streaming: Counting, tmp_path: Path
) -> None:
    """Update and complete modes hand the sink running totals every micro-batch: merged by sum,
    each message would count again in every later batch. Spark refuses update mode for this
    sink; txstore refuses complete mode, and any rows that are not per message (no offset)."""
    create_sales(streaming.db)
    topic = streaming.new_topic(1)
    send(streaming.kafka.bootstrap_servers, topic, sale_messages(5, 1, 0))

    def running_totals(df: Any) -> Any:
        totals = sales_rows(df).groupBy("country").agg({"revenue": "sum", "orders": "sum", "biggest": "max"})
        return totals.toDF("country", "revenue", "orders", "biggest")

    refusals = {
        "update": "txstore does not support Update mode",
        "complete": (
            f"job {JOB}: writeStream.format('txstore') with txstore.table does not take "
            "outputMode('complete'): its rows are running totals, merged again every micro-batch "
            "(double counted)"
        ),
    }
    for mode, line in refusals.items():
        with pytest.raises(QueryFailed) as e:
            streaming.run_available_now(
                topic, tmp_path / mode, rows=running_totals, sink_options=SALES, output_mode=mode
            )
        assert line in str(e.value), str(e.value)
    _nothing_committed(streaming.db, topic)


def test_rows_without_their_message_are_refused_in_one_line(streaming: Counting, tmp_path: Path) -> None:
    """Rows that do not say which message they came from (an append-mode aggregation's, say)
    cannot be checked against the micro-batch's ranges: refused at the first micro-batch."""
    create_sales(streaming.db)
    topic = streaming.new_topic(1)
    send(streaming.kafka.bootstrap_servers, topic, sale_messages(5, 1, 0))
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(
            topic, tmp_path / "chk", rows=lambda df: sales_rows(df).drop("offset"), sink_options=SALES
        )
    assert (
        f"job {JOB}: writeStream.format('txstore') with txstore.table merges each micro-batch's own "
        "rows, one or more per message, and the query's rows have no offset column"
    ) in str(e.value)
    _nothing_committed(streaming.db, topic)


def test_the_counts_sink_refuses_complete_modes_running_totals_in_one_line(
    streaming: Counting, tmp_path: Path
) -> None:
    """Complete mode hands the sink every group's running total each micro-batch: counted as
    rows per topic, every message would be counted again in each later batch."""
    topic = streaming.new_topic(1)
    send(streaming.kafka.bootstrap_servers, topic, [(0, b"k", b"v", None)] * 5)
    with pytest.raises(QueryFailed) as e:
        streaming.run_available_now(
            topic, tmp_path / "complete", rows=lambda df: df.groupBy("topic").count(), output_mode="complete"
        )
    assert (
        f"job {JOB}: writeStream.format('txstore') counts the rows of each micro-batch and does not take "
        "outputMode('complete')"
    ) in str(e.value), str(e.value)
    assert set(streaming.offsets(topic, job=JOB).values()) <= {0}
    assert sum(streaming.totals(topic, job=JOB).values()) == 0  # not one message counted
