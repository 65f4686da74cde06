"""The stream source's and sink's guards of exactly-once, called as Spark calls them, without Spark.

Every method of ``readStream.format("txstore")`` (:mod:`txstore.spark.stream.stream_source`) and
``writeStream.format("txstore")`` (:mod:`txstore.spark.stream.stream_sink`) can be called directly:
the source plans (``initialOffset``, ``latestOffset``, ``partitions``), its tasks ``read``, the
sink's tasks ``write`` the record batches they were handed, and its ``commit`` verifies and
commits them. Outside Spark a task has no query, micro-batch or run (``TaskContext.get()`` is
None), so a receipt names none and the sink's delivery too. Real PostgreSQL (one database for
the module, emptied before each test, tests/helpers/fast_db.py); Kafka is a fake of confluent-kafka's
consumer and admin client over in-memory logs (tests/helpers/fake_kafka.py), so each test takes about a
second: ``./dev mutate`` runs them for the stream modules (mutation/mutate.py).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.types import LongType, StringType, StructField, StructType

import txstore.kafka.admin
from tests.helpers.fake_kafka import FakeAdminClient, FakeKafka, FakeLog, install_with_admin, message
from tests.helpers.fast_db import module_database
from tests.helpers.streams import COUNT_SCHEMA, ROWS_SCHEMA, source_options
from tests.postgres.test_sink import seed
from txstore.core.errors import (
    ConfigError,
    DataLoss,
    OffsetOutOfLog,
    ResultsTableInvalid,
    TopicRecreated,
    TxstoreError,
    UnknownTopic,
)
from txstore.core.fingerprint import Fingerprint, fingerprint
from txstore.core.micro_batch import (
    Delivery,
    MicroBatchNotRead,
    MicroBatchReadTwice,
    RangeRead,
    Receipt,
    RowsOutsideBatch,
    RowsRepeated,
    StreamPlan,
    merge_spans,
    spans_array,
    spans_from_array,
    verify_micro_batch,
    whole_read,
)
from txstore.core.ranges import IDLE_TOPIC_ID_SECONDS, OffsetRange, PartitionWatermarks
from txstore.core.starting import StartingOffsets
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.stream_plans import (
    CHECKPOINT_LED,
    SINK_COMMITTED,
    load_plan,
    load_reads,
    mark_committed,
    plan_identity,
    record_read,
    save_plan,
    tasks_of,
)
from txstore.spark.source.datasource import partition_ranges
from txstore.spark.source.read_planning import plan_job_ranges, plan_read_ranges
from txstore.spark.stream.stream_checkpoint import (
    CheckpointMismatch,
    ForeignCheckpoint,
    check_alignment,
    check_checkpoint_in_log,
    check_idle_start,
)
from txstore.spark.stream.stream_lock import StreamLocked, stream_lock_holder
from txstore.spark.stream.stream_offsets import (
    StreamPartition,
    batch_ranges,
    micro_batch_tasks,
    offsets_dict,
    offsets_map,
)
from txstore.spark.stream.stream_options import parse_count_messages, parse_stream_options, parse_tasks
from txstore.spark.stream.stream_sink import check_rows_in_batch, stream_writer
from txstore.spark.stream.stream_sink_options import parse_sink_options
from txstore.spark.stream.stream_source import TxstoreStreamReader, stream_reader
from txstore.spark.stream.stream_write_tasks import TableRows, TopicCounts, _batch_spans, _row_spans

JOB = "stream_guards"


shared_database_url, database_url = module_database("stream")


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    return install_with_admin(monkeypatch)


def log(
    fake: FakeKafka, partition: int, offsets: Sequence[int], high: int | None = None, low: int = 0
) -> FakeLog:
    return fake.add(FakeLog.of("t", partition, offsets, high=high, low=low))


def grow(fake_log: FakeLog, until: int) -> None:
    """Messages appended to the log up to ``until`` (exclusive)."""
    for o in range(fake_log.high, until):
        fake_log.messages[o] = message("t", fake_log.partition, o, b"v%d" % o, b"k", 1_000 + o)
    fake_log.high = until


def source(
    readers: list[TxstoreStreamReader], url: str, schema: StructType = ROWS_SCHEMA, **options: str
) -> TxstoreStreamReader:
    reader = stream_reader(source_options("fake:9092", url, "t", JOB, **options), schema)
    readers.append(reader)
    return reader


def writer(url: str, schema: StructType = ROWS_SCHEMA, overwrite: bool = False, **options: str) -> Any:
    return stream_writer({"txstore.job": JOB, "txstore.databaseUrl": url, **options}, schema, overwrite)


@dataclass(frozen=True)
class Guard:
    """The ``guard`` fixture: the module's database (its URL and a connection), the fake Kafka and
    the readers a test made, with ``log``, ``source`` and ``writer`` above bound to them."""

    url: str
    db: psycopg.Connection
    fake: FakeKafka
    readers: list[TxstoreStreamReader]

    def log(self, partition: int, offsets: Sequence[int], high: int | None = None, low: int = 0) -> FakeLog:
        return log(self.fake, partition, offsets, high, low)

    def source(self, schema: StructType = ROWS_SCHEMA, **options: str) -> TxstoreStreamReader:
        return source(self.readers, self.url, schema, **options)

    def writer(self, schema: StructType = ROWS_SCHEMA, overwrite: bool = False, **options: str) -> Any:
        return writer(self.url, schema, overwrite, **options)

    def read_first(self, *sizes: int) -> tuple[TxstoreStreamReader, Any]:
        """Partitions 0, 1, ... holding ``sizes`` messages and their source, with its first
        micro-batch planned and read (its tasks' receipts recorded, nothing committed): the reader
        and the batch's end."""
        for partition, messages in enumerate(sizes):
            self.log(partition, range(messages))
        reader = self.source()
        _, end, parts = plan(reader)
        read(reader, parts)
        return reader, end

    def counted_first(self, messages: int, **options: str) -> tuple[FakeLog, TxstoreStreamReader, Any, Any]:
        """Partition 0 holding ``messages`` messages, its source (``options``) and the sink, with the
        first micro-batch planned, read and committed by the sink: the log, reader, sink and end."""
        partition = self.log(0, range(messages))
        reader = self.source(**options)
        sink = self.writer()
        _, end, parts = plan(reader)
        sink.commit([sink.write(iter(task)) for task in read(reader, parts)], 0)
        return partition, reader, sink, end


@pytest.fixture
def guard(
    database_url: str, db: psycopg.Connection, fake_kafka: FakeKafka, readers: list[TxstoreStreamReader]
) -> Guard:
    return Guard(database_url, db, fake_kafka, readers)


def rows(*items: tuple[str | None, int | None, int | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "topic": [i[0] for i in items],
            "partition": pa.array([i[1] for i in items], pa.int32()),
            "offset": pa.array([i[2] for i in items], pa.int64()),
        }
    )


def of(partition: int, *offsets: int, topic: str = "t") -> pa.RecordBatch:
    return rows(*[(topic, partition, o) for o in offsets])


def plan(reader: TxstoreStreamReader, start: dict[str, Any] | None = None) -> tuple[Any, Any, list[Any]]:
    begin = reader.initialOffset() if start is None else start
    end = reader.latestOffset(begin, None)
    return begin, end, list(reader.partitions(begin, end))


def read(reader: TxstoreStreamReader, parts: Sequence[Any]) -> list[list[Any]]:
    """Each task's record batches (its receipt is recorded once it has read them all)."""
    return [list(reader.read(p)) for p in parts]


def offsets(db: psycopg.Connection, job: str = JOB) -> dict[int, int]:
    return {p: o for (_, p), o in store.committed_offsets(db, job, ["t"]).items()}


def total(db: psycopg.Connection, job: str = JOB) -> int | float:
    return store.topic_totals(db, job, ["t"])["t"]


def last_counted(db: psycopg.Connection) -> dict[int, int | None]:
    found = db.execute(
        "SELECT part, last_off FROM txn_offsets WHERE job = %s ORDER BY part", (JOB,)
    ).fetchall()
    return {p: o for p, o in found}


def committed_by(db: psycopg.Connection, job: str = JOB) -> str | None:
    row = db.execute("SELECT committed_by FROM txn_stream_plans WHERE job = %s", (job,)).fetchone()
    return None if row is None else row[0]


def one_line(e: pytest.ExceptionInfo[BaseException]) -> str:
    line = str(e.value)
    assert "\n" not in line
    return line


# -- the sink's rows (first: ./dev mutate stops a selection at its first failure) --------------------------


def test_a_task_s_rows_become_spans_of_offsets_per_partition_whatever_their_order() -> None:
    batch = rows(
        ("a", 0, 5), ("a", 0, 6), ("a", 0, 8), ("b", 1, 3), ("a", 1, 0), (None, 0, 9), ("a", None, 1)
    )
    assert _batch_spans(batch) == ({("a", 0): [(5, 7), (8, 9)], ("b", 1): [(3, 4)], ("a", 1): [(0, 1)]}, 2)
    shuffled = rows(("b", 2, 4), ("a", 0, 7), ("b", 2, 3), ("a", 0, 6), ("a", 0, 6), ("a", 0, 9))
    assert _batch_spans(shuffled) == ({("a", 0): [(6, 7), (6, 8), (9, 10)], ("b", 2): [(3, 5)]}, 0)
    big = rows(("a", 2**31 - 1, 2**40), ("a", 2**31 - 1, 2**40 + 1), ("a", 0, 0))
    assert _batch_spans(big) == ({("a", 0): [(0, 1)], ("a", 2**31 - 1): [(2**40, 2**40 + 2)]}, 0)
    assert _batch_spans(rows((None, 0, 1))) == ({}, 1)
    assert _batch_spans(rows(("a", 0, None), ("a", 0, 4))) == ({("a", 0): [(4, 5)]}, 1)
    # a partition no Kafka log has (a query's own column) is still named as it is, to be refused
    assert _batch_spans(rows(("a", -1, 4), ("a", -(2**31), 0))) == (
        {("a", -(2**31)): [(0, 1)], ("a", -1): [(4, 5)]},
        0,
    )
    descending = rows(("a", 1, 0), ("a", 0, 1))
    assert _batch_spans(descending) == ({("a", 0): [(1, 2)], ("a", 1): [(0, 1)]}, 0)
    chunked = pa.Table.from_batches([of(0, 1, 2), of(0, 3)]).combine_chunks().to_batches()[0]
    assert _batch_spans(chunked) == ({("t", 0): [(1, 4)]}, 0)
    as_rows = [
        Row(topic=t, partition=p, offset=o) for t, p, o in zip(*shuffled.to_pydict().values(), strict=True)
    ]
    assert _row_spans(as_rows) == ({("a", 0): [(6, 7), (6, 8), (9, 10)], ("b", 2): [(3, 5)]}, 0)
    assert _row_spans([Row(topic="a", partition=None, offset=1), Row(topic=None, partition=0, offset=1)]) == (
        {},
        2,
    )
    assert _row_spans([Row(topic="a", partition=0, offset=None)]) == ({}, 1)


def test_a_write_task_hands_the_commit_its_counts_spans_and_a_message_two_rows_share(
    database_url: str,
) -> None:
    sink = writer(database_url)
    message = sink.write(
        iter([of(0, 1, 2, 3), pa.RecordBatch.from_pylist([], schema=of(0).schema), of(0, 3, 4), of(1, 7)])
    )
    assert isinstance(message, TopicCounts)
    assert message.counts == {"t": 6} and message.unplaced == 0 and message.run == (None, None, None)
    assert spans_from_array(message.spans[("t", 0)]) == [(1, 5), (3, 4)]
    assert spans_from_array(message.spans[("t", 1)]) == [(7, 8)]
    row_message = sink.write(
        iter(
            [Row(topic="t", partition=0, offset=o) for o in (3, 1, 2, 3, 4)]
            + [Row(topic=None, partition=1, offset=2)]
        )
    )
    assert row_message.counts == {"t": 5} and row_message.unplaced == 1
    assert spans_from_array(row_message.spans[("t", 0)]) == [(1, 5), (3, 4)]
    mixed = sink.write(iter([of(0, 1), Row(topic="t", partition=0, offset=2)]))
    assert mixed.counts == {"t": 2} and spans_from_array(mixed.spans[("t", 0)]) == [(1, 3)]
    rows_first = sink.write(iter([Row(topic="t", partition=0, offset=2), of(0, 3), of(1, 0)]))
    assert rows_first.counts == {"t": 3} and spans_from_array(rows_first.spans[("t", 0)]) == [(2, 4)]
    nameless = sink.write(iter([rows(("t", 0, 1), (None, 0, 2), (None, 0, 3))]))
    assert (nameless.counts, nameless.unplaced) == ({"t": 1}, 2)


def test_the_counting_sink_needs_the_columns_that_name_each_row_s_message(database_url: str) -> None:
    topic_only = StructType([StructField("topic", StringType())])
    with pytest.raises(ConfigError, match="the query's rows have no partition, offset column"):
        writer(database_url, topic_only)
    no_until = StructType([f for f in COUNT_SCHEMA.fields if f.name != "txstore_until"])
    with pytest.raises(ConfigError, match="the query's rows have no txstore_until column"):
        writer(database_url, no_until)
    with pytest.raises(ConfigError, match="does not take outputMode\\('complete'\\)"):
        writer(database_url, ROWS_SCHEMA, overwrite=True)
    assert writer(database_url, COUNT_SCHEMA).counted is True
    assert writer(database_url, ROWS_SCHEMA).counted is False


def test_rows_outside_the_micro_batch_are_refused_by_the_table_sink_in_one_line() -> None:
    ranges = [OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 7, 8)]
    check_rows_in_batch("j", 3, ranges, {("t", 0): (5, 8), ("t", 1): (7, 7)})
    for seen, text in (
        ({("t", 0): (4, 8)}, "partition 0 offsets 4..8, outside this micro-batch's range [5, 9)"),
        ({("t", 0): (5, 9)}, "partition 0 offsets 5..9"),
        ({("t", 2): (0, 0)}, "partition 2 offsets 0..0, outside this micro-batch's range none"),
        ({("t", 1): (-1, -1)}, "partition 1 offsets -1..-1"),
        ({("t", 0): (5, 8), ("t", None): (1, 1)}, "partition None offsets 1..1"),  # type: ignore[dict-item]
    ):
        with pytest.raises(RowsOutsideBatch) as e:
            check_rows_in_batch("j", 3, ranges, seen)
        assert one_line(e).startswith(
            "job 'j' micro-batch 3: the sink received rows of topic 't' "
        ) and text in str(e.value)


