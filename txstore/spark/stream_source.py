"""``spark.readStream.format("txstore")``: the exactly-once stream's source.

A Python streaming data source (``DataSourceStreamReader``, PySpark 4.0 or
newer) for one txstore job; its sink is :mod:`txstore.spark.stream_sink`, and
the two together keep txstore's guarantee whatever happens to the query's
checkpoint::

    txstore.register(spark)
    (spark.readStream.format("txstore")
       .option("kafka.bootstrap.servers", "kafka:9092")
       .option("subscribe", "events")
       .option("txstore.job", "events_stream")
       .option("txstore.databaseUrl", "postgresql://...")
       .load()
       .writeStream.format("txstore")
       .option("txstore.job", "events_stream")
       .option("txstore.databaseUrl", "postgresql://...")
       .option("checkpointLocation", "/chk/events_stream")
       .start())

The truth is in PostgreSQL, not in the checkpoint: the source checks each
micro-batch's start against ``txn_offsets`` before anything is read, and
hands the ranges it planned to the sink through ``txn_stream_plans``
(:mod:`txstore.postgres.stream_plans`); the sink commits them with the
batch's results in one transaction.

Source options: those of the batch source (:mod:`txstore.spark.datasource`) except
``endingOffsets`` and ``minPartitions``, plus ``maxOffsetsPerTrigger``,
``txstore.countMessages`` and ``txstore.tasks``; ``txstore.job`` is
required. Offsets are ``{topic: {partition: offset}}`` (exclusive ends, as in
``txn_offsets``). Steps:

- ``initialOffset()`` (a query without checkpoint): the job's offsets in
  ``txn_offsets``; partitions without a row start per ``startingOffsets``, their rows
  stored then (as the batch planner stores its starts), with Kafka's topic IDs;
- ``latestOffset(start, limit)``: Kafka's log ends, capped by Spark's
  admission control (``ReadMaxRows`` from ``maxOffsetsPerTrigger``,
  :func:`~txstore.core.ranges.limit_ranges`) or, on PySpark 4.0/4.1 where
  ``latestOffset()`` gets neither start nor limit, by the option itself.
  Offsets Kafka no longer has, or never had, and a topic ID other than the stored one (a
  recreated topic) stop the query with the same lines as ``count_topic``
  (:func:`~txstore.core.ranges.plan_ranges`), adding the new checkpointLocation the reset
  needs. A partition the start does not name (a new one) enters where the job starts it
  (earliest in a topic it reads; its row stored then), with an empty range first, so every
  range of a batch starts at an offset of its start. A start the checkpoint gives a
  partition without a row must be where the job would start it
  (:func:`check_checkpoint_starts`: offsets name no job, so another job's checkpoint would
  be trusted otherwise);
- ``partitions(start, end)``: one range per partition with messages, ``[start, end)``, with
  the generation and the last counted message to verify from ``txn_offsets``. The start is
  compared with ``txn_offsets`` first: equal, or the whole batch already committed (a
  replay after a crash), or the query stops with :class:`CheckpointMismatch`
  before anything is read (a partition without a row: :func:`check_checkpoint_starts`);
  then the log with Kafka's (topic IDs, log ends), as the micro-batch may be a replay
  planned before a restart. The planned ranges are stored in
  ``txn_stream_plans`` (one row per job, :func:`~txstore.postgres.stream_plans.save_plan`),
  where the sink finds them. They become Spark's input partitions
  (:class:`~txstore.spark.datasource.RangesPartition`, :func:`micro_batch_tasks`): a range
  each while there are no more ranges than ``txstore.tasks``, else ``txstore.tasks`` runs of
  neighbouring ranges. Each task of a Python source feeding a Python sink takes two Python
  workers, so a task per core, not per range, is what a micro-batch of many partitions pays.
  ``txstore.tasks`` defaults to the parallelism :func:`txstore.register` measured (one range
  per task when the source was registered otherwise);
- ``read(partition)`` (the first in a Python worker freezes its heap,
  :mod:`~txstore.spark.worker_heap`): the task's ranges in their planned order (a retried
  task gets the same pickled partition, so it reads the same messages), through the batch
  source's Arrow reader; with ``txstore.countMessages`` (``true``), each range is read whole and the task yields one
  row per range, ``topic, partition, txstore_messages`` (:data:`~txstore.spark.stream_options.COUNT_SCHEMA`): as the
  per-range count path, no row per message crosses into Spark, and the sink adds the counts
  (Spark's ``numInputRows`` then counts ranges, not messages).

The reader's planning connection holds the job's *stream lock* (exclusive,
for the query's life) and the shared job lock (so ``txstore reset`` refuses
while it runs): a second streaming query on the same job is refused with
:class:`StreamLocked`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import psycopg
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from txstore.core.errors import ConfigError, OffsetOutOfLog, TopicRecreated, TxstoreError, UnknownTopic
from txstore.core.failpoints import FailPoints
from txstore.core.ranges import (
    OffsetRange,
    PartitionHistory,
    PartitionWatermarks,
    TopicPartition,
    group_ranges,
    limit_ranges,
    plan_ranges,
    topic_missing_now,
)
from txstore.core.starting import StartDecision, resolve_starting_offsets
from txstore.kafka.client import Watermarks
from txstore.kafka.reader import RangeReader
from txstore.kafka.topic_ids import TopicIds
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.locks import hold_job_lock
from txstore.postgres.migrate import check_schema
from txstore.postgres.stream_plans import save_plan
from txstore.spark.datasource import (
    RangePartition,
    RangesPartition,
    TxstoreReader,
    partition_ranges,
)
from txstore.spark.range_task import task_attempt
from txstore.spark.stream_options import (
    COUNT_SCHEMA,
    StreamOptions,
    parse_stream_options,
)
from txstore.spark.worker_heap import freeze_once

log = logging.getLogger("txstore")

_ReaderMixins: tuple[Any, ...] = ()
try:  # PySpark 4.2+: Trigger.AvailableNow stops at the log ends seen when the query started
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    _ReaderMixins = (SupportsTriggerAvailableNow,)
except ImportError:  # older: Spark reads everything available in one batch instead
    pass

Offsets = dict[str, dict[str, int]]
"""Spark's offset of this source: ``{topic: {partition (a string, as JSON has it): offset}}``."""

