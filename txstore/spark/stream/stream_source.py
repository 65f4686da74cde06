"""``spark.readStream.format("txstore")``: the exactly-once stream's source.

A Python streaming data source (``DataSourceStreamReader``, PySpark 4.0 or
newer) for one txstore job; its sink is :mod:`txstore.spark.stream.stream_sink`, and
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

Source options: those of the batch source (:mod:`txstore.spark.source.datasource`) except
``endingOffsets`` (``minPartitions`` cuts a micro-batch's big ranges into pieces, each read by
its own task; the sink commits each range whole), plus ``maxOffsetsPerTrigger``,
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
  (:func:`~txstore.spark.stream.stream_checkpoint.check_checkpoint_starts`: offsets name no
  job, so another job's checkpoint would be trusted otherwise);
- ``partitions(start, end)``: one range per partition with messages, ``[start, end)``, with
  the generation and the last counted message to verify from ``txn_offsets``. The start is
  compared with ``txn_offsets`` first: equal, or the whole batch already committed (a
  replay after a crash), or the query stops with
  :class:`~txstore.spark.stream.stream_checkpoint.CheckpointMismatch` before anything is read
  (every check of the checkpoint's offsets: :mod:`~txstore.spark.stream.stream_checkpoint`);
  then the log with Kafka's (topic IDs, log ends), as the micro-batch may be a replay
  planned before a restart. The planned ranges are stored in
  ``txn_stream_plans`` (one row per job, :func:`~txstore.postgres.stream_plans.save_plan`),
  where the sink finds them. They become Spark's input partitions
  (:class:`~txstore.spark.stream.stream_offsets.StreamPartition`,
  :func:`~txstore.spark.stream.stream_offsets.micro_batch_tasks`): a range
  each while there are no more ranges than ``txstore.tasks``, else ``txstore.tasks`` runs of
  neighbouring ranges. Each task of a Python source feeding a Python sink takes two Python
  workers, so a task per core, not per range, is what a micro-batch of many partitions pays.
  ``txstore.tasks`` defaults to the parallelism :func:`txstore.register` measured (one range
  per task when the source was registered otherwise);
- ``read(partition)`` (:mod:`~txstore.spark.stream.stream_tasks`; the first in a Python worker
  freezes its heap, :mod:`~txstore.spark.runtime.worker_heap`): the task's ranges in their planned order (a retried
  task gets the same pickled partition, so it reads the same messages), through the batch
  source's Arrow reader; with ``txstore.countMessages`` (``true``), each range is read whole and the task yields one
  row per range, ``topic, partition, txstore_messages`` (:data:`~txstore.spark.stream.stream_options.COUNT_SCHEMA`): as the
  per-range count path, no row per message crosses into Spark, and the sink adds the counts
  (Spark's ``numInputRows`` then counts ranges, not messages).

- ``commit(end)``: with a sink other than txstore's, ``txn_offsets`` follows Spark's checkpoint
  (:mod:`~txstore.spark.stream.stream_follow`).

Which partitions the query reads (``subscribe``, ``subscribePattern``, ``assign``), Kafka's log
offsets and topic IDs for them, the job's rows, and where a partition without a row starts:
:mod:`~txstore.spark.stream.stream_partitions`.

The reader's planning connection holds the job's *stream lock* (exclusive,
for the query's life) and the shared job lock (so ``txstore reset`` refuses
while it runs): a second streaming query on the same job is refused with
:class:`~txstore.spark.stream.stream_lock.StreamLocked` (:mod:`~txstore.spark.stream.stream_lock`).

A query runs for days, and PostgreSQL restarts and fails over: a planning session that ended
(the locks go with it) is replaced at the next planning call, connected again within bounds
(:mod:`~txstore.postgres.reconnect`) and its locks taken again; a planning method the end cut
short runs once more on the new session (each is safe to: reads, and idempotent writes), so a
restart costs a pause, not the query (:mod:`~txstore.spark.stream.stream_session`). If another
query of the job took the stream lock meanwhile, this one stops with ``StreamLocked``, before
planning anything.

The lines the planning methods and the reading tasks raise come from code shared with the jobs;
their advice is restated for a streaming query (:mod:`~txstore.spark.stream.stream_advice`: options and
restarts, not a job's flags).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import psycopg
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from txstore.core.errors import ConfigError
from txstore.core.idle import IdlePlan, idle_plan, next_is_idle
from txstore.core.patterns import PatternTopics
from txstore.core.ranges import (
    IDLE_TOPIC_ID_SECONDS,
    OffsetRange,
    PartitionWatermarks,
    TopicPartition,
    aged_out,
    limit_ranges,
    plan_ranges,
    split_ranges,
)
from txstore.kafka.client import Watermarks
from txstore.kafka.topic_ids import TopicIds
from txstore.postgres import store
from txstore.postgres.stream_plans import save_plan
from txstore.spark.runtime.worker_log import worker_info_to_stderr
from txstore.spark.source.datasource import TxstoreReader
from txstore.spark.stream.stream_advice import restating
from txstore.spark.stream.stream_checkpoint import (
    CheckpointMismatch,
    check_alignment,
    check_batch_ends,
    check_checkpoint_assigned,
    check_checkpoint_in_log,
    check_checkpoint_starts,
    check_idle_start,
    losses_to_record,
    past_recorded_losses,
    would_start,
)
from txstore.spark.stream.stream_follow import FollowsCheckpoint
from txstore.spark.stream.stream_offsets import (
    Offsets,
    StreamPartition,
    batch_ranges,
    micro_batch_tasks,
    offsets_dict,
    offsets_map,
)
from txstore.spark.stream.stream_options import (
    COUNT_SCHEMA,
    StreamOptions,
    parse_stream_options,
)
from txstore.spark.stream.stream_partitions import QueryPartitions
from txstore.spark.stream.stream_session import again_on_a_new_session
from txstore.spark.stream.stream_tasks import ReadingTasks

log = logging.getLogger("txstore")

_ReaderMixins: tuple[Any, ...] = ()
try:  # PySpark 4.2+: Trigger.AvailableNow stops at the log ends seen when the query started
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    _ReaderMixins = (SupportsTriggerAvailableNow,)
except ImportError:  # older: Spark reads everything available in one batch instead
    pass


class TxstoreStreamReader(
    QueryPartitions,
    FollowsCheckpoint,
    ReadingTasks,
    DataSourceStreamReader,
    *_ReaderMixins,  # type: ignore[misc]
):
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
        self._session: int | None = None  # its backend pid: once set, a new connection is a reconnect
        # The planning methods' Kafka admin client, kept across micro-batches (as a job keeps its).
        self._kafka: Watermarks | None = None
        self._ids: TopicIds | None = None  # the planning methods' topic IDs, kept as _kafka is
        self._ids_checked: dict[str, float] = {}  # per topic, when its ID was last asked (monotonic)
        self._rows_version = ""  # the job's rows' version as last read, and their topics
        self._row_topics: tuple[str, ...] = ()
        self._idle: IdlePlan | None = None  # the last end, while idle (:mod:`txstore.core.idle`)
        self._idle_end: Offsets = {}  # and that end as given to Spark, given again while idle
        self._subscribed = False  # the job's subscription recorded (txn_subscriptions), once a reader
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow's end
        self._last_end: dict[TopicPartition, int] | None = None  # PySpark 4.0: latestOffset() has no start
        self._assignment_checked = False  # assign: its partitions checked against Kafka's, once
        # subscribePattern: the last resolution, and the topics the planning methods use (else subscribe's)
        self._resolved: PatternTopics | None = None
        self._topics: tuple[str, ...] = options.read.topics
        self._told: tuple[str, ...] | None = None  # the matched topics last logged

    def stop(self) -> None:
        self._idle = None  # a stopped reader keeps no idle plan: its clients go below
        self._close_session()
        if self._kafka is not None:
            self._kafka.close()
        self._kafka = None
        if self._ids is not None:
            self._ids.close()
        self._ids = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"] = None  # the planner's alone: a task opens neither
        state["_session"] = None
        state["_kafka"] = None
        state["_ids"] = None
        state["_rows_version"] = ""  # the planning methods' too: a task reads its own range's rows
        state["_idle"] = None
        state["_idle_end"] = {}
        return state

    @restating
    @again_on_a_new_session
    def initialOffset(self) -> Offsets:
        offsets = self._initial_offsets()
        self._last_end = offsets
        return offsets_dict(offsets)

    def _initial_offsets(self) -> dict[TopicPartition, int]:
        conn = self._db()
        state = self._job_state(conn)
        watermarks = self._watermarks()
        committed, history = self._start_rows(conn, self._start_decisions(state[0], watermarks), state)
        self._topic_ids(conn, history, committed, watermarks)
        return committed

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # PySpark 4.2+

        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    @restating
    @again_on_a_new_session
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {w.key: w.high for w in self._watermarks()}

    @restating
    @again_on_a_new_session
    def latestOffset(self, start: Mapping[str, Any] | None = None, limit: Any = None) -> Offsets:
        """The next end: Kafka's log ends (capped by the limit), after the planner's checks.

        Without ``start`` (PySpark before 4.2) the last end given out is the start, or the
        stored offsets after a restart; without ``limit``, ``maxOffsetsPerTrigger`` applies.
        """
        job = self.options.job
        conn = self._db()
        if self._idle is not None:
            if self._still_idle(conn, self._idle, start):
                self._last_end = dict(self._idle.ends)
                return _copied(self._idle_end)
            self._idle = None
        if start is not None:
            begin = offsets_map(start)
            max_offsets = getattr(limit, "max_rows", None)
        else:
            # PySpark 4.0/4.1 may ask before initialOffset() (Trigger.AvailableNow fixes its target
            # first): the query's first start is then the initial offset.
            begin = self._last_end if self._last_end is not None else self._initial_offsets()
            max_offsets = self.options.max_offsets_per_trigger
        stored, history = self._job_state(conn)
        rows, row_topics = self._rows_version, self._row_topics
        # A partition at its log end has nothing to read: its log start is not asked. Only where
        # the job has a row: one without is decided from the log's real earliest offset.
        now = self._watermarks(settled={k: v for k, v in begin.items() if k in stored})
        decisions = self._start_decisions(stored, now)
        read = self.options.read
        check_checkpoint_assigned(job, read.assignment, begin, read.name("assign"))
        check_checkpoint_starts(job, self._topics, begin, stored, would_start(decisions))
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
        if not read.fail_on_data_loss:  # aged-out starts: the batch reads from the log start
            committed.update({r.key: r.until_offset for r in aged_out(committed, watermarks)})
        check_checkpoint_in_log(job, committed, stored, now, read.fail_on_data_loss)
        topic_ids = self._topic_ids(conn, history, committed, watermarks)
        # Aged out, out of log, gone, another topic ID: one line (its reset step restated, @restating).
        ranges = plan_ranges(job, committed, watermarks, history, topic_ids)
        ranges = [r for r in ranges if r.key not in entering]
        if not ranges and any(begin[k] > stored[k] for k in begin if k in stored):
            check_idle_start(job, begin, stored, self._awaiting_spark_commit(conn))
        end = dict(committed)
        end.update({r.key: r.until_offset for r in limit_ranges(ranges, max_offsets)})
        self._last_end = end
        # Kept only if idle: every partition at its log end from ``begin`` (none entering), and
        # ``begin`` names no other partition (its end then is exactly ``begin``).
        idle = idle_plan(
            row_topics, rows, begin, now, ranges, self._ids_checked, time.monotonic(), IDLE_TOPIC_ID_SECONDS
        )
        self._idle = idle if idle is not None and idle.ends == begin else None
        self._idle_end = offsets_dict(end)
        return _copied(self._idle_end)

    def _still_idle(self, conn: psycopg.Connection, plan: IdlePlan, start: Mapping[str, Any] | None) -> bool:
        """Whether this micro-batch's end is ``plan``'s again: from the same start, then
        :func:`~txstore.core.idle.next_is_idle` (the job's rows, then the log ends with the kept
        client and no metadata request). The checks of the checkpoint against the rows are
        functions of these alone: they passed for them.

        The same start: Spark's ``start`` is exactly the end given for ``plan`` (compared as
        Spark gives it: at 1,024 partitions, parsing it and building the end again took 1.5 ms
        of an idle micro-batch); without one (PySpark 4.0/4.1), the last end given out."""
        kafka = self._kafka
        if kafka is None:
            return False
        if not (start == self._idle_end if start is not None else self._last_end == plan.ends):
            return False
        return next_is_idle(
            plan,
            lambda: store.rows_version(conn, self.options.job, plan.topics),
            lambda: kafka.ends(self.options.read.kafka_conf, list(plan.ends)),
            time.monotonic,
        )

    @restating
    @again_on_a_new_session
    def partitions(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> Sequence[InputPartition]:
        job = self.options.job
        conn = self._db()
        begin, finish = offsets_map(start), offsets_map(end)
        committed, history = self._job_state(conn)
        check_batch_ends(job, begin, finish, committed)
        planned = batch_ranges(begin, finish)
        now = self._watermarks()
        topics = self._topics
        # A partition the job has no row for starts here only where the job would start it (a
        # checkpoint names no job: another's would be trusted); its row is stored then.
        decisions = self._start_decisions(committed, now)
        check_checkpoint_assigned(job, self.options.read.assignment, begin, self.options.read.name("assign"))
        check_checkpoint_starts(
            job, topics, {r.key: r.from_offset for r in planned}, committed, would_start(decisions)
        )
        missing = {r.key for r in planned if r.key not in committed}
        if missing:
            committed, history = self._start_rows(
                conn, [d for d in decisions if (d.topic, d.partition) in missing], (committed, history)
            )
        if not self.options.read.fail_on_data_loss:
            planned, committed = self._skip_lost(conn, planned, committed, now)
        try:
            check_alignment(job, planned, {r.key: committed.get(r.key) for r in planned})
        except CheckpointMismatch:
            if not self._caught_up(conn, planned):
                raise
            committed, history = self._job_state(conn)
            check_alignment(job, planned, {r.key: committed.get(r.key) for r in planned})
        # The log is still the one the batch was planned on (a restart replays a batch planned before).
        starts = {r.key: r.from_offset for r in planned}
        if not self.options.read.fail_on_data_loss:  # a range wholly aged out since: recorded, empty
            starts.update({r.key: r.until_offset for r in aged_out(starts, now)})
        finishing = [w for w in now if w.key in finish]
        topic_ids = self._topic_ids(conn, history, starts, finishing)
        plan_ranges(job, starts, finishing, history, topic_ids)
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
        reading = [r for r in ranges if r.size > 0]
        min_partitions = self.options.read.min_partitions
        if min_partitions:  # big ranges cut into pieces, each read by its own task, committed whole
            pieces = split_ranges(reading, min_partitions)
            tasks = micro_batch_tasks(pieces, max(self.options.tasks or 0, min_partitions))
        else:
            tasks = micro_batch_tasks(reading, self.options.tasks)
        plan_id = save_plan(conn, job, start, end, ranges, tasks)
        self._last_end = finish
        return [StreamPartition(run, plan_id, i) for i, run in enumerate(tasks)]

    def _skip_lost(
        self,
        conn: psycopg.Connection,
        planned: list[OffsetRange],
        committed: dict[TopicPartition, int],
        now: Sequence[PartitionWatermarks],
    ) -> tuple[list[OffsetRange], dict[TopicPartition, int]]:
        """``failOnDataLoss`` false: the micro-batch's offsets Kafka no longer has are skipped and
        recorded in ``txn_lost_ranges`` now, the stored offsets moved past them in the same
        statement (:func:`~txstore.postgres.store.record_lost_ranges`, as a job's
        ``--fail-on-data-loss false``); the ranges then start at the stored offsets. A replay
        passes over what an earlier attempt recorded
        (:func:`~txstore.spark.stream.stream_checkpoint.past_recorded_losses`), so the
        checkpoint's start and ``txn_offsets`` still agree; the sink commits the rest."""
        job = self.options.job
        topics = sorted({r.topic for r in planned})
        planned = past_recorded_losses(planned, committed, store.lost_ranges(conn, job, topics))
        lost = losses_to_record(planned, committed, now)
        if not lost:
            return planned, committed
        recorded = store.record_lost_ranges(conn, job, lost)
        worker_info_to_stderr()
        for r in recorded:
            log.warning(
                "job %s: %s/%d: offsets %d -> %d (%d messages) aged out of Kafka before they were "
                "counted; skipped and recorded in txn_lost_ranges (failOnDataLoss false)",
                job,
                r.topic,
                r.partition,
                r.from_offset,
                r.until_offset,
                r.size,
            )
        committed, _ = self._job_state(conn)
        return past_recorded_losses(planned, committed, store.lost_ranges(conn, job, topics)), committed


def stream_reader(
    options: Mapping[str, str], schema: Any, default_tasks: int | None = None
) -> TxstoreStreamReader:
    """The reader for ``readStream.format("txstore")`` (options checked here); ``default_tasks``:
    ``txstore.tasks`` when the options do not give it."""
    return TxstoreStreamReader(parse_stream_options(options, os.environ, default_tasks), schema)


def _copied(offsets: Offsets) -> Offsets:
    """A copy of ``offsets`` for Spark: the end kept to compare the next start with is never
    handed out, so nothing a caller does to what it was given changes that comparison."""
    return {topic: dict(partitions) for topic, partitions in offsets.items()}