def test_a_task_s_spans_are_exact_whatever_the_order_of_partitions_offsets_and_missing_rows(
    database_url: str,
) -> None:
    assert _batch_spans(rows(("t", 0, 1), ("t", 1, 5), ("t", 1, 6))) == (
        {("t", 0): [(1, 2)], ("t", 1): [(5, 7)]},
        0,
    )
    assert _batch_spans(rows(("t", 0, 5), ("t", 0, 4))) == ({("t", 0): [(4, 6)]}, 0)
    assert _batch_spans(rows(("a", 0, 1), ("a", 2, 1), ("a", 1, 1), ("a", 2, 2)))[0][("a", 2)] == [(1, 3)]
    assert _batch_spans(rows(("t", 0, 5), ("t", 0, 7), ("t", 0, 6))) == ({("t", 0): [(5, 8)]}, 0)
    assert _row_spans([Row(topic="t", partition=0, offset=o) for o in (1, 2, 4, 5)]) == (
        {("t", 0): [(1, 3), (4, 6)]},
        0,
    )
    sink = writer(database_url)
    two = sink.write(iter([rows(("t", 0, None), ("t", 0, 1)), rows((None, 0, 2))]))
    assert two.unplaced == 2
    mixed = sink.write(iter([rows((None, 0, 2)), Row(topic="t", partition=None, offset=3)]))
    assert mixed.unplaced == 2
    counting = writer(database_url, COUNT_SCHEMA)
    counted = counting.write(
        iter([Row(topic=None, partition=0, txstore_from=0, txstore_until=1, txstore_messages=1)] * 2)
    )
    assert counted.unplaced == 2


def test_the_table_sink_names_the_first_partition_outside_by_topic_and_partition(
    database_url: str, db: psycopg.Connection
) -> None:
    ranges = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 5)]
    for seen, text in (
        ({("u", 0): (0, 0), ("s", 1): (5, 5)}, "topic 's' partition 1"),
        ({("t", 5): (9, 9), ("t", 3): (20, 20)}, "topic 't' partition 3"),
        ({("t", 1): (7, 7), ("t", 0): (8, 8)}, "topic 't' partition 0"),
    ):
        with pytest.raises(RowsOutsideBatch, match=text):
            check_rows_in_batch("j", 3, ranges, seen)
    sales_table(db)
    sink = writer(database_url, SALE_ROWS, **SALES)
    empty_first = sink.write(iter([sale_batch(of(0, 0)).slice(0, 0), sale_batch(of(0, 1))]))
    assert empty_first.seen == {("t", 0): (1, 1)}


# -- the source and the sink together --------------------------------------------------------------


def test_a_micro_batch_read_and_written_commits_its_planned_ranges_and_counts_each_message_once(
    guard: Guard,
) -> None:
    """Two partitions, one with a transaction marker at offset 3: every message counted once,
    the offsets moved to the planned ends (past the marker), each partition's last message kept."""
    guard.log(0, range(10))
    guard.log(1, [0, 1, 2, 4], high=5)
    reader = guard.source()
    start, end, parts = plan(reader)
    assert start == {"t": {"0": 0, "1": 0}} and end == {"t": {"0": 10, "1": 5}}
    assert [[(r.partition, r.from_offset, r.until_offset) for r in p.ranges] for p in parts] == [
        [(0, 0, 10)],
        [(1, 0, 5)],
    ]
    batches = read(reader, parts)
    assert [sorted(o for b in task for o in b.column("offset").to_pylist()) for task in batches] == [
        list(range(10)),
        [0, 1, 2, 4],
    ]
    sink = guard.writer()
    messages = [sink.write(iter(task)) for task in batches]
    sink.commit(messages, 0)
    assert offsets(guard.db) == {0: 10, 1: 5}
    assert total(guard.db) == 14
    assert last_counted(guard.db) == {0: 9, 1: 4}
    reader.commit(end)  # Spark's commit of a batch the txstore sink committed: noted, nothing moved
    assert committed_by(guard.db) == SINK_COMMITTED
    assert offsets(guard.db) == {0: 10, 1: 5}
    sink.commit(messages, 0)  # a replay after a crash between PostgreSQL's and Spark's commit
    assert total(guard.db) == 14

    # The next micro-batch starts where the last ended, checked against txn_offsets.
    grow(guard.fake.logs[("t", 0)], 13)
    grow(guard.fake.logs[("t", 1)], 6)  # one message
    start, end, parts = plan(reader, end)
    assert end == {"t": {"0": 13, "1": 6}}
    assert [[(r.partition, r.from_offset, r.until_offset) for r in p.ranges] for p in parts] == [
        [(0, 10, 13)],
        [(1, 5, 6)],
    ]
    verified, after_marker = parts[0].ranges[0], parts[1].ranges[0]
    assert verified.verify == fingerprint(guard.fake.logs[("t", 0)].messages[9])  # the last counted
    assert after_marker.verify == fingerprint(guard.fake.logs[("t", 1)].messages[4])
    sink.commit([sink.write(iter(task)) for task in read(reader, parts)], 1)
    assert offsets(guard.db) == {0: 13, 1: 6} and total(guard.db) == 18


def test_a_plan_read_by_no_task_of_this_run_is_not_committed(guard: Guard) -> None:
    guard.log(0, range(4))
    reader = guard.source()
    plan(reader)
    sink = guard.writer()
    with pytest.raises(MicroBatchNotRead) as e:
        sink.commit([sink.write(iter([of(0, 0, 1)]))], 0)  # rows handed to the sink, never read
    assert "was not read by this micro-batch: no task of this query read it" in one_line(e)
    with pytest.raises(MicroBatchNotRead, match="received no rows from any task"):
        sink.commit([], 0)
    assert offsets(guard.db) == {0: 0} and total(guard.db) == 0


def test_a_row_of_an_offset_outside_the_planned_range_stops_the_commit_with_its_line(guard: Guard) -> None:
    guard.log(0, range(6))
    reader = guard.source()
    _, _, parts = plan(reader)
    batches = read(reader, parts)
    sink = guard.writer()
    with pytest.raises(RowsOutsideBatch) as e:
        sink.commit([sink.write(iter(batches[0] + [of(0, 6)]))], 0)
    assert one_line(e).startswith(
        "job 'stream_guards' micro-batch 0: the sink received rows of topic 't' partition 0 offsets "
        "0..6, outside this micro-batch's range [0, 6)"
    )
    with pytest.raises(RowsRepeated, match="two rows of the message at topic 't' partition 0 offset 2"):
        sink.commit([sink.write(iter(batches[0])), sink.write(iter([of(0, 2)]))], 0)
    with pytest.raises(RowsOutsideBatch, match="2 rows have no topic, partition or offset"):
        sink.commit([sink.write(iter(batches[0] + [rows(("t", None, 1), (None, 0, 2))]))], 0)
    assert offsets(guard.db) == {0: 0} and total(guard.db) == 0
    sink.commit([sink.write(iter([b.slice(1) for b in batches[0]]))], 0)  # fewer rows: a filter
    assert offsets(guard.db) == {0: 6} and total(guard.db) == 5


def test_the_counting_source_s_row_carries_its_range_and_the_sink_adds_what_its_task_read(
    guard: Guard,
) -> None:
    guard.log(0, range(7))
    guard.log(1, [0, 2, 3], high=4)
    guard.log(2, [], high=0)
    reader = guard.source(COUNT_SCHEMA, **{"txstore.countMessages": "true", "txstore.tasks": "1"})
    _, end, parts = plan(reader)
    assert len(parts) == 1
    (task,) = read(reader, parts)
    (batch,) = task
    assert batch.to_pylist() == [
        {"topic": "t", "partition": 0, "txstore_from": 0, "txstore_until": 7, "txstore_messages": 7},
        {"topic": "t", "partition": 1, "txstore_from": 0, "txstore_until": 4, "txstore_messages": 3},
    ]
    sink = guard.writer(COUNT_SCHEMA)
    message = sink.write(iter(task))
    assert isinstance(message, TopicCounts) and message.counts == {"t": 10}
    with pytest.raises(RowsOutsideBatch, match="says 6 messages, but its reading task read 7"):
        changed = batch.set_column(4, "txstore_messages", pa.array([6, 3], pa.int64()))
        sink.commit([sink.write(iter([changed]))], 0)
    with pytest.raises(RowsOutsideBatch, match="1 rows have no topic, partition or txstore_from"):
        missing = pa.RecordBatch.from_pylist(
            [{**batch.to_pylist()[0], "txstore_from": None}, batch.to_pylist()[1]], schema=batch.schema
        )
        sink.commit([sink.write(iter([missing]))], 0)
    without = sink.write(iter([missing]))  # the row that names no range is left out, the next kept
    assert (without.counts, without.unplaced, without.counted) == ({"t": 3}, 1, [("t", 1, 0, 4, 3)])
    assert total(guard.db) == 0
    sink.commit([message], 0)
    assert offsets(guard.db) == {0: 7, 1: 4, 2: 0} and total(guard.db) == 10
    assert last_counted(guard.db) == {0: 6, 1: 3, 2: None}
    reader.commit(end)
    assert committed_by(guard.db) == SINK_COMMITTED
    # Rows as PySpark before 4.1 hands them (Row objects) count the same.
    rows_message = sink.write(iter([Row(**r) for r in batch.to_pylist()]))
    assert rows_message.counts == {"t": 10} and rows_message.counted == message.counted


def test_a_source_of_no_messages_plans_nothing_to_read_and_its_sink_commits_nothing(guard: Guard) -> None:
    guard.log(0, [], high=0)
    reader = guard.source(COUNT_SCHEMA, **{"txstore.countMessages": "true"})
    _, end, parts = plan(reader)
    assert parts == [] and end == {"t": {"0": 0}}
    assert list(reader.read(StreamPartition([], "none", 0))) == []
    sink = guard.writer(COUNT_SCHEMA)
    sink.commit([], 0)
    reader.commit(end)
    assert committed_by(guard.db) is None and offsets(guard.db) == {0: 0}


# -- the source's planning --------------------------------------------------------------------------


def test_a_new_query_starts_at_the_stored_offsets_and_an_unstarted_topic_per_starting_offsets(
    guard: Guard,
) -> None:
    guard.log(0, range(9))
    guard.log(1, range(2, 9), low=2)
    seed(guard.db, JOB, "t", {0: 5})  # a started topic: a partition without a row is a new one, read whole
    latest = guard.source(startingOffsets="latest")
    assert latest.initialOffset() == {"t": {"0": 5, "1": 2}}
    assert offsets(guard.db) == {0: 5, 1: 2}  # the new partition's start stored when decided
    guard.readers.pop().stop()
    guard.db.execute("DELETE FROM txn_offsets WHERE job = %s", (JOB,))
    guard.db.commit()
    assert guard.source(startingOffsets="latest").initialOffset() == {"t": {"0": 9, "1": 9}}
    assert offsets(guard.db) == {0: 9, 1: 9}


def test_the_end_is_capped_by_the_limit_spark_gives_or_else_by_max_offsets_per_trigger(
    database_url: str, fake_kafka: FakeKafka, readers: list[TxstoreStreamReader]
) -> None:
    log(fake_kafka, 0, range(100))
    log(fake_kafka, 1, range(100))
    reader = source(readers, database_url, maxOffsetsPerTrigger="10")
    start = reader.initialOffset()
    assert reader.latestOffset(start, None) == {"t": {"0": 100, "1": 100}}  # Spark's limit: all
    assert reader.latestOffset(start, type("ReadMaxRows", (), {"max_rows": 20})()) == {
        "t": {"0": 10, "1": 10}
    }
    # PySpark 4.0/4.1: no start, no limit; the last end given out is the start.
    assert reader.latestOffset() == {"t": {"0": 15, "1": 15}}
    assert reader.latestOffset() == {"t": {"0": 20, "1": 20}}
    fresh = source(readers, database_url + "?application_name=other", maxOffsetsPerTrigger="4")
    readers[0].stop()
    assert fresh.latestOffset() == {"t": {"0": 2, "1": 2}}  # before initialOffset: from the stored start


def test_trigger_available_now_stops_at_the_log_ends_it_found_first(
    database_url: str, fake_kafka: FakeKafka, readers: list[TxstoreStreamReader]
) -> None:
    log(fake_kafka, 0, range(5))
    reader = source(readers, database_url)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    grow(fake_kafka.logs[("t", 0)], 9)
    log(fake_kafka, 1, range(3))  # a partition added after the target was fixed: not read yet
    assert reader.latestOffset(start, None) == {"t": {"0": 5, "1": 0}}


def test_a_partition_added_between_micro_batches_enters_with_an_empty_range_at_its_log_start(
    guard: Guard,
) -> None:
    guard.log(0, range(3))
    reader = guard.source()
    _, end, parts = plan(reader)
    sink = guard.writer()
    sink.commit([sink.write(iter(t)) for t in read(reader, parts)], 0)
    guard.log(1, range(4, 8), low=4)
    _, end, parts = plan(reader, end)
    assert end == {"t": {"0": 3, "1": 4}} and parts == []
    stored = load_plan(guard.db, JOB)
    assert stored.ranges == (OffsetRange("t", 0, 3, 3), OffsetRange("t", 1, 4, 4)) and not stored.reading
    assert offsets(guard.db) == {0: 3, 1: 4}  # its row starts where this checkpoint starts it
    _, end, parts = plan(reader, end)
    assert end == {"t": {"0": 3, "1": 8}}
    assert [r for p in parts for r in p.ranges] == [OffsetRange("t", 1, 4, 8)]
    (r,) = parts[0].ranges
    assert r.log_end == 8 and r.generation == 0 and r.verify is None


def test_a_checkpoint_that_starts_elsewhere_than_txn_offsets_stops_before_anything_is_planned(
    guard: Guard,
) -> None:
    guard.log(0, range(10))
    seed(guard.db, JOB, "t", {0: 4})
    reader = guard.source()
    with pytest.raises(CheckpointMismatch) as e:
        reader.partitions({"t": {"0": 2}}, {"t": {"0": 6}})
    assert (
        "txn_offsets stores offset 4 but the checkpoint starts this micro-batch at 2 (committed"
        in one_line(e)
    )
    with pytest.raises(CheckpointMismatch, match="offsets would be skipped"):
        reader.partitions({"t": {"0": 6}}, {"t": {"0": 8}})
    with pytest.raises(TxstoreError, match="no planned micro-batch"):
        load_plan(guard.db, JOB)
    # a replay of a batch committed whole is planned again (its sink then skips it)
    parts = reader.partitions({"t": {"0": 0}}, {"t": {"0": 4}})
    assert [r for p in parts for r in p.ranges] == [OffsetRange("t", 0, 0, 4)]


def test_a_replayed_batch_0_the_job_went_past_stops_before_anything_is_planned(guard: Guard) -> None:
    """Spark replays a checkpoint's batch 0 from ``initialOffset()``, the stored offsets: past the
    batch's logged end once another query of the job counted further. One line, nothing planned."""
    guard.log(0, range(10))
    guard.log(1, range(10))
    seed(guard.db, JOB, "t", {0: 2, 1: 8})
    reader = guard.source()
    replayed = ({"t": {"0": 2, "1": 8}}, {"t": {"0": 2, "1": 5}})  # partition 0 in order, 1 not
    with pytest.raises(CheckpointMismatch) as e:
        reader.partitions(*replayed)
    line = one_line(e)
    assert "partition 1: txn_offsets stores offset 8 but the checkpoint ends this micro-batch at 5" in line
    assert "new checkpointLocation" in line
    with pytest.raises(TxstoreError, match="no planned micro-batch"):
        load_plan(guard.db, JOB)
    for stored in (3, 5):  # not past the batch's end: not the stored start, an edited checkpoint
        guard.db.execute("UPDATE txn_offsets SET off = %s WHERE job = %s AND part = 1", (stored, JOB))
        with pytest.raises(CheckpointMismatch, match="starts this micro-batch at offset 8 and ends it at 5"):
            reader.partitions(*replayed)
    # a partition ending where it starts is an empty range, not a batch ending before its start
    parts = reader.partitions({"t": {"0": 2, "1": 5}}, {"t": {"0": 2, "1": 6}})
    assert [r for p in parts for r in p.ranges] == [OffsetRange("t", 1, 5, 6)]