_State = tuple[dict[TopicPartition, int], dict[TopicPartition, PartitionHistory]]
"""The job's rows: offsets and what is kept beside them (:func:`~txstore.postgres.store.committed_state`)."""

_STREAM_KEY = "hashtextextended('txstore stream ' || %s, 0)"


class StreamLocked(TxstoreError):
    """Another streaming query of the same job holds its stream lock."""


class CheckpointMismatch(TxstoreError):
    """The checkpoint's start offsets are not the ones ``txn_offsets`` stores (an older or foreign copy)."""


class ForeignCheckpoint(CheckpointMismatch):
    """The checkpoint is not this job's: it starts a partition the job has no row for elsewhere
    than the job would start it, or names a topic the query does not read."""


def micro_batch_tasks(ranges: Sequence[OffsetRange], tasks: int | None) -> list[list[OffsetRange]]:
    """A micro-batch's ranges (in order) as the Spark tasks that read them.

    A task each while there are no more ranges than ``tasks`` (or ``tasks`` is None): the ranges
    are read side by side. More ranges share ``tasks`` runs of neighbours of about equal work
    (:func:`~txstore.core.ranges.group_ranges`), as the batch jobs share a task per core
    (:func:`txstore.spark.tasks.task_groups`): each task of a Python source feeding a Python
    sink costs two Python workers, which a task per range would pay for every partition.
    """
    if tasks is None or len(ranges) <= tasks:
        return [[r] for r in ranges]
    return group_ranges(ranges, tasks)