def test_a_checkpoint_starting_where_the_job_never_would_is_refused_by_latest_offset_and_partitions(
    guard: Guard,
) -> None:
    guard.log(0, range(10))
    guard.log(1, range(4))
    reader = guard.source()  # a new job: it would start both partitions at 0
    foreign = {"t": {"0": 3, "1": 0}}
    line = (
        r"partition 0: the checkpoint starts this micro-batch at offset 3, but the job has no offset stored"
    )
    with pytest.raises(ForeignCheckpoint, match=line):
        reader.latestOffset(foreign, None)
    with pytest.raises(ForeignCheckpoint, match=line):  # a replay goes to partitions() directly
        reader.partitions(foreign, {"t": {"0": 6, "1": 2}})
    assert offsets(guard.db) == {}


def test_a_checkpoint_starting_outside_the_log_where_the_job_s_offset_is_inside_is_named_not_the_job_s_offset(
    guard: Guard,
) -> None:
    """Another query's (or an older) checkpoint starts a partition past the log end or below the
    log start, while the job's own offset is inside the log. Spark asks ``latestOffset`` before
    ``partitions`` (whose alignment check names the checkpoint), so its line must already say
    whose offset it is, and advise a new checkpoint: not a reset, which would count the job's
    counted messages again (``--to-earliest``), nor skipping "aged out" messages the job counted."""
    guard.log(0, range(4, 10), low=4)  # offsets 4-9: log start 4, log end 10
    seed(guard.db, JOB, "t", {0: 6})
    reader = guard.source()
    for start, where in ((12, "beyond the log-end offset 10"), (2, "below the log-start offset 4")):
        with pytest.raises(CheckpointMismatch) as e:
            reader.latestOffset({"t": {"0": start}}, None)
        line = one_line(e)
        assert (
            f"job '{JOB}' topic 't' partition 0: the checkpoint starts this micro-batch at offset {start}, "
            f"{where}, but txn_offsets stores offset 6, inside the log" in line
        ), line
        assert "txstore reset" not in line and "failOnDataLoss" not in line, line
        assert "new checkpointLocation" in line
    # The job's own offset outside the log too: the planner's line names the stored offset.
    guard.db.execute("UPDATE txn_offsets SET off = 11 WHERE job = %s", (JOB,))
    with pytest.raises(OffsetOutOfLog, match="partition 0: stored offset 11 is beyond the log-end offset 10"):
        reader.latestOffset({"t": {"0": 12}}, None)
    guard.db.execute("UPDATE txn_offsets SET off = 1 WHERE job = %s", (JOB,))
    with pytest.raises(DataLoss, match="partition 0: stored offset 1 is below the log-start offset 4; 3 "):
        reader.latestOffset({"t": {"0": 2}}, None)
    # ... unless the job skips what aged out (failOnDataLoss false): the checkpoint's start is then the fault.
    reader.stop()
    skipping = guard.source(failOnDataLoss="false")
    with pytest.raises(CheckpointMismatch) as e:
        skipping.latestOffset({"t": {"0": 12}}, None)
    assert (
        "the checkpoint starts this micro-batch at offset 12, beyond the log-end offset 10, but txn_offsets "
        "stores offset 1 (the checkpoint is an older copy, or another query's)" in one_line(e)
    )
    assert offsets(guard.db) == {0: 1}


def test_a_checkpoint_ahead_of_the_job_at_the_log_end_stops_the_query_not_idles_it(guard: Guard) -> None:
    """``txstore reset --to-earliest`` run with the query's old checkpoint kept (or another query's
    checkpoint): the checkpoint starts at the log end, past the stored offset. Nothing is new,
    so Spark would never ask ``partitions`` (whose alignment check would stop it): the query
    would sit idle and the messages from the stored offset would never be read."""
    guard.log(0, range(10))
    guard.log(1, range(3))
    seed(guard.db, JOB, "t", {0: 2, 1: 3})
    reader = guard.source()
    for _ in range(2):  # never taken as idle
        with pytest.raises(CheckpointMismatch) as e:
            reader.latestOffset({"t": {"0": 10, "1": 3}}, None)
        line = one_line(e)
        assert (
            f"job '{JOB}' topic 't' partition 0: txn_offsets stores offset 2 but the checkpoint starts the "
            "next micro-batch at 10, so the 8 messages from offset 2 would never be read" in line
        ), line
        assert "new checkpointLocation" in line
    assert offsets(guard.db) == {0: 2, 1: 3}
    # From the stored offsets it plans as ever.
    assert reader.latestOffset({"t": {"0": 2, "1": 3}}, None) == {"t": {"0": 10, "1": 3}}


def test_another_sinks_micro_batch_spark_has_not_committed_to_the_source_yet_leaves_the_query_idle(
    guard: Guard,
) -> None:
    """With a sink other than txstore's the offsets move at Spark's commit, which Spark makes only
    when it plans the next micro-batch: until then an idle query's start is the last planned
    micro-batch's end, past the stored offsets, and that is no mismatch."""
    reader, end = guard.read_first(6, 2)
    assert offsets(guard.db) == {0: 0, 1: 0}
    _idle(reader, end)
    again = guard.source()  # a restart before Spark's commit reached the source: the same
    reader.stop()
    _idle(again, end)
    again.commit(end)
    assert offsets(guard.db) == {0: 6, 1: 2}
    _idle(again, end)
    # Moved back since (a reset to 4, the checkpoint kept): that plan no longer explains the start.
    guard.db.execute("UPDATE txn_offsets SET off = 4 WHERE job = %s AND part = 0", (JOB,))
    with pytest.raises(
        CheckpointMismatch,
        match="partition 0: txn_offsets stores offset 4 but the checkpoint starts the next",
    ):
        again.latestOffset(end, None)


def test_a_checkpoint_at_the_log_ends_of_partitions_the_job_never_started_is_refused(guard: Guard) -> None:
    """An idle micro-batch does not ask the log start of a partition at its log end, but only
    where the job has a row: a partition it never started is decided from the real earliest
    offset (0 here), so a checkpoint at the log ends, of another job, is still refused."""
    guard.log(0, range(10))
    guard.log(1, range(4))
    reader = guard.source()
    line = (
        r"partition 0: the checkpoint starts this micro-batch at offset 10, but the job has no offset stored"
    )
    with pytest.raises(ForeignCheckpoint, match=line):
        reader.latestOffset({"t": {"0": 10, "1": 4}}, None)
    assert offsets(guard.db) == {}


def test_a_partition_the_checkpoint_leaves_out_is_stored_at_its_start_by_latest_offset_a_named_one_by_partitions(
    guard: Guard,
) -> None:
    guard.log(0, range(10))
    guard.log(1, range(4))
    reader = guard.source()
    begin = {"t": {"0": 0}}  # a checkpoint from before partition 1, of a job with no rows yet
    end = reader.latestOffset(begin, None)
    assert offsets(guard.db) == {1: 0}  # the partition it leaves out enters where the job starts it
    parts = reader.partitions(begin, end)
    assert offsets(guard.db) == {0: 0, 1: 0}  # the one it names, stored when its first batch is planned
    assert [(r.partition, r.from_offset, r.until_offset) for p in parts for r in p.ranges] == [(0, 0, 10)]


def test_a_replayed_micro_batch_is_checked_against_a_recreated_topic_s_id_before_it_is_read(
    guard: Guard,
) -> None:
    guard.fake.topic_ids["t"] = "id-one"
    guard.log(0, range(10))
    first = guard.source()
    begin = first.initialOffset()
    ids = "SELECT part, topic_id FROM txn_offsets WHERE job = %s ORDER BY part"
    assert guard.db.execute(ids, (JOB,)).fetchall() == [(0, "id-one")]  # stored at the query's start
    end = first.latestOffset(begin, None)
    first.stop()
    guard.fake.topic_ids["t"] = "id-two"  # deleted and recreated while the query was down
    restarted = guard.source()
    with pytest.raises(
        TopicRecreated, match=r"topic 't' partition 0: the topic was deleted and recreated"
    ) as told:
        restarted.partitions(begin, end)  # the restart replays the batch: no latestOffset() first
    # the reset, then the stream's step, once: "..., then restart the query with a new checkpointLocation"
    assert re.search(
        r"txstore reset --job .* --execute, then restart the query with a new checkpointLocation",
        str(told.value),
    )
    assert str(told.value).count("checkpointLocation") == 1, told.value
    with pytest.raises(TxstoreError, match="no planned micro-batch"):
        load_plan(guard.db, JOB)


def test_a_topic_recreated_with_the_same_offsets_stops_even_an_idle_query(guard: Guard) -> None:
    """Refilled to exactly the stored offsets, the new log has nothing past them to read; only its
    topic ID tells, and its messages would never be counted. An idle micro-batch asks an idle
    topic's ID every IDLE_TOPIC_ID_SECONDS, not every time: the query stops within that."""
    guard.fake.topic_ids["t"] = "id-one"
    _, reader, _, end = guard.counted_first(4)
    reader.commit(end)
    assert reader.latestOffset(end, None) == end  # idle
    guard.fake.topic_ids["t"] = "id-two"  # deleted and recreated, refilled to the same offsets
    started = time.monotonic()
    with pytest.raises(TopicRecreated, match=r"topic 't' partition 0: the topic was deleted and recreated"):
        while time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 10:
            assert reader.latestOffset(end, None) == end  # idle, its ID not asked again yet
            time.sleep(0.1)
    assert time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 2


def _idle(reader: TxstoreStreamReader, end: Any, times: int = 3) -> None:
    for _ in range(times):
        assert reader.latestOffset(end, None) == end


def test_an_idle_query_s_next_micro_batch_ends_past_a_new_message_at_once(guard: Guard) -> None:
    """An idle micro-batch is taken as the last one only while the log ends are the same: a new
    message ends it at the next ``latestOffset``, not when the idle topic's ID is due."""
    partition, reader, sink, end = guard.counted_first(4)
    reader.commit(end)
    _idle(reader, end)
    grow(partition, 6)
    new_end = reader.latestOffset(end, None)
    assert new_end == {"t": {"0": 6}}
    sink.commit([sink.write(iter(task)) for task in read(reader, reader.partitions(end, new_end))], 1)
    reader.commit(new_end)
    _idle(reader, new_end)
    assert reader.latestOffset(end, None) == {"t": {"0": 6}}  # from another start: planned anew


def test_an_end_an_idle_query_gave_out_and_its_caller_changed_is_a_new_start_not_the_idle_one(
    guard: Guard,
) -> None:
    """An idle micro-batch compares Spark's start with the end it gave out, as Spark gives it:
    what it gives out is a copy, so a start made by changing that very object is planned as
    the start it now is (here one past the log end: told, as from any other checkpoint)."""
    _, reader, _, end = guard.counted_first(4)
    reader.commit(end)
    _idle(reader, end)
    given = reader.latestOffset(end, None)
    assert given == end
    given["t"]["0"] = 6  # past the log end: the idle end would be given again, unchecked
    with pytest.raises(
        CheckpointMismatch,
        match=r"partition 0: the checkpoint starts this micro-batch at offset 6, beyond the log-end "
        r"offset 4, but txn_offsets stores offset 4, inside the log",
    ) as told:
        reader.latestOffset(given, None)
    assert str(told.value).count("checkpointLocation") == 1, told.value  # the stream's step, once


def test_a_row_forgotten_under_an_idle_query_is_told_at_its_next_micro_batch(guard: Guard) -> None:
    """An idle micro-batch compares the job's rows too: a partition's row deleted under the
    running query (as ``txstore reset --forget`` or an operator's SQL would) makes the checkpoint
    start a partition the job has no row for, told at once, not when a full plan is due."""
    _, reader, _, end = guard.counted_first(4)
    reader.commit(end)
    _idle(reader, end)
    guard.db.execute("DELETE FROM txn_offsets WHERE job = %s AND part = 0", (JOB,))
    guard.db.commit()
    with pytest.raises(
        ForeignCheckpoint, match="partition 0: the checkpoint starts this micro-batch at offset 4"
    ):
        reader.latestOffset(end, None)


def test_a_partition_added_under_an_idle_query_enters_within_seconds(guard: Guard) -> None:
    """An idle micro-batch asks no metadata: a partition added meanwhile enters when the idle
    topic's ID is due (IDLE_TOPIC_ID_SECONDS), where the job starts it, and is then read."""
    _, reader, _, end = guard.counted_first(4)
    reader.commit(end)
    _idle(reader, end)
    guard.log(1, range(3))
    started = time.monotonic()
    assert reader.latestOffset(end, None) == end  # not asked yet: the idle plan is not due
    while (
        later := reader.latestOffset(end, None)
    ) == end and time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 5:
        time.sleep(0.1)
    assert time.monotonic() - started < IDLE_TOPIC_ID_SECONDS + 2
    assert later == {"t": {"0": 4, "1": 0}}  # entered at its start (earliest), stored now
    assert offsets(guard.db) == {0: 4, 1: 0}
    assert reader.latestOffset(later, None) == {"t": {"0": 4, "1": 3}}


def test_a_topic_deleted_under_an_idle_query_stops_it_at_once_with_the_vanished_topic_line(
    guard: Guard,
) -> None:
    _, reader, _, end = guard.counted_first(4)
    reader.commit(end)
    _idle(reader, end)
    del guard.fake.logs[("t", 0)]
    with pytest.raises(
        UnknownTopic, match=r"topic 't' does not exist on Kafka at .* now, though the job stored"
    ):
        reader.latestOffset(end, None)


def test_a_start_outside_the_log_is_the_checkpoint_s_where_the_stored_offset_is_one_to_go_on_from() -> None:
    marks = [PartitionWatermarks("t", p, 4, 10) for p in range(4)]
    # Not the checkpoint's to answer for: no start, no row, the start the row's, a start in the log
    # (its ends included); each partition checked, not only up to the first of these.
    check_checkpoint_in_log(
        "j", {("t", 1): 12, ("t", 2): 12, ("t", 3): 10}, {("t", 0): 6, ("t", 2): 12, ("t", 3): 6}, marks
    )
    check_checkpoint_in_log("j", {("t", 0): 4, ("t", 1): 10}, {("t", 0): 6, ("t", 1): 6}, marks)
    for stored, inside in (
        (10, ", inside the log"),
        (4, ", inside the log"),
        (3, ""),
    ):  # the log's ends, below it
        with pytest.raises(CheckpointMismatch) as e:
            check_checkpoint_in_log(
                "j",
                {("t", 0): 6, ("t", 1): 12},
                {("t", 0): 6, ("t", 1): stored},
                marks,
                fail_on_data_loss=False,
            )
        assert one_line(e).startswith(
            "job 'j' topic 't' partition 1: the checkpoint starts this micro-batch at offset 12, beyond the "
            f"log-end offset 10, but txn_offsets stores offset {stored}{inside} (the checkpoint is an older copy"
        ), one_line(e)
    with pytest.raises(
        CheckpointMismatch,
        match="offset 3, below the log-start offset 4, but txn_offsets stores offset 4, inside",
    ):
        check_checkpoint_in_log("j", {("t", 2): 3}, {("t", 2): 4}, marks)
    # The stored offset outside the log too: the planner's line for it.
    with pytest.raises(OffsetOutOfLog, match="partition 1: stored offset 11 is beyond the log-end offset 10"):
        check_checkpoint_in_log("j", {("t", 1): 12}, {("t", 1): 11}, marks)
    with pytest.raises(DataLoss, match="partition 1: stored offset 3 is below the log-start offset 4"):
        check_checkpoint_in_log("j", {("t", 1): 12}, {("t", 1): 3}, marks)


def test_an_idle_start_past_the_stored_offset_is_a_mismatch_unless_the_last_plan_leads_there() -> None:
    stored = {("t", 0): 2, ("t", 1): 5, ("t", 2): 5}
    # No row, behind the row (failOnDataLoss false's recorded losses lead there), at the row, or the
    # last planned micro-batch's end from the row; each partition checked, not only the first.
    check_idle_start("j", {("t", 3): 9, ("t", 0): 1, ("t", 1): 5, ("t", 2): 7}, stored, {("t", 2): (5, 7)})
    for pending in ({}, {("t", 2): (4, 7)}, {("t", 2): (5, 6)}, {("t", 1): (5, 7)}):
        with pytest.raises(CheckpointMismatch) as e:
            check_idle_start("j", {("t", 0): 2, ("t", 1): 5, ("t", 2): 7}, stored, pending)
        assert one_line(e).startswith(
            "job 'j' topic 't' partition 2: txn_offsets stores offset 5 but the checkpoint starts the next "
            "micro-batch at 7, so the 2 messages from offset 5 would never be read"
        ), one_line(e)


def test_alignment_is_commit_replay_or_a_mismatch_naming_the_first_partition_off() -> None:
    ranges = batch_ranges(offsets_map({"t": {"0": 5, "1": 7}}), offsets_map({"t": {"0": 9, "1": 8}}))
    assert [(r.partition, r.from_offset, r.until_offset) for r in ranges] == [(0, 5, 9), (1, 7, 8)]
    assert check_alignment("j", ranges, {("t", 0): 5, ("t", 1): 7}) is True
    assert check_alignment("j", ranges, {("t", 0): 9, ("t", 1): 8}) is False
    for stored, what in (
        (
            {("t", 0): 5, ("t", 1): 8},
            "partition 1: txn_offsets stores offset 8 but the checkpoint starts "
            "this micro-batch at 7 (committed offsets would be read again",
        ),
        (
            {("t", 0): 9, ("t", 1): 7},
            "partition 0: txn_offsets stores offset 9 but the checkpoint starts "
            "this micro-batch at 5 (committed offsets would be read again",
        ),
        ({("t", 0): 5}, "partition 1: txn_offsets stores offset None"),
        (
            {("t", 0): 4, ("t", 1): 7},
            "offset 4 but the checkpoint starts this micro-batch at 5 (offsets would be skipped",
        ),
        ({("t", 0): 5, ("t", 1): 7}, None),
    ):
        if what is None:
            continue
        with pytest.raises(CheckpointMismatch) as e:
            check_alignment("j", ranges, stored)
        assert what in one_line(e)
    assert offsets_dict({("t", 1): 3, ("t", 0): 2, ("u", 0): 1}) == {"t": {"0": 2, "1": 3}, "u": {"0": 1}}
    assert offsets_map(None) == {}


def test_a_micro_batch_s_ranges_are_a_task_each_up_to_the_tasks_option_then_runs_of_neighbours() -> None:
    uneven = [OffsetRange("t", p, 0, size) for p, size in enumerate((10, 10, 400_000, 10))]
    assert micro_batch_tasks(uneven, 4) == [[r] for r in uneven]
    planned = [OffsetRange("t", p, 0, 1_000) for p in range(4)]
    assert micro_batch_tasks(planned, 4) == [[r] for r in planned]
    assert micro_batch_tasks(planned, None) == [[r] for r in planned]
    assert micro_batch_tasks(planned, 2) == [planned[:2], planned[2:]]
    assert micro_batch_tasks(planned, 3) != [[r] for r in planned] and len(micro_batch_tasks(planned, 3)) == 3


def test_a_job_of_the_same_name_streaming_into_another_database_is_neither_a_block_nor_named_as_the_holder(
    database_url: str, empty_database_url: str, fake_kafka: FakeKafka, readers: list[TxstoreStreamReader]
) -> None:
    """Advisory locks are per database: two txstore databases on one server (staging and
    production, say) may each run a query of a job of the same name. The holder a refusal names
    is the one of this database, so its line says what to do here."""
    with connect(empty_database_url, autocommit=True) as other:
        other.execute("SELECT set_config('application_name', 'txstore stream elsewhere:1', false)")
        other.execute("SELECT pg_advisory_lock(hashtextextended('txstore stream ' || %s, 0))", (JOB,))
        with connect(database_url, autocommit=True) as here:
            assert stream_lock_holder(here, JOB) is None
        log(fake_kafka, 0, range(3))
        first = source(readers, database_url)
        first.initialOffset()  # the other database's lock does not stop this query
        second = source(readers, database_url)
        with pytest.raises(StreamLocked) as e:
            second.initialOffset()
        line = one_line(e)
        assert "another readStream.format('txstore') of this job in this Spark application" in line
        assert "elsewhere" not in line


def test_a_second_query_of_the_job_is_refused_while_the_first_plans(
    database_url: str, fake_kafka: FakeKafka, readers: list[TxstoreStreamReader]
) -> None:
    log(fake_kafka, 0, range(3))
    first = source(readers, database_url)
    first.initialOffset()
    second = source(readers, database_url)
    with pytest.raises(StreamLocked) as e:
        second.initialOffset()
    assert "another readStream.format('txstore') of this job in this Spark application" in one_line(e)
    with connect(database_url, autocommit=True) as conn:  # the refused session is closed; the first's stays
        deadline = time.monotonic() + 10
        while True:
            (sessions,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'txstore stream %%'"
            ).fetchone() or (None,)
            if sessions == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert sessions == 1
    first.stop()
    assert second.initialOffset() == {"t": {"0": 0}}
    with connect(database_url) as conn:  # the planner holds the job's stream lock and its shared job lock
        held = conn.execute(
            "SELECT l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database() "
            "AND a.application_name LIKE 'txstore stream %%' ORDER BY 1"
        ).fetchall()
    assert held == [("ExclusiveLock",), ("ShareLock",)]


def test_a_topic_gone_from_kafka_that_the_job_counted_is_no_typo(guard: Guard) -> None:
    reader = guard.source()
    with pytest.raises(
        UnknownTopic,
        match=r"topic 't' does not exist on Kafka at fake:9092; check .option\('subscribe', \.\.\.\)",
    ):
        reader.initialOffset()
    seed(guard.db, JOB, "t", {0: 3, 1: 3})
    with pytest.raises(UnknownTopic) as e:
        reader.initialOffset()
    assert "does not exist on Kafka at fake:9092 now, though the job stored offsets for 2 of its" in one_line(
        e
    )


def test_the_counting_source_takes_only_its_own_columns(database_url: str) -> None:
    with pytest.raises(ConfigError, match="has the columns topic string, partition int, txstore_from bigint"):
        stream_reader(
            {
                "kafka.bootstrap.servers": "f:1",
                "subscribe": "t",
                "txstore.job": JOB,
                "txstore.databaseUrl": database_url,
                "txstore.countMessages": "true",
            },
            ROWS_SCHEMA,
        )


def test_a_task_that_fails_after_its_first_range_leaves_no_receipt_and_its_plan_is_not_committed(
    guard: Guard,
) -> None:
    """The ``after-first-range`` fail point (a task dying mid-read): the task yielded its first
    range's rows only, recorded nothing, and the sink refuses the plan."""
    from txstore.core.failpoints import InjectedFailure

    guard.log(0, range(3))
    guard.log(1, range(4))
    failing = {"txstore.tasks": "1", "txstore.failpoints": "after-first-range"}
    reader = guard.source(**failing)
    _, _, parts = plan(reader)
    (task,) = parts
    got: list[int] = []
    with pytest.raises(InjectedFailure):
        for batch in reader.read(task):
            got += batch.column("offset").to_pylist()
    assert got == [0, 1, 2]  # the first range's messages, none of the second's
    assert load_reads(guard.db, JOB, task.plan_id) == []
    sink = guard.writer()
    with pytest.raises(MicroBatchNotRead):
        sink.commit([sink.write(iter([of(0, 0, 1, 2)]))], 0)
    assert offsets(guard.db) == {0: 0, 1: 0}
    reader.stop()
    guard.readers.clear()
    counting = guard.source(COUNT_SCHEMA, **{"txstore.countMessages": "true", **failing})
    (single,) = counting.partitions({"t": {"0": 0}}, {"t": {"0": 3}})
    with pytest.raises(InjectedFailure):
        list(counting.read(single))  # a task of one range: it fails once that range is read
    assert load_reads(guard.db, JOB, single.plan_id) == []


def test_a_source_refuses_a_database_without_txstore_s_tables(
    empty_database_url: str, fake_kafka: FakeKafka, readers: list[TxstoreStreamReader]
) -> None:
    from txstore.core.errors import SchemaMissing

    log(fake_kafka, 0, range(3))
    with pytest.raises(SchemaMissing, match="the txstore tables are missing"):
        source(readers, empty_database_url).initialOffset()


def test_a_range_carries_its_partition_s_generation_and_verifies_the_last_message_only_while_kafka_has_it(
    guard: Guard,
) -> None:
    first = guard.log(0, range(1))
    second = guard.log(1, range(3))
    reader = guard.source()
    _, end, parts = plan(reader)
    sink = guard.writer()
    sink.commit([sink.write(iter(t)) for t in read(reader, parts)], 0)
    guard.db.execute("UPDATE txn_offsets SET generation = 3 WHERE job = %s AND part = 1", (JOB,))
    grow(first, 4)  # the last message counted, offset 0, is the log's first: verified
    grow(second, 6)
    second.low = 3  # the last counted, offset 2, aged out: nothing to verify
    _, end, parts = plan(reader, end)
    ranges = {r.partition: r for p in parts for r in p.ranges}
    assert ranges[0].verify == fingerprint(first.messages[0]) and ranges[0].generation == 0
    assert ranges[1].verify is None and ranges[1].generation == 3


def test_a_micro_batch_whose_offsets_moved_in_part_is_left_alone_by_the_source_s_commit(guard: Guard) -> None:
    reader, end = guard.read_first(4, 4)
    guard.db.execute("UPDATE txn_offsets SET off = 4 WHERE job = %s AND part = 1", (JOB,))
    reader.commit(end)
    assert offsets(guard.db) == {0: 0, 1: 4} and committed_by(guard.db) is None
    guard.db.execute("UPDATE txn_offsets SET off = 2 WHERE job = %s AND part = 0", (JOB,))
    reader.commit(end)
    assert offsets(guard.db) == {0: 2, 1: 4} and committed_by(guard.db) is None


# -- the source's commit when the sink is not txstore's -----------------------------------------------