def offsets_dict(offsets: Mapping[TopicPartition, int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_map(offsets: Mapping[str, Any] | None) -> dict[TopicPartition, int]:
    return {
        (str(topic), int(partition)): int(offset)
        for topic, parts in (offsets or {}).items()
        for partition, offset in parts.items()
    }


def batch_ranges(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> list[OffsetRange]:
    """The ranges of a micro-batch from its start and end offsets, one per partition the end names.

    A partition the start does not name starts at its end offset (it enters with an empty range).
    """
    return sorted(OffsetRange(t, p, start.get((t, p), until), until) for (t, p), until in end.items())


def realign_hint() -> str:
    return (
        "restart the query with a new checkpointLocation (or delete this one: rm -r CHECKPOINT); "
        "it then starts at the stored offsets"
    )


def check_alignment(
    job: str, ranges: Sequence[OffsetRange], stored: Mapping[TopicPartition, int | None]
) -> bool:
    """Whether the batch is to be committed (True), or was committed whole before (False: a
    replay); raise :class:`CheckpointMismatch` for anything else, naming the first partition."""
    if all(stored.get(r.key) == r.from_offset for r in ranges):
        return True
    if all(stored.get(r.key) == r.until_offset for r in ranges):
        return False
    bad = next(r for r in ranges if stored.get(r.key) != r.from_offset)
    found = stored.get(bad.key)
    what = (
        "committed offsets would be read again"
        if found is not None and found > bad.from_offset
        else "offsets would be skipped"
    )
    raise CheckpointMismatch(
        f"job {job!r} topic {bad.topic!r} partition {bad.partition}: txn_offsets stores offset "
        f"{found} but the checkpoint starts this micro-batch at {bad.from_offset} ({what}; the "
        f"checkpoint is an older copy, or another query's); nothing was written. To realign: "
        + realign_hint()
    )


def check_checkpoint_starts(
    job: str,
    topics: Sequence[str],
    start: Mapping[TopicPartition, int],
    stored: Mapping[TopicPartition, int],
    would: Mapping[TopicPartition, tuple[int, str]],
) -> None:
    """Raise :class:`ForeignCheckpoint` unless the checkpoint's ``start`` could be this job's.

    The offsets name no job or query, so another's (copied, or its directory given) would be
    taken as this job's: every topic it names must be one the query reads, and every partition
    the job has no row for in ``stored`` must start where the job would start it (``would``:
    offset and why, per partition Kafka reports; its ``startingOffsets`` for a topic the job
    never started, the log's earliest offset for a partition that enters later). Partitions
    with a row are :func:`check_alignment`'s.
    """
    for topic in sorted({t for t, _ in start} - set(topics)):
        raise ForeignCheckpoint(
            f"job {job!r}: the checkpoint names topic {topic!r}, which this query does not read "
            f"(it reads {', '.join(repr(t) for t in topics)}): the checkpoint is another query's; "
            "nothing was read. Restart the query with a new checkpointLocation: it then starts at the "
            "job's offsets in txn_offsets (startingOffsets where it has none)"
        )
    for key, offset in sorted(start.items()):
        if key in stored:
            continue
        expected = would.get(key)
        if expected is not None and expected[0] == offset:
            continue
        where = (
            "Kafka reports no such partition"
            if expected is None
            else f"would start it at offset {expected[0]} ({expected[1]})"
        )
        raise ForeignCheckpoint(
            f"job {job!r} topic {key[0]!r} partition {key[1]}: the checkpoint starts this micro-batch at "
            f"offset {offset}, but the job has no offset stored for this partition and {where}: the "
            "checkpoint is not this job's (another job's or query's, copied or pointed at); nothing was "
            "read. Restart the query with a new checkpointLocation: it then starts where the job would"
        )


def start_reason(decision: StartDecision) -> str:
    """Why a partition starts where it does, in the stream's option names."""
    return decision.reason.replace("--starting-offsets", "startingOffsets")


def would_start(decisions: Sequence[StartDecision]) -> dict[TopicPartition, tuple[int, str]]:
    """:func:`check_checkpoint_starts`'s ``would``: offset and why, per partition."""
    return {(d.topic, d.partition): (d.offset, start_reason(d)) for d in decisions}


RESTART_AFTER_RESET = ", then restart the query with a new checkpointLocation"
"""What a stream adds to the planner's lines that end in a ``txstore reset`` command: the reset
moves ``txn_offsets``, and the checkpoint would start at the old offsets (refused)."""


def for_a_stream(error: OffsetOutOfLog | TopicRecreated) -> TxstoreError:
    """The planner's line for a log that is not the one the job read, with the stream's next step."""
    return type(error)(f"{error}{RESTART_AFTER_RESET}")


class TxstoreStreamReader(DataSourceStreamReader, *_ReaderMixins):  # type: ignore[misc]
    """See the module docstring. Planning methods run in one long-lived Python worker of the driver."""

    def __init__(self, options: StreamOptions, schema: Any) -> None:
        self.options = options
        self.schema = schema
        if options.count_messages:
            names = [f"{f.name} {f.dataType.simpleString()}" for f in schema.fields]
            if ", ".join(names) != COUNT_SCHEMA:
                raise ConfigError(
                    f"readStream.format('txstore') with txstore.countMessages has the columns "
                    f"{COUNT_SCHEMA}; leave out .schema() (it was {', '.join(names)})"
                )
            self.batch_reader = None
        else:
            self.batch_reader = TxstoreReader(options.read, schema)
        self._conn: psycopg.Connection | None = None  # opened by the planning methods only
        # The planning methods' Kafka admin client, kept across micro-batches (as a job keeps its).
        self._kafka: Watermarks | None = None
        self._ids: TopicIds | None = None  # the planning methods' topic IDs, kept as _kafka is
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow's end
        self._last_end: dict[TopicPartition, int] | None = None  # PySpark 4.0: latestOffset() has no start

    # -- the planning connection and its locks ------------------------------------------------------

    def _db(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            url, job = self.options.database_url, self.options.job
            conn = connect(url)
            check_schema(conn, url)
            with conn.transaction():
                row = conn.execute(f"SELECT pg_try_advisory_lock({_STREAM_KEY})", (job,)).fetchone()
            if not (row and row[0]):
                conn.close()
                raise StreamLocked(
                    f"job {job!r}: another streaming query of this job is running (it holds the job's "
                    "stream lock); stop it first, or give this query another txstore.job"
                )
            hold_job_lock(conn, job)
            self._conn = conn
        return self._conn

    def stop(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None
        if self._kafka is not None:
            self._kafka.close()
        self._kafka = None
        if self._ids is not None:
            self._ids.close()
        self._ids = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"] = None  # the planner's alone: a task opens neither
        state["_kafka"] = None
        state["_ids"] = None
        return state

    # -- offsets -----------------------------------------------------------------------------------

    def _watermarks(self) -> list[PartitionWatermarks]:
        """Kafka's log offsets, through one admin client for the query's life (a new client a call
        took 2-67 ms against the test broker, a kept one under 1 ms; it is replaced after a
        failed call)."""
        if self._kafka is None:
            self._kafka = Watermarks()
        try:
            return self._kafka(self.options.read.kafka_conf, self.options.read.topics)
        except UnknownTopic as e:
            # A topic the job stored offsets for existed: gone now, it is no typo (as count_topic).
            stored = sum(1 for t, _ in store.committed_offsets(self._db(), self.options.job, [e.topic]))
            if not stored:
                raise
            raise topic_missing_now(self.options.job, e.topic, e.servers, stored) from None

    def _topic_ids(
        self, conn: psycopg.Connection, history: Mapping[TopicPartition, PartitionHistory]
    ) -> dict[str, str]:
        """Kafka's topic IDs where it reports them, through one client for the query's life (a broker
        without them is asked once: :class:`~txstore.kafka.topic_ids.TopicIds`), stored in the job's
        rows that have none yet (``history``), so a later recreation is seen (as ``count_topic``)."""
        if self._ids is None:
            self._ids = TopicIds()
        ids = self._ids(self.options.read.kafka_conf, self.options.read.topics)
        unknown = {
            t: i for t, i in ids.items() if any(k[0] == t and not h.topic_id for k, h in history.items())
        }
        if unknown:
            store.record_topic_ids(conn, self.options.job, unknown)
        return ids

    def _start_decisions(
        self, stored: Mapping[TopicPartition, int], watermarks: Sequence[PartitionWatermarks]
    ) -> list[StartDecision]:
        """Where the job starts each partition Kafka reports that it has no row for: its
        ``startingOffsets`` in a topic it never started, the log's earliest offset in one it did."""
        new = [w for w in watermarks if w.key not in stored]
        if not new:  # every micro-batch: no new partition, nothing to decide (nor to check)
            return []
        started = {t for t, _ in stored}
        return resolve_starting_offsets(self.options.read.starting, new, [w.key for w in watermarks], started)

    def _start_rows(
        self, conn: psycopg.Connection, decisions: Sequence[StartDecision], state: _State
    ) -> _State:
        """Store the decisions as the job's rows when they are taken (as the batch planner does, so
        a checkpoint's start is always compared with a row); the job's rows, read again if any were
        to be created (a row another instance created first wins), else ``state``."""
        if not decisions:
            return state
        job = self.options.job
        created = store.create_start_rows(conn, job, decisions)
        for d in decisions:
            if (d.topic, d.partition) in created:
                log.info("job %s: %s/%d starts at %s", job, d.topic, d.partition, start_reason(d))
        return store.committed_state(conn, job, self.options.read.topics)

    def initialOffset(self) -> Offsets:
        offsets = self._initial_offsets()
        self._last_end = offsets
        return offsets_dict(offsets)

    def _initial_offsets(self) -> dict[TopicPartition, int]:
        conn = self._db()
        state = store.committed_state(conn, self.options.job, self.options.read.topics)
        watermarks = self._watermarks()
        committed, history = self._start_rows(conn, self._start_decisions(state[0], watermarks), state)
        self._topic_ids(conn, history)
        return committed

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # PySpark 4.2+

        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {w.key: w.high for w in self._watermarks()}

    def latestOffset(self, start: Mapping[str, Any] | None = None, limit: Any = None) -> Offsets:
        """The next end: Kafka's log ends (capped by the limit), after the planner's checks.

        Without ``start`` (PySpark before 4.2) the last end given out is the start, or the
        stored offsets after a restart; without ``limit``, ``maxOffsetsPerTrigger`` applies.
        """
        job = self.options.job
        conn = self._db()
        if start is not None:
            begin = offsets_map(start)
            max_offsets = getattr(limit, "max_rows", None)
        else:
            # PySpark 4.0/4.1 may ask before initialOffset() (Trigger.AvailableNow fixes its target
            # first): the query's first start is then the initial offset.
            begin = self._last_end if self._last_end is not None else self._initial_offsets()
            max_offsets = self.options.max_offsets_per_trigger
        now = self._watermarks()
        stored, history = store.committed_state(conn, job, self.options.read.topics)
        decisions = self._start_decisions(stored, now)
        check_checkpoint_starts(job, self.options.read.topics, begin, stored, would_start(decisions))
        # A partition the start does not name enters where the job starts it, its row stored now.
        stored, history = self._start_rows(
            conn, [d for d in decisions if (d.topic, d.partition) not in begin], (stored, history)
        )
        watermarks = now
        if self._target is not None:
            watermarks = [replace(w, high=min(w.high, self._target.get(w.key, w.low))) for w in watermarks]
        committed = dict(begin)
        entering = {}
        for w in watermarks:
            if w.key not in committed:
                entering[w.key] = stored.get(w.key, w.low)
        committed.update(entering)
        topic_ids = self._topic_ids(conn, history)
        try:  # aged out, out of log, gone, another topic ID: one line
            ranges = plan_ranges(job, committed, watermarks, history, topic_ids)
        except (OffsetOutOfLog, TopicRecreated) as e:
            raise for_a_stream(e) from None
        ranges = [r for r in ranges if r.key not in entering]
        end = dict(committed)
        end.update({r.key: r.until_offset for r in limit_ranges(ranges, max_offsets)})
        self._last_end = end
        return offsets_dict(end)

    def partitions(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> Sequence[InputPartition]:
        job = self.options.job
        conn = self._db()
        begin, finish = offsets_map(start), offsets_map(end)
        planned = batch_ranges(begin, finish)
        topics = self.options.read.topics
        committed, history = store.committed_state(conn, job, topics)
        now = self._watermarks()
        # A partition the job has no row for starts here only where the job would start it (a
        # checkpoint names no job: another's would be trusted); its row is stored then.
        decisions = self._start_decisions(committed, now)
        check_checkpoint_starts(
            job, topics, {r.key: r.from_offset for r in planned}, committed, would_start(decisions)
        )
        missing = {r.key for r in planned if r.key not in committed}
        if missing:
            committed, history = self._start_rows(
                conn, [d for d in decisions if (d.topic, d.partition) in missing], (committed, history)
            )
        check_alignment(job, planned, {r.key: committed.get(r.key) for r in planned})
        # The log is still the one the batch was planned on (a restart replays a batch planned before).
        topic_ids = self._topic_ids(conn, history)
        try:
            plan_ranges(
                job,
                {r.key: r.from_offset for r in planned},
                [w for w in now if w.key in finish],
                history,
                topic_ids,
            )
        except (OffsetOutOfLog, TopicRecreated) as e:
            raise for_a_stream(e) from None
        watermarks = {w.key: w for w in now}
        ranges = []
        for r in planned:
            past = history.get(r.key)
            generation = past.generation if past else 0
            last = past.last if past else None
            marks = watermarks.get(r.key)
            low = marks.low if marks else 0
            verify = last if last is not None and low <= last.offset < r.from_offset else None
            log_end = marks.high if marks else None
            ranges.append(replace(r, verify=verify, generation=generation, log_end=log_end))
        save_plan(conn, job, start, end, ranges)
        self._last_end = finish
        reading = [r for r in ranges if r.size > 0]
        return [RangesPartition(run) for run in micro_batch_tasks(reading, self.options.tasks)]

    def commit(self, end: Mapping[str, Any]) -> None:
        """Spark's commit of a batch it finished; the offsets are in PostgreSQL already."""

    def read(self, partition: InputPartition) -> Iterator[Any]:
        freeze_once()  # PySpark's collection after each task then skips the imports' objects
        ranges = partition_ranges(partition)
        if self.batch_reader is None:
            return self._count(ranges)
        return self._messages(self.batch_reader, ranges)

    def _after_first_range(self) -> None:
        if self.options.failpoints:  # tests only
            FailPoints.parse(self.options.failpoints).hit("after-first-range", task_attempt())

    def _messages(self, reader: TxstoreReader, ranges: Sequence[OffsetRange]) -> Iterator[Any]:
        """The messages of the task's ranges, one range after the other (the batch source's reader)."""
        for i, r in enumerate(ranges):
            yield from reader.read(RangePartition(r))
            if i == 0:
                self._after_first_range()

    def _count(self, ranges: Sequence[OffsetRange]) -> Iterator[Any]:
        """``txstore.countMessages``: each range read whole and its messages counted; one row per
        range, all in one record batch.

        As the per-range count path: no row per message is built or handed to Spark (the
        reader's checks of the planned log are the same); a retried task reads its ranges again
        and counts the same messages.
        """
        import pyarrow as pa

        if not ranges:
            return
        counts = []
        for i, r in enumerate(ranges):
            n = 0
            for batch in RangeReader(self.options.read.kafka_conf, r):  # to the end: gc paused throughout
                n += len(batch)
            counts.append(n)
            if i == 0:
                self._after_first_range()
        yield pa.RecordBatch.from_pydict(
            {
                "topic": [r.topic for r in ranges],
                "partition": [r.partition for r in ranges],
                "txstore_messages": counts,
            },
            schema=pa.schema(
                [
                    pa.field("topic", pa.string()),
                    pa.field("partition", pa.int32()),
                    pa.field("txstore_messages", pa.int64()),
                ]
            ),
        )


def stream_reader(
    options: Mapping[str, str], schema: Any, default_tasks: int | None = None
) -> TxstoreStreamReader:
    """The reader for ``readStream.format("txstore")`` (options checked here); ``default_tasks``:
    ``txstore.tasks`` when the options do not give it."""
    return TxstoreStreamReader(parse_stream_options(options, os.environ, default_tasks), schema)