def test_another_sinks_micro_batch_moves_the_offsets_when_spark_commits_it(
    guard: Guard, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark's file sink or foreachBatch wrote the micro-batch: the source's commit moves the
    offsets from the planned starts to the planned ends, with the last messages read."""
    reader, end = guard.read_first(6, 2)
    reader.commit({"t": {"0": 5, "1": 2}})  # another micro-batch's end: nothing
    assert offsets(guard.db) == {0: 0, 1: 0}
    with caplog.at_level(logging.INFO, logger="txstore"):
        reader.commit(end)
    assert offsets(guard.db) == {0: 6, 1: 2} and last_counted(guard.db) == {0: 5, 1: 1}
    assert committed_by(guard.db) == CHECKPOINT_LED
    assert caplog.text.count("txn_offsets now follows Spark's checkpoint") == 1
    assert total(guard.db) == 0

    # Spark committed the next micro-batch but stopped before the source's commit: the next
    # planning finds txn_offsets at that batch's start and moves it first.
    grow(guard.fake.logs[("t", 0)], 9)
    _, end2, parts = plan(reader, end)
    read(reader, parts)
    grow(guard.fake.logs[("t", 0)], 11)
    again = guard.source()
    reader.stop()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="txstore"):
        _, end3, parts = plan(again, end2)
    assert "now follows" not in caplog.text  # said once, when the job became checkpoint-led
    assert offsets(guard.db) == {0: 9, 1: 2} and last_counted(guard.db)[0] == 8
    assert [r for p in parts for r in p.ranges] == [OffsetRange("t", 0, 9, 11)]
    assert end3 == {"t": {"0": 11, "1": 2}}


def test_a_checkpoint_led_job_only_catches_up_from_the_batch_spark_committed(guard: Guard) -> None:
    reader, end = guard.read_first(6, 6)
    # Not checkpoint-led (no commit noted): a start past txn_offsets is a mismatch.
    with pytest.raises(CheckpointMismatch):
        reader.partitions(end, {"t": {"0": 6, "1": 6}})
    assert offsets(guard.db) == {0: 0, 1: 0}
    reader.partitions({"t": {"0": 0, "1": 0}}, end)
    reader.commit(end)
    assert committed_by(guard.db) == CHECKPOINT_LED
    grow(guard.fake.logs[("t", 0)], 10)
    grow(guard.fake.logs[("t", 1)], 10)
    _, end2, parts = plan(reader, end)
    read(reader, parts)
    with pytest.raises(CheckpointMismatch):  # one partition starts past the planned batch's end
        reader.partitions({"t": {"0": 10, "1": 8}}, {"t": {"0": 10, "1": 10}})
    assert offsets(guard.db) == {0: 6, 1: 6}
    guard.db.execute("UPDATE txn_offsets SET off = 7 WHERE job = %s AND part = 1", (JOB,))
    with pytest.raises(CheckpointMismatch):  # txn_offsets is not at the planned batch's start
        reader.partitions(end2, {"t": {"0": 10, "1": 10}})
    assert offsets(guard.db) == {0: 6, 1: 7}


def test_catching_up_with_spark_still_checks_the_partitions_the_last_plan_did_not_read(guard: Guard) -> None:
    guard.log(0, range(6))
    guard.log(1, range(4))
    seed(guard.db, JOB, "t", {0: 0, 1: 4})
    reader = guard.source()
    _, end, parts = plan(reader)
    read(reader, parts)
    reader.commit(end)
    grow(guard.fake.logs[("t", 0)], 8)
    _, end, parts = plan(reader, end)
    assert end == {"t": {"0": 8, "1": 4}}
    read(reader, parts)  # Spark committed it; the source's commit never came
    guard.db.execute("UPDATE txn_offsets SET off = 2 WHERE job = %s AND part = 1", (JOB,))
    with pytest.raises(
        CheckpointMismatch, match="partition 1: txn_offsets stores offset 2 but the checkpoint"
    ):
        reader.partitions(end, end)
    assert offsets(guard.db) == {0: 8, 1: 2}  # caught up with the batch Spark committed; partition 1 is off


def test_a_batch_the_txstore_sink_committed_is_noted_so_and_never_moved_again(guard: Guard) -> None:
    guard.log(0, range(4))
    reader = guard.source()
    _, end, parts = plan(reader)
    batches = read(reader, parts)
    reader.commit(end)  # checkpoint-led first
    assert committed_by(guard.db) == CHECKPOINT_LED
    grow(guard.fake.logs[("t", 0)], 6)
    _, end, parts = plan(reader, end)
    sink = guard.writer()
    sink.commit([sink.write(iter(t)) for t in read(reader, parts)], 1)
    assert offsets(guard.db) == {0: 6}
    reader.commit(end)
    assert committed_by(guard.db) == SINK_COMMITTED and offsets(guard.db) == {0: 6} and total(guard.db) == 2
    assert batches


# -- the results-table sink ---------------------------------------------------------------------------

SALES = {"txstore.table": "stream_guard_sales", "txstore.key": "country", "txstore.merge": "items=sum"}
SALE_ROWS = StructType(
    [*ROWS_SCHEMA.fields, StructField("country", StringType()), StructField("items", LongType())]
)


def sales_table(db: psycopg.Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS stream_guard_sales (country text PRIMARY KEY, items bigint)")


def sales(db: psycopg.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT country, items FROM stream_guard_sales").fetchall())


def sale_batch(batch: pa.RecordBatch, country: str = "fr", items: int = 2) -> pa.RecordBatch:
    n = batch.num_rows
    return pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array([country] * n), pa.array([items] * n, pa.int64())],
        names=["topic", "partition", "offset", "country", "items"],
    )


def test_a_table_sink_merges_a_micro_batch_s_rows_once_with_its_offsets(guard: Guard) -> None:
    sales_table(guard.db)
    guard.log(0, range(5))
    guard.log(1, range(3))
    reader = guard.source()
    _, end, parts = plan(reader)
    batches = read(reader, parts)
    sink = guard.writer(SALE_ROWS, **SALES)
    messages = [sink.write(iter([sale_batch(b) for b in task])) for task in batches]
    assert isinstance(messages[0], TableRows) and messages[0].seen == {("t", 0): (0, 4)}
    outside = sink.write(iter([sale_batch(of(0, 5))]))
    with pytest.raises(
        RowsOutsideBatch, match=r"partition 0 offsets 0..5, outside this micro-batch's range \[0, 5\)"
    ):
        sink.commit([*messages, outside], 0)
    with pytest.raises(RowsOutsideBatch, match=r"partition 0 offsets 0\.\.5"):
        sink.commit([sink.write(iter([sale_batch(of(0, 0, 1)), sale_batch(of(0, 5))]))], 0)
    unplaced = sink.write(iter([sale_batch(rows(("t", 0, None)))]))
    with pytest.raises(RowsOutsideBatch, match=r"offsets -1\.\.-1"):
        sink.commit([unplaced], 0)
    with pytest.raises(MicroBatchNotRead):
        sink.commit([], 0)
    assert sales(guard.db) == {} and offsets(guard.db) == {0: 0, 1: 0}
    sink.commit(messages, 0)
    assert (
        sales(guard.db) == {"fr": 16}
        and offsets(guard.db) == {0: 5, 1: 3}
        and last_counted(guard.db) == {0: 4, 1: 2}
    )
    sink.commit(messages, 0)  # replayed: merged once
    assert sales(guard.db) == {"fr": 16} and offsets(guard.db) == {0: 5, 1: 3}
    reader.commit(end)
    assert committed_by(guard.db) == SINK_COMMITTED
    grow(guard.fake.logs[("t", 1)], 5)
    _, end, parts = plan(reader, end)
    # the next micro-batch: rows of two countries, one refused by the table (a NULL key), skipped
    task = read(reader, parts)[0]
    split = [sale_batch(task[0].slice(0, 1), "de", 1), sale_batch(task[0].slice(1), None, 5)]  # type: ignore[arg-type]
    with pytest.raises(TxstoreError, match="offset 4"):
        sink.commit([sink.write(iter(split))], 1)
    skipping = guard.writer(SALE_ROWS, **SALES, **{"txstore.onBadMessage": "skip"})
    skipping.commit([skipping.write(iter(split))], 1)
    assert sales(guard.db) == {"fr": 16, "de": 1} and offsets(guard.db) == {0: 5, 1: 5}
    bad = "SELECT part, off FROM txn_bad_messages WHERE job = %s"
    assert guard.db.execute(bad, (JOB,)).fetchall() == [(1, 4)]


def test_a_table_sink_refuses_what_it_could_not_merge_exactly_once(
    database_url: str, db: psycopg.Connection
) -> None:
    sales_table(db)
    with pytest.raises(ConfigError, match="does not take outputMode\\('complete'\\)"):
        writer(database_url, SALE_ROWS, overwrite=True, **SALES)
    no_offset = StructType([f for f in SALE_ROWS.fields if f.name != "offset"])
    with pytest.raises(ConfigError, match="the query's rows have no offset column"):
        writer(database_url, no_offset, **SALES)
    rounding = StructType(
        [*ROWS_SCHEMA.fields, StructField("country", StringType()), StructField("items", StringType())]
    )
    with pytest.raises(ResultsTableInvalid):
        writer(database_url, rounding, **SALES)
    assert writer(database_url, SALE_ROWS, **SALES).types
    extra = StructType([*SALE_ROWS.fields, StructField("note", StringType())])
    with pytest.raises(
        ResultsTableInvalid, match=r"query column note: neither a txstore\.key nor in txstore\.merge"
    ):
        writer(database_url, extra, **SALES)
    with pytest.raises(ConfigError, match=r"txstore\.onBadMessage skip needs txstore\.table"):
        parse_sink_options(
            {"txstore.job": JOB, "txstore.databaseUrl": database_url, "txstore.onBadMessage": "skip"}, {}
        )


def test_a_table_sink_takes_the_lowest_and_highest_offset_of_a_task_s_batches(guard: Guard) -> None:
    sales_table(guard.db)
    guard.log(0, range(5))
    reader = guard.source()
    _, _, parts = plan(reader)
    read(reader, parts)
    sink = guard.writer(SALE_ROWS, **SALES)
    task = sink.write(iter([sale_batch(of(0, 2, 6)), sale_batch(of(0, 0, 1))]))
    assert task.seen == {("t", 0): (0, 6)}
    with pytest.raises(RowsOutsideBatch, match=r"partition 0 offsets 0\.\.6, outside"):
        sink.commit([task], 0)
    later = sink.write(iter([sale_batch(of(0, 3)), sale_batch(of(0, 1, 2))]))
    with pytest.raises(RowsOutsideBatch, match=r"partition 0 offsets 0\.\.6, outside"):
        sink.commit([sink.write(iter([sale_batch(of(0, 0))])), later, task], 0)
    with pytest.raises(RowsOutsideBatch, match=r"partition 0 offsets 0\.\.6, outside"):
        sink.commit([task, later], 0)
    assert sales(guard.db) == {} and offsets(guard.db) == {0: 0}


def test_a_table_sink_s_replace_rule_keeps_the_last_row_spark_wrote(guard: Guard) -> None:
    guard.db.execute("CREATE TABLE IF NOT EXISTS stream_guard_last (country text PRIMARY KEY, items bigint)")
    guard.log(0, range(6))
    reader = guard.source()
    _, _, parts = plan(reader)
    (task,) = read(reader, parts)
    (batch,) = task
    last = {"txstore.table": "stream_guard_last", "txstore.key": "country", "txstore.merge": "items=replace"}
    sink = guard.writer(SALE_ROWS, **last)
    pieces = [sale_batch(batch.slice(0, 3), "fr", 1), sale_batch(batch.slice(3, 1), "fr", 2)]
    pieces.append(sale_batch(batch.slice(4), "fr", 3))
    sink.commit([sink.write(iter(pieces))], 0)
    assert dict(guard.db.execute("SELECT country, items FROM stream_guard_last").fetchall()) == {"fr": 3}


def test_a_sink_s_replayed_or_skipped_micro_batch_says_so_and_a_fail_point_before_its_commit_writes_nothing(
    guard: Guard, caplog: pytest.LogCaptureFixture
) -> None:
    from txstore.core.failpoints import InjectedFailure

    sales_table(guard.db)
    guard.log(0, range(3))
    reader = guard.source()
    _, end, parts = plan(reader)
    (task,) = read(reader, parts)
    for options, batches in (({}, task), (SALES, [sale_batch(b) for b in task])):
        schema = SALE_ROWS if options else ROWS_SCHEMA
        failing = guard.writer(schema, **options, **{"txstore.failpoints": "before-commit@first"})
        with pytest.raises(InjectedFailure):
            failing.commit([failing.write(iter(batches))], 0)
        assert offsets(guard.db) == {0: 0} and total(guard.db) == 0 and sales(guard.db) == {}
    counts = guard.writer()
    counts.commit([counts.write(iter(task))], 0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="txstore"):
        counts.commit([counts.write(iter(task))], 0)
    assert "micro-batch 0 (t/0 0 -> 3) already committed; skipped" in caplog.text
    table = guard.writer(SALE_ROWS, **SALES)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="txstore"):
        table.commit([table.write(iter([sale_batch(b) for b in task]))], 0)
    assert "micro-batch 0 (t/0 0 -> 3) already committed; skipped" in caplog.text
    assert sales(guard.db) == {} and total(guard.db) == 3
    # a sink that fails right after its COMMIT returned has committed: the merge and the offsets
    # are in PostgreSQL (its own transaction, not a savepoint of the reads before it)
    grow(guard.fake.logs[("t", 0)], 4)
    _, end, parts = plan(reader, end)
    (task,) = read(reader, parts)
    after = guard.writer(SALE_ROWS, **SALES, **{"txstore.failpoints": "after-commit@first"})
    with pytest.raises(InjectedFailure):
        after.commit([after.write(iter([sale_batch(b) for b in task]))], 1)
    assert sales(guard.db) == {"fr": 2} and offsets(guard.db) == {0: 4}
    # a micro-batch with a refused row, skipped: said once per range
    grow(guard.fake.logs[("t", 0)], 6)
    _, end, parts = plan(reader, end)
    (task,) = read(reader, parts)
    skipping = guard.writer(SALE_ROWS, **SALES, **{"txstore.onBadMessage": "skip"})
    refused = [sale_batch(task[0].slice(0, 1), None, 1), sale_batch(task[0].slice(1), "fr", 4)]  # type: ignore[arg-type]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="txstore"):
        skipping.commit([skipping.write(iter(refused))], 2)
    assert "micro-batch 2: range t/0 4 -> 6: skipped 1 message" in caplog.text
    assert sales(guard.db) == {"fr": 6} and offsets(guard.db) == {0: 6}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="txstore"):
        skipping.commit([skipping.write(iter(refused))], 2)  # replayed after its commit
    assert "micro-batch 2 (t/0 4 -> 6) already committed; skipped" in caplog.text
    assert sales(guard.db) == {"fr": 6}


# -- txn_stream_plans and txn_stream_reads ------------------------------------------------------------

A0 = OffsetRange("t", 0, 10, 20, generation=2, log_end=30)
A1 = OffsetRange("t", 1, 0, 5)
EMPTY = OffsetRange("t", 2, 7, 7, log_end=None)
LAST = Fingerprint(19, 1_019, "d19")


def receipt(
    task: int, stage: int = 1, query: str | None = "q", batch: int | None = 3, run: str | None = "r"
) -> Receipt:
    reads = (RangeRead(A0, 9, LAST),) if task == 0 else (RangeRead(A1, 5, None),)
    return Receipt(task, stage, task, query, batch, reads, run)


def test_a_saved_plan_loads_back_with_its_ranges_tasks_and_who_committed_it(
    database_url: str, db: psycopg.Connection
) -> None:
    with connect(database_url) as conn:
        plan_id = save_plan(conn, JOB, {"t": {"0": 10}}, {"t": {"0": 20}}, [A0, A1, EMPTY], [[A0], [A1]])
        assert plan_id == plan_identity(JOB, {"t": {"0": 10}}, {"t": {"0": 20}})
        loaded = load_plan(conn, JOB)
        assert loaded == StreamPlan(plan_id, (A0, A1, EMPTY), 2, {("t", 0): 0, ("t", 1): 1}, None)
        assert [(r.generation, r.log_end) for r in loaded.ranges] == [(2, 30), (0, None), (0, None)]
        assert loaded.reading == (A0, A1)
        mark_committed(conn, JOB, "another plan", SINK_COMMITTED)
        assert load_plan(conn, JOB).committed_by is None
        mark_committed(conn, JOB, plan_id, CHECKPOINT_LED)
        mark_committed(conn, "other job", plan_id, SINK_COMMITTED)
        assert load_plan(conn, JOB).committed_by == CHECKPOINT_LED
        # the next plan keeps who committed the last one
        save_plan(conn, JOB, {"t": {"0": 20}}, {"t": {"0": 25}}, [OffsetRange("t", 0, 20, 25)])
        assert load_plan(conn, JOB).committed_by == CHECKPOINT_LED and load_plan(conn, JOB).tasks == 0
        with pytest.raises(TxstoreError, match="job 'nobody': no planned micro-batch in txn_stream_plans"):
            load_plan(conn, "nobody")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_plan_s_identity_is_its_job_start_and_end() -> None:
    same = plan_identity("j", {"t": {"0": 1}}, {"t": {"0": 2}})
    assert same == plan_identity("j", {"t": {"0": 1}}, {"t": {"0": 2}})
    # Spark's offsets, whatever the order of their keys
    assert plan_identity("j", {"u": {"1": 5, "0": 1}, "t": {}}, {}) == plan_identity(
        "j", {"t": {}, "u": {"0": 1, "1": 5}}, {}
    )
    assert (
        len(
            {
                same,
                plan_identity("k", {"t": {"0": 1}}, {"t": {"0": 2}}),
                plan_identity("j", {"t": {"0": 1}}, {"t": {"0": 3}}),
            }
        )
        == 3
    )


def test_a_plan_s_row_and_receipts_are_its_job_s_and_its_own_only(
    database_url: str, db: psycopg.Connection
) -> None:
    with connect(database_url) as conn:
        plan_id = save_plan(conn, JOB, {"s": 3}, {"e": 3}, [A0, A1], [[A0], [A1]])
        for job in ("a_job", "z_job"):  # jobs named before and after this one
            save_plan(conn, job, {"s": 3}, {"e": 3}, [A1], [[A1]])
            record_read(conn, job, plan_id, receipt(1))  # the same plan id, another job
            mark_committed(conn, job, plan_id, SINK_COMMITTED)
        for late in ("", "~"):  # a late task's receipt of an older or a newer plan
            record_read(conn, JOB, late, receipt(0, stage=9))
            mark_committed(conn, JOB, late, SINK_COMMITTED)
        record_read(conn, JOB, plan_id, receipt(0))
        assert load_reads(conn, JOB, plan_id) == [receipt(0)]
        assert load_plan(conn, JOB).committed_by is None and load_plan(conn, JOB).ranges == (A0, A1)
        assert load_plan(conn, "a_job").ranges == (A1,) and load_plan(conn, "z_job").ranges == (A1,)
        for nobody in ("0_job", "m_job", "zz_job"):
            with pytest.raises(TxstoreError, match=f"job {nobody!r}: no planned micro-batch"):
                load_plan(conn, nobody)
        save_plan(conn, JOB, {"s": 4}, {"e": 4}, [A0], [[A0]])
        assert load_reads(conn, JOB, "") == [] and load_reads(conn, JOB, "~") == []
        assert load_reads(conn, "a_job", plan_id) == [receipt(1)] == load_reads(conn, "z_job", plan_id)


def test_receipts_of_an_older_plan_are_deleted_when_the_next_plan_is_saved(
    database_url: str, db: psycopg.Connection
) -> None:
    with connect(database_url) as conn:
        first = save_plan(conn, JOB, {"s": 1}, {"e": 1}, [A0, A1], [[A0], [A1]])
        other = save_plan(conn, "other", {"s": 1}, {"e": 1}, [A0], [[A0]])
        record_read(conn, JOB, first, receipt(0))
        record_read(conn, JOB, first, receipt(1))
        record_read(conn, "other", other, receipt(0))
        assert load_reads(conn, JOB, first) == [receipt(0), receipt(1)]
        assert save_plan(conn, JOB, {"s": 1}, {"e": 1}, [A0, A1], [[A0], [A1]]) == first  # planned again
        assert load_reads(conn, JOB, first) == [receipt(0), receipt(1)]
        second = save_plan(conn, JOB, {"s": 2}, {"e": 2}, [A0], [[A0]])
        assert load_reads(conn, JOB, first) == [] and load_reads(conn, JOB, second) == []
        assert load_reads(conn, "other", other) == [receipt(0)]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_retried_task_s_receipt_replaces_its_own_and_keeps_the_others(
    database_url: str, db: psycopg.Connection
) -> None:
    with connect(database_url) as conn:
        plan_id = save_plan(conn, JOB, {"s": 1}, {"e": 1}, [A0, A1], [[A0], [A1]])
        record_read(conn, JOB, plan_id, receipt(1, stage=4, query=None, batch=None, run=None))
        record_read(conn, JOB, plan_id, receipt(0, stage=4))
        record_read(conn, JOB, plan_id, receipt(0, stage=4, run="r2", batch=4))  # the same task again
        record_read(conn, JOB, plan_id, receipt(0, stage=2))  # another stage: a second read
        assert load_reads(conn, JOB, plan_id) == [
            receipt(0, stage=2),
            receipt(0, stage=4, run="r2", batch=4),
            receipt(1, stage=4, query=None, batch=None, run=None),
        ]


# -- the verification (txstore.core.micro_batch) -----------------------------------------------------

PLAN = StreamPlan("p", (A0, A1, EMPTY), 2, {("t", 0): 0, ("t", 1): 1})
RUN = ("q", 3, "r")


def spans(**by_partition: list[tuple[int, int]]) -> Delivery:
    return Delivery(frozenset({RUN}), {("t", int(p[1:])): s for p, s in by_partition.items()})


def counts(*rows_: tuple[OffsetRange, int]) -> Delivery:
    return Delivery(frozenset({RUN}), counts=list(rows_))


def test_micro_batch_verified_returns_each_planned_range_s_read() -> None:
    reads = verify_micro_batch("j", 3, PLAN, [receipt(0), receipt(1)], spans(p0=[(10, 19)], p1=[(0, 5)]))
    assert reads == {("t", 0): RangeRead(A0, 9, LAST), ("t", 1): RangeRead(A1, 5, None)}
    # no task of the query ran at all (no Spark: query, batch and run None): a nameless run is ours
    nameless = [receipt(0, query=None, batch=None, run=None), receipt(1, query=None, batch=None, run=None)]
    assert verify_micro_batch("j", 7, PLAN, nameless, Delivery(frozenset({(None, None, None)}))) == reads
    # a range of one message is read like any other
    one = OffsetRange("t", 4, 3, 4)
    single = StreamPlan("s", (one,), 1, {("t", 4): 0})
    assert single.reading == (one,)
    with pytest.raises(MicroBatchNotRead, match="no task of this query read it"):
        verify_micro_batch("j", 3, single, [], spans(p4=[(3, 4)]))
    # a plan with nothing to read and no rows: nothing to verify
    assert verify_micro_batch("j", 3, StreamPlan("e", (EMPTY,), 0), [], Delivery(frozenset())) == {}


def test_micro_batch_rows_of_an_empty_plan_or_a_second_run_are_not_this_query_s() -> None:
    empty = StreamPlan("e", (EMPTY,), 0)
    with pytest.raises(
        MicroBatchNotRead, match="received no rows from any task, yet the job's planned micro-batch has 0"
    ):
        verify_micro_batch("j", 3, empty, [], Delivery(frozenset(), {("t", 2): [(7, 8)]}))
    with pytest.raises(MicroBatchNotRead, match="received no rows"):
        verify_micro_batch("j", 3, empty, [], Delivery(frozenset(), counts=[(EMPTY, 0)]))
    two = Delivery(frozenset({RUN, ("q", 3, "r2")}))
    with pytest.raises(
        MicroBatchNotRead, match="the sink's tasks ran in query q micro-batch 3, query q micro-batch 3"
    ):
        verify_micro_batch("j", 3, PLAN, [receipt(0), receipt(1)], two)
    with pytest.raises(
        MicroBatchNotRead, match=r"the sink's tasks ran in .*query unknown micro-batch unknown"
    ):
        verify_micro_batch("j", 3, PLAN, [], Delivery(frozenset({RUN, (None, None, None)})))
    with pytest.raises(MicroBatchNotRead, match="tasks ran in query q micro-batch 4"):
        verify_micro_batch("j", 3, PLAN, [receipt(0), receipt(1)], Delivery(frozenset({("q", 4, "r")})))


def test_micro_batch_receipts_of_another_batch_or_run_do_not_stand_for_this_one() -> None:
    ours = [receipt(0), receipt(1)]
    with pytest.raises(MicroBatchNotRead) as e:
        verify_micro_batch("j", 3, PLAN, [receipt(0), receipt(1, batch=2)], spans())
    assert (
        "(t/1 0 -> 5, ...) was not read by this micro-batch: it was read by query q micro-batch 2"
        in one_line(e)
    )
    with pytest.raises(MicroBatchNotRead, match=r"planned micro-batch \(t/1 0 -> 5\) was not"):
        verify_micro_batch("j", 3, StreamPlan("p", (A1,), 1, {("t", 1): 0}), [], spans())
    assert verify_micro_batch("j", 3, PLAN, [receipt(0, batch=None), receipt(1)], spans())
    with pytest.raises(MicroBatchNotRead, match="read by query q micro-batch 3"):
        verify_micro_batch("j", 3, PLAN, [receipt(0), receipt(1, run="old")], spans())
    with pytest.raises(MicroBatchNotRead, match="read by query x micro-batch 3"):
        verify_micro_batch("j", 3, PLAN, [receipt(0), receipt(1, query="x")], spans())
    # a plan without tasks noted: every range is task 0's
    untasked = StreamPlan("p", (A0, A1), 1)
    both = Receipt(0, 1, 0, "q", 3, (RangeRead(A0, 9, LAST), RangeRead(A1, 5, None)), "r")
    assert verify_micro_batch("j", 3, untasked, [both], spans()) == verify_micro_batch(
        "j", 3, PLAN, ours, spans()
    )
    with pytest.raises(MicroBatchNotRead, match=r"planned micro-batch \(t/0 10 -> 20, \.\.\.\) was not read"):
        verify_micro_batch("j", 3, untasked, [], spans())
    # a receipt that names another range than planned (an older plan of the same shape)
    stale = Receipt(1, 1, 1, "q", 3, (RangeRead(OffsetRange("t", 1, 0, 4), 4, None),), "r")
    with pytest.raises(MicroBatchNotRead, match="no task of this query read range t/1 0 -> 5"):
        verify_micro_batch("j", 3, PLAN, [receipt(0), stale], spans())
    missing = Receipt(1, 1, 1, "q", 3, (), "r")
    with pytest.raises(MicroBatchNotRead, match="no task of this query read range t/1 0 -> 5"):
        verify_micro_batch("j", 3, PLAN, [receipt(0), missing], spans())


def test_micro_batch_a_task_read_as_two_partitions_is_read_twice() -> None:
    again = Receipt(1, 1, 5, "q", 3, (RangeRead(A1, 5, None),), "r")
    with pytest.raises(MicroBatchReadTwice) as e:
        verify_micro_batch("j", 3, PLAN, [receipt(0), receipt(1), again], spans())
    assert "(range t/1 0 -> 5 was read as 2 Spark partitions" in one_line(e)
    assert verify_micro_batch("j", 3, PLAN, [receipt(0), receipt(1), receipt(1)], spans())
    untasked = StreamPlan("p", (A1,), 1)
    first = Receipt(0, 1, 1, "q", 3, (RangeRead(A1, 5, None),), "r")
    with pytest.raises(MicroBatchReadTwice, match="range t/1 0 -> 5 was read"):
        verify_micro_batch("j", 3, untasked, [first, replace(first, spark_partition=5)], spans())
    # a receipt of a task the plan does not name is no read of a planned range
    with pytest.raises(MicroBatchReadTwice, match="range t/0 10 -> 20 was read as 2"):
        verify_micro_batch(
            "j",
            3,
            PLAN,
            [receipt(0), receipt(1), Receipt(7, 1, 3, "q", 3, (), "r"), Receipt(7, 2, 3, "q", 3, (), "r")],
            spans(),
        )


def test_micro_batch_row_spans_must_lie_in_their_range_once_and_no_more_than_were_read() -> None:
    ok = [receipt(0), receipt(1)]
    assert verify_micro_batch("j", 3, PLAN, ok, spans(p0=[(10, 12), (12, 19)], p1=[(0, 5)], p2=[]))
    assert verify_micro_batch("j", 3, PLAN, ok, spans(p0=[(19, 20)]))
    for given, text in (
        (spans(p0=[(9, 11)]), r"offsets 9..10, outside this micro-batch's range \[10, 20\)"),
        (spans(p0=[(12, 13), (19, 21)]), r"offsets 12..20, outside"),
        (spans(p3=[(0, 1)]), "partition 3 offsets 0..0, outside this micro-batch's range none"),
        (spans(p2=[], p3=[(0, 1)]), "partition 3 offsets 0..0, outside"),  # a partition without rows first
        (spans(p2=[(7, 8)]), r"partition 2 offsets 7..7, outside this micro-batch's range none"),
    ):
        with pytest.raises(RowsOutsideBatch, match=text):
            verify_micro_batch("j", 3, PLAN, ok, given)
    with pytest.raises(RowsRepeated, match="partition 1 offset 3 "):
        verify_micro_batch("j", 3, PLAN, ok, spans(p1=[(0, 4), (3, 4)]))
    with pytest.raises(RowsRepeated, match="partition 0 offset 10 "):
        verify_micro_batch("j", 3, PLAN, ok, spans(p0=[(10, 11), (10, 11)]))
    with pytest.raises(RowsRepeated) as e:
        verify_micro_batch("j", 3, PLAN, ok, spans(p0=[(10, 20)]))
    assert (
        "received 10 rows of distinct offsets of topic 't' partition 0 range [10, 20), which holds 9"
        in one_line(e)
    )
    # a repeated offset outside the plan is outside, not repeated
    with pytest.raises(RowsOutsideBatch):
        verify_micro_batch("j", 3, PLAN, ok, spans(p0=[(8, 9), (8, 9)]))
    with pytest.raises(RowsOutsideBatch):
        verify_micro_batch("j", 3, PLAN, ok, spans(p0=[(20, 21), (20, 21)]))
    with pytest.raises(RowsOutsideBatch, match="partition 3"):
        verify_micro_batch("j", 3, PLAN, ok, spans(p3=[(1, 2), (1, 2)]))


def test_micro_batch_of_several_bad_partitions_names_the_first_by_topic_and_partition() -> None:
    ok = [receipt(0), receipt(1)]
    twice = Delivery(frozenset({RUN}), {("t", 5): [(0, 1)], ("t", 3): [(0, 1)]})
    with pytest.raises(RowsOutsideBatch, match="topic 't' partition 3 offsets"):
        verify_micro_batch("j", 3, PLAN, ok, twice)
    topics = Delivery(frozenset({RUN}), {("u", 0): [(0, 1)], ("s", 1): [(0, 1)]})
    with pytest.raises(RowsOutsideBatch, match="topic 's' partition 1 offsets"):
        verify_micro_batch("j", 3, PLAN, ok, topics)
    with pytest.raises(RowsOutsideBatch, match="range t/0 10 -> 20's count row says 8"):
        verify_micro_batch("j", 3, PLAN, ok, counts((A1, 4), (A0, 8)))


def test_micro_batch_count_rows_are_each_planned_range_once_with_its_task_s_count() -> None:
    ok = [receipt(0), receipt(1)]
    assert verify_micro_batch("j", 3, PLAN, ok, counts((A1, 5), (A0, 9)))
    for given, error, text in (
        (counts((A0, 9), (A1, 5), (A1, 5)), RowsRepeated, "range t/1 0 -> 5's count row twice"),
        (counts((A0, 9)), MicroBatchNotRead, "no count row for range t/1 0 -> 5"),
        (counts((A1, 5)), MicroBatchNotRead, "no count row for range t/0 10 -> 20"),
        (
            counts((A0, 9), (A1, 4)),
            RowsOutsideBatch,
            "range t/1 0 -> 5's count row says 4 messages, but its reading task read 5",
        ),
        (counts((A0, 9), (A1, 6)), RowsOutsideBatch, "says 6 messages"),
        (
            counts((A0, 9), (A1, 5), (EMPTY, 0)),
            RowsOutsideBatch,
            "partition 2 offsets 7..6, outside this micro-batch's range none",
        ),
        (
            counts((A0, 9), (OffsetRange("t", 1, 1, 5), 4)),
            RowsOutsideBatch,
            r"offsets 1..4, outside this micro-batch's range \[0, 5\)",
        ),
    ):
        with pytest.raises(error, match=text):
            verify_micro_batch("j", 3, PLAN, ok, given)


def test_spans_merge_into_sorted_disjoint_spans_naming_the_first_offset_two_share() -> None:
    assert merge_spans([]) == ([], None)
    assert merge_spans([[(5, 7)], [(0, 3)], [(3, 5)]]) == ([(0, 7)], None)
    assert merge_spans([[(0, 3)], [(4, 5)]]) == ([(0, 3), (4, 5)], None)
    assert merge_spans([[(0, 6)], [(2, 3)], [(4, 9)]]) == ([(0, 9)], 2)
    assert merge_spans([[(0, 6)], [(2, 3)], [(3, 4)]]) == ([(0, 6)], 2)
    assert merge_spans([[(0, 2)], [(1, 2)], [(5, 6), (5, 7)]]) == ([(0, 2), (5, 7)], 1)
    assert merge_spans([[(0, 3), (3, 4)], [(4, 6), (5, 6)]]) == ([(0, 6)], 5)
    # the last span merged is the one a next span joins or overlaps, not the first
    assert merge_spans([[(0, 1), (5, 8)], [(6, 9), (9, 10)]]) == ([(0, 1), (5, 10)], 6)
    assert merge_spans([[(0, 1), (5, 8), (8, 9)]]) == ([(0, 1), (5, 9)], None)
    assert merge_spans([[(0, 1), (5, 8), (6, 7)]]) == ([(0, 1), (5, 8)], 6)
    assert spans_from_array(spans_array([])) == []
    assert spans_from_array(spans_array([(0, 1), (7, 9), (2**40, 2**40 + 3)])) == [
        (0, 1),
        (7, 9),
        (2**40, 2**40 + 3),
    ]
    assert len(spans_array([(0, 1), (7, 9)])) == 32


# -- the source's options ---------------------------------------------------------------------------

BASE = {
    "kafka.bootstrap.servers": "127.0.0.1:9092",
    "subscribe": "t",
    "txstore.job": "j",
    "txstore.databaseUrl": "postgresql://u@127.0.0.1/db",
}


def test_stream_options_are_the_batch_options_plus_the_stream_s_own() -> None:
    parsed = parse_stream_options(
        {
            **BASE,
            "maxOffsetsPerTrigger": "7",
            "TXSTORE.countMessages": " TRUE ",
            "txstore.tasks": "3",
            "txstore.failpoints": "before-commit",
        },
        {},
    )
    assert (
        parsed.job,
        parsed.max_offsets_per_trigger,
        parsed.count_messages,
        parsed.tasks,
        parsed.failpoints,
    ) == ("j", 7, True, 3, "before-commit")
    assert (parsed.database_url == "postgresql://u@127.0.0.1/db" and parsed.read.topics == ("t",)) or list(
        parsed.read.topics
    ) == ["t"]
    plain = parse_stream_options(BASE, {}, default_tasks=4)
    assert (plain.max_offsets_per_trigger, plain.count_messages, plain.tasks, plain.failpoints) == (
        None,
        False,
        4,
        "",
    )
    assert parse_stream_options({**BASE, "maxOffsetsPerTrigger": "1"}, {}).max_offsets_per_trigger == 1


@pytest.mark.parametrize(
    "given, text",
    [
        (
            {"endingOffsets": "latest"},
            "option endingOffsets is not supported by readStream.format('txstore')",
        ),
        ({"minPartitions": "0"}, "option minPartitions must be a whole number of at least 1, got '0'"),
        ({"minpartitions": "x"}, "option minPartitions must be a whole number of at least 1, got 'x'"),
        ({"maxoffsetspertrigger": "0"}, "option maxOffsetsPerTrigger must be a whole number"),
        ({"txstore.countmessages": "yes"}, "option txstore.countMessages must be true or false"),
        ({"subscribepattern": "t.*"}, "give one of option subscribe and option subscribePattern, not both"),
        ({"txstore.job": " "}, "option txstore.job is required by readStream.format('txstore')"),
        (
            {"maxOffsetsPerTrigger": "0"},
            "option maxOffsetsPerTrigger must be a whole number of at least 1, got '0'",
        ),
        ({"maxOffsetsPerTrigger": "ten"}, "got 'ten'"),
        ({"txstore.countMessages": "yes"}, "option txstore.countMessages must be true or false, got 'yes'"),
        ({"txstore.tasks": "0"}, "option txstore.tasks must be a whole number of at least 1"),
    ],
)
def test_a_bad_stream_option_is_refused_in_one_line(given: dict[str, str], text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_stream_options({**BASE, **given}, {})
    assert text in one_line(e)


def test_a_stream_option_s_bad_fail_point_is_refused_at_load() -> None:
    with pytest.raises(ValueError, match="cannot parse 'no-such-point'"):
        parse_stream_options({**BASE, "txstore.failpoints": "no-such-point"}, {})


def test_count_messages_option_is_true_or_false_and_tasks_option_a_whole_number() -> None:
    assert parse_count_messages(None) is False
    assert parse_count_messages(" False") is False
    assert parse_count_messages("TRUE ") is True
    for bad in ("", "1", "t"):
        with pytest.raises(ConfigError):
            parse_count_messages(bad)
    assert parse_tasks("1") == 1 and parse_tasks("12") == 12
    for bad in ("0", "-1", "x"):
        with pytest.raises(ConfigError):
            parse_tasks(bad)


# -- failOnDataLoss false: aged-out offsets skipped and recorded -------------------------------------


def lost_rows(db: psycopg.Connection) -> list[tuple[int, int, int]]:
    return db.execute(
        "SELECT part, from_off, until_off FROM txn_lost_ranges WHERE job = %s ORDER BY part, from_off", (JOB,)
    ).fetchall()


def age_out(fake_log: FakeLog, below: int) -> None:
    """Kafka's retention (or DeleteRecords) takes the messages below ``below``."""
    for o in range(fake_log.low, below):
        fake_log.messages.pop(o, None)
    fake_log.low = below


def test_with_fail_on_data_loss_false_a_stream_records_aged_out_offsets_and_counts_the_rest_once(
    guard: Guard,
) -> None:
    partition, reader, sink, end = guard.counted_first(3, failOnDataLoss="false")
    assert offsets(guard.db) == {0: 3} and total(guard.db) == 3
    grow(partition, 10)
    age_out(partition, 8)  # offsets 3-7 gone before the stream counted them

    start, end, parts = plan(reader, end)
    assert end == {"t": {"0": 10}}
    assert [[(r.partition, r.from_offset, r.until_offset) for r in p.ranges] for p in parts] == [[(0, 8, 10)]]
    # recorded with the move, atomically
    assert lost_rows(guard.db) == [(0, 3, 8)] and offsets(guard.db) == {0: 8}
    messages = [sink.write(iter(task)) for task in read(reader, parts)]
    sink.commit(messages, 1)
    assert offsets(guard.db) == {0: 10} and total(guard.db) == 3 + 2
    reader.commit(end)

    # A replay of that micro-batch from its checkpoint (a crash before Spark's commit): the recorded
    # loss leads to the stored offset, so it is recognised as committed; nothing recorded twice.
    restarted = guard.source(failOnDataLoss="false")
    reader.stop()
    replayed = list(restarted.partitions(start, end))
    sink.commit([sink.write(iter(task)) for task in read(restarted, replayed)], 1)
    assert total(guard.db) == 5 and offsets(guard.db) == {0: 10} and lost_rows(guard.db) == [(0, 3, 8)]


def test_with_fail_on_data_loss_false_a_recreated_topic_stops_the_stream_before_any_loss_is_recorded(
    guard: Guard,
) -> None:
    """A topic deleted and recreated, its new log already trimmed past the stored offset, looks
    like an aged-out range; it is another topic: the query stops on the topic ID with nothing
    recorded as lost and the stored offset where it was (the reset then starts it over)."""
    guard.fake.topic_ids["t"] = "id-one"
    partition, reader, _, end = guard.counted_first(3, failOnDataLoss="false")
    assert offsets(guard.db) == {0: 3}
    guard.fake.topic_ids["t"] = "id-two"  # deleted and recreated, then written and trimmed
    grow(partition, 20)
    age_out(partition, 12)
    with pytest.raises(TopicRecreated, match=r"topic 't' partition 0: the topic was deleted and recreated"):
        plan(reader, end)
    assert lost_rows(guard.db) == [] and offsets(guard.db) == {0: 3}


def test_a_replay_after_the_loss_was_recorded_reads_the_rest_and_records_what_aged_out_since(
    guard: Guard,
) -> None:
    partition, first, sink, end = guard.counted_first(3, failOnDataLoss="false")
    first.commit(end)
    grow(partition, 12)
    age_out(partition, 6)
    start = end
    end = first.latestOffset(start, None)
    assert end == {"t": {"0": 12}}
    list(first.partitions(start, end))  # records 3-5 as lost; the query dies before its tasks run
    first.stop()
    assert lost_rows(guard.db) == [(0, 3, 6)] and offsets(guard.db) == {0: 6}

    age_out(partition, 9)  # more aged out while the query was down
    restarted = guard.source(failOnDataLoss="false")
    parts = list(restarted.partitions(start, end))  # Spark replays the micro-batch from its checkpoint
    assert [[(r.partition, r.from_offset, r.until_offset) for r in p.ranges] for p in parts] == [[(0, 9, 12)]]
    assert lost_rows(guard.db) == [(0, 3, 6), (0, 6, 9)]
    sink.commit([sink.write(iter(task)) for task in read(restarted, parts)], 1)
    assert offsets(guard.db) == {0: 12} and total(guard.db) == 3 + 3


def test_a_micro_batch_wholly_aged_out_is_recorded_and_the_next_reads_from_the_log_start(
    guard: Guard,
) -> None:
    partition, reader, sink, end = guard.counted_first(2, failOnDataLoss="false", maxOffsetsPerTrigger="3")
    grow(partition, 20)
    start = end
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 5}}  # planned while 2-4 were still there
    age_out(partition, 15)
    parts = list(reader.partitions(start, end))
    assert [[(r.from_offset, r.until_offset) for r in p.ranges] for p in parts] == []  # nothing left to read
    assert lost_rows(guard.db) == [(0, 2, 5)] and offsets(guard.db) == {0: 5}
    sink.commit([], 1)
    start, end, parts = plan(reader, end)
    assert [[(r.from_offset, r.until_offset) for r in p.ranges] for p in parts] == [[(15, 20)]]
    assert lost_rows(guard.db) == [(0, 2, 5), (0, 5, 15)]


def test_by_default_aged_out_offsets_stop_the_stream_naming_both_ways_on(guard: Guard) -> None:
    partition, reader, _, end = guard.counted_first(3)
    grow(partition, 10)
    age_out(partition, 8)
    with pytest.raises(TxstoreError) as e:
        reader.latestOffset(end, None)
    line = one_line(e)
    assert "stored offset 3 is below the log-start offset 8" in line
    assert "restart the query with option failOnDataLoss false (the same checkpoint)" in line
    assert lost_rows(guard.db) == [] and offsets(guard.db) == {0: 3}


def test_a_batch_read_with_fail_on_data_loss_false_starts_an_aged_out_partition_at_its_log_start() -> None:
    read_options = parse_stream_options(
        {**BASE, "startingOffsets": '{"t": {"0": 2}}', "failOnDataLoss": "false"}, {}
    ).read
    marks = [PartitionWatermarks("t", 0, 5, 9), PartitionWatermarks("t", 1, 0, 4)]
    assert [(r.partition, r.from_offset) for r in plan_read_ranges(read_options, marks)] == [(0, 5), (1, 0)]
    strict = replace(read_options, fail_on_data_loss=True)
    with pytest.raises(DataLoss, match="offset 2 is below the log-start offset 5"):
        plan_read_ranges(strict, marks)
    # txstore.job (read-only): the job's aged-out offset is passed over, nothing recorded.
    assert [
        (r.partition, r.from_offset)
        for r in plan_job_ranges("j", {("t", 0): 1}, marks[:1], StartingOffsets(), None, False)
    ] == [(0, 5)]


# -- minPartitions: a micro-batch's big ranges in pieces, committed whole ----------------------------


def piece_bounds(parts: Sequence[Any]) -> list[list[tuple[int, int, int]]]:
    return [[(r.partition, r.from_offset, r.until_offset) for r in p.ranges] for p in parts]


def test_min_partitions_reads_a_big_range_in_pieces_by_their_own_tasks_and_commits_it_whole_once(
    guard: Guard,
) -> None:
    guard.log(0, range(12))
    guard.log(1, [0, 2], high=3)
    reader = guard.source(minPartitions="5")
    _, end, parts = plan(reader)
    # In proportion to size: 12 offsets in 4 pieces, 3 in 1; each piece its own task.
    assert piece_bounds(parts) == [[(0, 0, 3)], [(0, 3, 6)], [(0, 6, 9)], [(0, 9, 12)], [(1, 0, 3)]]
    saved = load_plan(guard.db, JOB)
    assert saved.pieces == {("t", 0): ((0, 3, 0), (3, 6, 1), (6, 9, 2), (9, 12, 3))}
    assert saved.pieces_of(saved.ranges[1]) == ((0, 3, 4),)
    assert [p.ranges[0].verify for p in parts] == [None] * 5  # nothing counted before
    sink = guard.writer()
    messages = [sink.write(iter(task)) for task in reversed(read(reader, parts))]
    sink.commit(messages, 0)
    assert offsets(guard.db) == {0: 12, 1: 3} and total(guard.db) == 14
    assert last_counted(guard.db) == {0: 11, 1: 2}  # the last piece's last message
    sink.commit(messages, 0)  # a replay: recognised as committed
    assert total(guard.db) == 14

    # The next micro-batch's first piece verifies the last message counted; the others do not.
    grow(guard.fake.logs[("t", 0)], 20)
    _, end, parts = plan(reader, end)
    assert piece_bounds(parts) == [[(0, 12, 13)], [(0, 13, 15)], [(0, 15, 16)], [(0, 16, 18)], [(0, 18, 20)]]
    assert parts[0].ranges[0].verify == fingerprint(guard.fake.logs[("t", 0)].messages[11])
    assert all(p.ranges[0].verify is None for p in parts[1:])
    sink.commit([sink.write(iter(task)) for task in read(reader, parts)], 1)
    assert offsets(guard.db) == {0: 20, 1: 3} and total(guard.db) == 22


def test_a_piece_unread_or_read_twice_stops_the_commit_of_the_whole_range(guard: Guard) -> None:
    guard.log(0, range(9))
    reader = guard.source(COUNT_SCHEMA, minPartitions="3", **{"txstore.countMessages": "true"})
    _, _, parts = plan(reader)
    assert piece_bounds(parts) == [[(0, 0, 3)], [(0, 3, 6)], [(0, 6, 9)]]
    tasks = read(reader, parts)
    assert [b.to_pylist()[0]["txstore_messages"] for task in tasks for b in task] == [3, 3, 3]
    sink = guard.writer(COUNT_SCHEMA)
    with pytest.raises(MicroBatchNotRead, match="the sink received no count row for range t/0 6 -> 9"):
        sink.commit([sink.write(iter(task)) for task in tasks[:2]], 0)  # a filter dropped a piece's row
    with pytest.raises(RowsRepeated, match="count row twice"):
        sink.commit([sink.write(iter(task)) for task in [*tasks, tasks[1]]], 0)  # a self-union's repeat
    assert total(guard.db) == 0 and offsets(guard.db) == {0: 0}
    sink.commit([sink.write(iter(task)) for task in tasks], 0)
    assert total(guard.db) == 9 and offsets(guard.db) == {0: 9}


def test_another_sink_s_micro_batch_in_pieces_moves_the_offsets_keeping_the_last_piece_s_message(
    guard: Guard,
) -> None:
    guard.log(0, [0, 1, 2, 3, 4, 5, 6], high=12)  # 7-11: a transaction's markers
    reader = guard.source(minPartitions="3")
    _, end, parts = plan(reader)
    assert piece_bounds(parts) == [[(0, 0, 4)], [(0, 4, 8)], [(0, 8, 12)]]  # the last: markers only
    for p in reversed(parts):  # receipts recorded last piece first
        list(reader.read(p))
    reader.commit(end)  # Spark committed a micro-batch its file sink wrote
    assert offsets(guard.db) == {0: 12} and last_counted(guard.db) == {0: 6}
    assert committed_by(guard.db) == CHECKPOINT_LED


def test_micro_batch_pieces_of_a_range_are_read_whole_and_counted_once_each() -> None:
    whole = OffsetRange("t", 0, 0, 9)
    cut = ((0, 3, 0), (3, 6, 1), (6, 9, 2))
    plan = StreamPlan("p", (whole,), 3, {("t", 0): 0}, None, {("t", 0): cut})
    assert plan.pieces_of(whole) == cut and plan.tasks_of(whole) == {0, 1, 2}
    two = Fingerprint(5, 0, b"d5")
    lasts = {0: Fingerprint(2, 0, b"d2"), 1: two, 2: None}  # the last piece: aborted markers only

    def receipt(task: int) -> Receipt:
        a, b, _ = cut[task]
        return Receipt(
            task, 1, task, None, None, (RangeRead(OffsetRange("t", 0, a, b), 3 - (task == 2), lasts[task]),)
        )

    def counts(*tasks: int) -> Delivery:
        rows = [(OffsetRange("t", 0, cut[t][0], cut[t][1]), 3 - (t == 2)) for t in tasks]
        return Delivery(frozenset({(None, None, None)}), counts=rows)

    receipts = [receipt(t) for t in (2, 0, 1)]
    read = verify_micro_batch(JOB, 0, plan, receipts, counts(0, 1, 2))
    assert read == {("t", 0): RangeRead(whole, 8, two)}  # the last piece with a message gives it
    with pytest.raises(MicroBatchNotRead, match="no count row for range t/0 3 -> 6"):
        verify_micro_batch(JOB, 0, plan, receipts, counts(0))  # the first missing piece is named
    with pytest.raises(RowsRepeated, match="count row twice"):
        verify_micro_batch(JOB, 0, plan, receipts, counts(0, 1, 1, 2))
    with pytest.raises(RowsOutsideBatch, match="outside this micro-batch's range"):
        stray = Delivery(frozenset({(None, None, None)}), counts=[(OffsetRange("t", 0, 0, 9), 8)])
        verify_micro_batch(JOB, 0, plan, receipts, stray)  # the whole range's row: not a piece's
    assert whole_read(whole, [receipts[1].reads[0], None, receipts[0].reads[0]]) is None
    assert whole_read(whole, [None, None, None]) is None


def test_a_plan_s_pieces_are_kept_in_offset_order_whatever_the_tasks_order() -> None:
    whole, other = OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 4)
    first, second = OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 10)
    task_of, pieces = tasks_of([whole, other], [[second, other], [first]])
    assert pieces == {("t", 0): ((0, 5, 1), (5, 10, 0))} and task_of == {("t", 0): 1, ("t", 1): 0}
    # One piece that is not the whole range (a range read only in part) is kept as a piece.
    assert tasks_of([whole], [[first]]) == ({("t", 0): 0}, {("t", 0): ((0, 5, 0),)})
    assert tasks_of([whole], [[whole]]) == ({("t", 0): 0}, {})


def test_a_query_restarted_with_fewer_assigned_partitions_is_told_so_not_that_its_checkpoint_is_foreign(
    guard: Guard,
) -> None:
    guard.log(0, range(3))
    guard.log(1, range(3))
    guard.log(2, range(2))

    def assigned(partitions: list[int]) -> TxstoreStreamReader:
        reader = stream_reader(
            {
                "kafka.bootstrap.servers": "fake:9092",
                "assign": json.dumps({"t": partitions}),
                "txstore.job": JOB,
                "txstore.databaseUrl": guard.url,
            },
            ROWS_SCHEMA,
        )
        guard.readers.append(reader)
        return reader

    first = assigned([0, 1, 2])
    _, end, parts = plan(first)
    sink = guard.writer()
    sink.commit([sink.write(iter(task)) for task in read(first, parts)], 0)
    first.commit(end)
    first.stop()
    grow(guard.fake.logs[("t", 0)], 5)
    said = (
        "the checkpoint reads this partition, but option assign no "
        "longer assigns it (a query restarted with fewer assigned partitions); the job's offset for it "
        "stays in txn_offsets; nothing was read. Assign it again, or restart the query with a new "
        "checkpointLocation: it then starts at the job's offsets of the assigned partitions"
    )
    one_less = assigned([0, 1])  # one partition dropped: named alone, no "(and 0 more)"
    with pytest.raises(CheckpointMismatch) as e:
        one_less.latestOffset(end, None)
    assert one_line(e) == f"job '{JOB}' topic 't' partition 2: " + said
    one_less.stop()
    fewer = assigned([0])
    expected = f"job '{JOB}' topic 't' partition 1 (and 1 more): " + said
    with pytest.raises(CheckpointMismatch) as e:
        fewer.latestOffset(end, None)
    assert one_line(e) == expected
    with pytest.raises(CheckpointMismatch) as e:
        fewer.partitions(end, {"t": {"0": 5, "1": 3, "2": 2}})  # a replay planned before the restart
    assert one_line(e) == expected
    assert offsets(guard.db) == {0: 3, 1: 3, 2: 2}
    # A new checkpoint: the assigned partition goes on from txn_offsets; the other's row is kept.
    fresh = fewer.initialOffset()
    assert fresh == {"t": {"0": 3}}
    assert offsets(guard.db) == {0: 3, 1: 3, 2: 2}


# -- the ways a query names its partitions: assign, subscribePattern ------------------------------


def named_by(guard: Guard, **given: str) -> TxstoreStreamReader:
    """A source of the job naming its partitions by ``given`` (``assign``, ``subscribePattern``)."""
    reader = stream_reader(
        {
            "kafka.bootstrap.servers": "fake:9092",
            "txstore.job": JOB,
            "txstore.databaseUrl": guard.url,
            **given,
        },
        ROWS_SCHEMA,
    )
    guard.readers.append(reader)
    return reader


def test_an_assigned_partition_kafka_does_not_have_stops_the_query_before_a_row_is_stored(
    guard: Guard,
) -> None:
    guard.log(0, range(3))
    reader = named_by(guard, assign=json.dumps({"t": [0, 3]}))
    with pytest.raises(ConfigError) as e:
        reader.initialOffset()
    assert "option assign names 't' partition 3, which Kafka does not report" in one_line(e)
    assert offsets(guard.db) == {}
    with pytest.raises(ConfigError):  # asked again (Spark retries a failed start): refused again
        reader.latestOffset({"t": {"0": 0}}, None)


def test_a_query_records_how_it_names_its_partitions_for_txstore_status(guard: Guard) -> None:
    guard.log(0, range(3))
    guard.log(1, range(2))
    named_by(guard, assign=json.dumps({"t": [1]})).initialOffset()
    recorded = store.subscriptions(guard.db, JOB)[JOB]
    assert (recorded.kind, recorded.assignment) == ("assign", (("t", (1,)),))
    assert recorded.holds("t", 1) and not recorded.holds("t", 0)
    assert offsets(guard.db) == {1: 0}


def test_an_assigned_query_starts_and_plans_only_its_partitions_beside_the_job_s_other_rows(
    guard: Guard,
) -> None:
    for p, n in enumerate((3, 5, 7)):
        guard.log(p, range(n))
    everything = guard.source()
    everything.initialOffset()  # the job's rows of all three partitions
    everything.stop()
    guard.db.execute("UPDATE txn_offsets SET off = part WHERE job = %s", (JOB,))
    guard.db.commit()
    reader = named_by(guard, assign=json.dumps({"t": [1, 2]}))
    start = reader.initialOffset()
    assert start == {"t": {"1": 1, "2": 2}}
    end = reader.latestOffset(start, None)
    assert end == {"t": {"1": 5, "2": 7}}
    assert [r for part in reader.partitions(start, end) for r in partition_ranges(part)] == [
        OffsetRange("t", 1, 1, 5),
        OffsetRange("t", 2, 2, 7),
    ]
    assert offsets(guard.db) == {0: 0, 1: 1, 2: 2}  # partition 0's row left alone


def test_an_assigned_query_stops_at_its_topic_recreated_since_its_rows_were_stored(guard: Guard) -> None:
    guard.fake.topic_ids["t"] = "id-one"
    guard.log(0, range(3))
    guard.log(1, range(4))
    reader = named_by(guard, assign=json.dumps({"t": [1]}))
    start = reader.initialOffset()
    guard.fake.topic_ids["t"] = "id-two"  # deleted and recreated, refilled
    with pytest.raises(TopicRecreated, match=r"topic 't' partition 1: the topic was deleted and recreated"):
        reader.latestOffset(start, None)


def test_a_pattern_query_logs_the_topics_it_matches_when_they_change_only(
    guard: Guard, caplog: pytest.LogCaptureFixture
) -> None:
    reader = named_by(guard, subscribePattern="t.*")
    with caplog.at_level(logging.INFO, logger="txstore"):
        start = reader.initialOffset()
        reader.latestOffset(start, None)
        guard.log(0, range(3))
        start = reader.latestOffset(start, None)
        reader.latestOffset(start, None)
        guard.fake.add(FakeLog.of("t2", 0, range(2)))
        reader.latestOffset(start, None)
    said = [r.getMessage() for r in caplog.records if "option subscribePattern" in r.getMessage()]
    assert said == [
        f"job {JOB}: option subscribePattern 't.*' matches no topic on Kafka yet; nothing to read",
        f"job {JOB}: option subscribePattern 't.*' matches t",
        f"job {JOB}: option subscribePattern 't.*' matches t, t2",
    ]


def test_a_partition_added_to_a_topic_a_pattern_query_started_enters_at_its_earliest_offset(
    guard: Guard, caplog: pytest.LogCaptureFixture
) -> None:
    """startingOffsets is for a topic the job never started; a partition added to one it did is
    read from its first message, as with subscribe."""
    guard.log(0, range(3))
    reader = named_by(guard, subscribePattern="t.*", startingOffsets="latest")
    with caplog.at_level(logging.INFO, logger="txstore"):
        start = reader.initialOffset()
        assert start == {"t": {"0": 3}}
        guard.log(1, range(4))  # a partition added, and written to
        reader.latestOffset(start, None)
    assert offsets(guard.db) == {0: 3, 1: 0}
    said = [r.getMessage() for r in caplog.records if " starts at " in r.getMessage()]
    assert [line.split(" starts at ")[0] for line in said] == [f"job {JOB}: t/0", f"job {JOB}: t/1"]


def test_a_query_over_two_topics_stores_each_topic_s_id_in_its_rows(guard: Guard) -> None:
    guard.fake.topic_ids.update({"t": "id-t", "u": "id-u"})
    guard.log(0, range(2))
    guard.fake.add(FakeLog.of("u", 0, range(3)))
    named_by(guard, subscribe="t,u").initialOffset()
    ids = "SELECT topic, part, topic_id FROM txn_offsets WHERE job = %s ORDER BY topic, part"
    assert guard.db.execute(ids, (JOB,)).fetchall() == [("t", 0, "id-t"), ("u", 0, "id-u")]


def test_a_query_asks_kafka_its_log_offsets_and_topic_ids_through_one_admin_client(
    guard: Guard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new librdkafka client waited about 55 ms for its first answer (15 ms since
    RECONNECT_BACKOFF_MS): the query's start asked its topic IDs through a client of their own,
    after the log offsets' one (issue 38)."""
    made: list[FakeAdminClient] = []
    make = txstore.kafka.admin.AdminClient

    def counted(conf: dict[str, Any]) -> FakeAdminClient:
        client = make(conf)
        made.append(client)
        return client

    monkeypatch.setattr(txstore.kafka.admin, "AdminClient", counted)
    guard.fake.topic_ids["t"] = "id-t"
    guard.log(0, range(2))
    reader = named_by(guard, subscribe="t")
    start = reader.initialOffset()
    assert reader.latestOffset(start, None) == {"t": {"0": 2}}
    ids = "SELECT topic, part, topic_id FROM txn_offsets WHERE job = %s"
    assert guard.db.execute(ids, (JOB,)).fetchall() == [("t", 0, "id-t")]
    assert len(made) == 1


def test_an_idle_query_asks_its_topic_ids_once_in_a_while_not_every_micro_batch(
    guard: Guard, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Any] = []
    describe = FakeAdminClient.describe_topics

    def counted(self: FakeAdminClient, topics: Any, request_timeout: float = -1) -> Any:
        asked.append(topics)
        return describe(self, topics, request_timeout)

    monkeypatch.setattr(FakeAdminClient, "describe_topics", counted)
    guard.fake.topic_ids["t"] = "id-one"
    _, reader, _, end = guard.counted_first(4)
    reader.commit(end)
    assert asked  # the start stored the topic's ID
    asked.clear()
    for _ in range(5):
        assert reader.latestOffset(end, None) == end  # idle
    assert asked == []  # asked again only IDLE_TOPIC_ID_SECONDS after the last time


def test_a_topic_the_pattern_matched_then_deleted_before_the_job_started_it_is_left_out_not_a_stop(
    guard: Guard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka listed the topic, and its metadata a moment later says it is unknown (deleted in
    between). The job has no row of it: the topic matches nothing now, and the rest is read."""
    guard.log(0, range(3))
    listed = FakeAdminClient.list_topics

    def deleted_after_listing(self: FakeAdminClient, topic: str | None = None, timeout: float = -1) -> Any:
        found = listed(self, topic, timeout)
        if topic is None:
            found.topics["t-gone"] = type("TopicMetadata", (), {"error": None, "partitions": {0: object()}})()
        return found

    monkeypatch.setattr(FakeAdminClient, "list_topics", deleted_after_listing)
    reader = named_by(guard, subscribePattern="t.*")
    start = reader.initialOffset()
    assert start == {"t": {"0": 0}}
    end = reader.latestOffset(start, None)
    assert end == {"t": {"0": 3}}
    assert [r for part in reader.partitions(start, end) for r in partition_ranges(part)] == [
        OffsetRange("t", 0, 0, 3)
    ]
    assert store.job_topics(guard.db, JOB) == ["t"]
