"""Offset ranges as Spark tasks, and ranges as DataFrames.

Ranges are planned on the driver and cut into tasks before the job starts
(:func:`task_groups`): with up to ``TASKS_PER_CORE`` ranges per Spark core,
each range is its own task; with more (many partitions), neighbouring
ranges share one task per core, so a batch pays Spark's per-task cost
(tens of milliseconds, more on a busy machine) once per core rather than
once per partition. Either way a task's ranges are fixed before it
runs, so a retried task re-reads exactly the same ranges; a task's ranges
commit in one transaction, or one by one if that is refused
(:meth:`~txstore.spark.ranges.range_task.RangeTask.run_together`).

Everything here is DataFrame operations that classic PySpark and Spark
Connect both run (no RDDs, no ``sparkContext`` except behind
:func:`is_connect` where Connect lacks an equivalent): a task group is a
partition of ``spark.range(n, numPartitions=n)`` and its work a
``mapInArrow`` function that picks its group by the id it receives.
Per-batch aggregation over the same task groups is :mod:`txstore.spark.ranges.deltas`.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange, TopicPartition, group_ranges
from txstore.kafka.reader import RangeReader
from txstore.spark.runtime.sessions import is_connect
from txstore.spark.runtime.worker_heap import freeze_once
from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS, kafka_source_schema

if TYPE_CHECKING:
    from txstore.spark.ranges.range_counts import CountChannel, RangeCounts
    from txstore.spark.source.pushdown import PartialCount

T = TypeVar("T")

TASKS_PER_CORE = 2
"""Up to this many ranges per core, each range is its own task; beyond, one task per core."""


def task_groups(ranges: Sequence[OffsetRange], cores: int) -> list[list[OffsetRange]]:
    """The ranges, in order, as Spark tasks: one each, or ``cores`` runs of about equal work.

    Up to ``TASKS_PER_CORE * cores`` ranges, every range is its own task.
    More are cut into ``cores`` runs of neighbours
    (:func:`~txstore.core.ranges.group_ranges`; work is a range's size plus
    :data:`~txstore.core.ranges.RANGE_COST_MESSAGES`).
    """
    if len(ranges) <= TASKS_PER_CORE * cores:
        return [[r] for r in ranges]
    return group_ranges(ranges, cores)


_parallelism: dict[int, int] = {}


def default_parallelism(spark: Any) -> int:
    """Spark's default parallelism (cores), on classic and Connect.

    Classic: ``sparkContext.defaultParallelism``. Spark Connect has no
    ``sparkContext`` and ``spark.default.parallelism`` is usually unset, so
    it is measured once per session: ``spark.range`` without a partition
    count is split into the default parallelism, and the highest partition
    id of a small range says how many that is (one tiny Spark job).
    """
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    key = id(getattr(spark, "underlying_session", spark))
    if key not in _parallelism:
        configured = spark.conf.get("spark.default.parallelism", None)
        if configured:
            _parallelism[key] = max(1, int(configured))
        else:
            # A SQL expression, not pyspark.sql.functions: those pick classic or Connect by an
            # environment variable, not by the session they are used with.
            probe = spark.range(0, PARALLELISM_PROBE_ROWS).selectExpr("spark_partition_id() AS p")
            row = probe.groupBy().max("p").first()
            _parallelism[key] = max(1, int(row[0]) + 1)
    return _parallelism[key]


PARALLELISM_PROBE_ROWS = 4096
"""Rows of the range that measures the default parallelism under Connect (at most this many cores)."""


@contextmanager
def job_description(spark: Any, description: str) -> Iterator[None]:
    """Name the Spark jobs started inside (the UI and logs show it).

    Classic: ``setJobDescription``. Spark Connect has no job descriptions
    (no ``sparkContext``): its equivalent is an operation tag, made of
    the description's letters and digits.
    """
    if not is_connect(spark):
        # Classic only: Connect lacks setJobDescription, and a tag is no description in the UI.
        sc = spark.sparkContext
        sc.setJobDescription(description)
        try:
            yield
        finally:
            sc.setJobDescription(None)
        return
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", description).strip("-") or "txstore"
    spark.addTag(tag)
    try:
        yield
    finally:
        spark.removeTag(tag)


def _one_task_per_group(spark: Any, groups: int) -> Any:
    """A DataFrame of ids 0..groups-1, id i alone in partition i.

    ``spark.range`` splits its ids evenly: with as many partitions as ids,
    each partition holds exactly its own index. A function mapped over it
    picks its work by that id, never by ``TaskContext``, so a retried or
    speculative task redoes exactly the same work. ``mapInArrow`` straight
    over ``range`` is a narrow plan without an exchange, so adaptive query
    execution has nothing to coalesce or split.
    """
    return spark.range(0, groups, 1, groups)


_RESULT_SCHEMA = "payload binary"
PICKLES_PER_ROW = 1_000
"""Task outputs pickled together into one result row."""


@dataclass(frozen=True)
class _EachGroup(Generic[T]):
    """mapInArrow function: run ``task`` over the ranges of each group whose id arrives; its
    outputs go back pickled, :data:`PICKLES_PER_ROW` to a row."""

    groups: Sequence[Sequence[OffsetRange]]
    task: Callable[[Iterator[OffsetRange]], Iterable[T]]

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        freeze_once()  # PySpark's collection after each task then skips the imports' objects
        ids = [i for batch in batches for i in batch.column(0).to_pylist()]
        chunk: list[T] = []
        for output in self.task(r for i in ids for r in self.groups[i]):
            chunk.append(output)
            if len(chunk) >= PICKLES_PER_ROW:
                yield pa.RecordBatch.from_pydict({"payload": [pickle.dumps(chunk)]})
                chunk = []
        if chunk:
            yield pa.RecordBatch.from_pydict({"payload": [pickle.dumps(chunk)]})


def _map_groups(
    spark: Any,
    groups: Sequence[Sequence[OffsetRange]],
    task: Callable[[Iterator[OffsetRange]], Iterable[T]],
    description: str,
) -> list[T]:
    """One Spark task per group running ``task`` over its ranges; all outputs, in group order."""
    frame = _one_task_per_group(spark, len(groups)).mapInArrow(
        _EachGroup([list(g) for g in groups], task), _RESULT_SCHEMA
    )
    with job_description(spark, description):
        rows = frame.collect()
    return [output for row in rows for output in pickle.loads(row[0])]


def run_ranges(
    spark: Any,
    ranges: Sequence[OffsetRange],
    task: Callable[[Iterator[OffsetRange]], Iterable[T]],
    description: str,
) -> list[T]:
    """Run ``task`` over the ranges (see :func:`task_groups`); return its outputs in range order."""
    if not ranges:
        return []  # never launch a Spark job for nothing
    return _map_groups(spark, spark_tasks(spark, ranges, None), task, description)


@dataclass(frozen=True)
class _RangeBatches:
    """mapInArrow function: the ranges of each arriving group id, in order, as Arrow record
    batches (Kafka-source columns)."""

    groups: Sequence[Sequence[OffsetRange]]
    kafka_conf: Mapping[str, Any]
    job: str = ""
    ends: Mapping[OffsetRange, Fingerprint] = field(default_factory=dict)  # a range's expected last
    columns: Sequence[str] = KAFKA_SOURCE_COLUMNS
    # the task's counts per group (txstore.spark.source.pushdown), not messages
    partial: PartialCount | None = None
    # each range's messages handed back (txstore.spark.ranges.range_counts)
    counts: CountChannel | None = None

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        from txstore.spark.source.arrow import arrow_schema, coalesce

        freeze_once()
        read = arrow_schema(self.columns)
        ids = [i for batch in batches for i in batch.column(0).to_pylist()]
        ranges = [r for i in ids for r in self.groups[i]]
        counted: dict[OffsetRange, int] = {}  # each range read to its end: its messages
        joined = coalesce(b for r in ranges for b in self._read(r, read, counted))
        out: Iterable[Any] = joined
        handed = read
        if self.partial is not None:
            from txstore.spark.source.pushdown import partial_arrow_schema, task_counts

            out, handed = task_counts(joined, self.partial), partial_arrow_schema(self.partial)
        if self.counts is None:
            yield from out
        else:
            yield from self.counts.handed_back(out, handed, counted)

    def _read(self, offset_range: OffsetRange, schema: Any, counted: dict[OffsetRange, int]) -> Iterator[Any]:
        from txstore.spark.source.arrow import record_batches

        # Spark may stop pulling rows early (limit, take): the GC is paused per batch only.
        reader = RangeReader(
            self.kafka_conf,
            offset_range,
            pause_gc=False,
            job=self.job,
            expect_last=self.ends.get(offset_range),
        )
        yield from record_batches(reader, schema, offset_range.key)
        counted[offset_range] = reader.messages


def spark_tasks(
    spark: Any, ranges: Sequence[OffsetRange], min_partitions: int | None
) -> list[list[OffsetRange]]:
    """The Spark tasks that read ``ranges``: per-range, per-batch and DataFrame jobs alike.

    Without ``min_partitions``: :func:`task_groups` over the session's cores
    (with many ranges, a task per core reads its share in order, so the batch
    pays Spark's per-task cost once per core).
    With it, the user asked for at least that many Spark partitions (the
    ranges were cut into as many pieces): one task per piece.
    """
    if min_partitions is not None:
        return [[r] for r in ranges]
    return task_groups(ranges, default_parallelism(spark))


def read_ranges(
    spark: Any,
    ranges: Sequence[OffsetRange],
    kafka_conf: Mapping[str, Any],
    job: str = "",
    last: Mapping[TopicPartition, Fingerprint] | None = None,
    min_partitions: int | None = None,
    columns: Sequence[str] | None = None,
    partial: PartialCount | None = None,
    counts: RangeCounts | None = None,
) -> Any:
    """The messages of ``ranges`` as a DataFrame with Spark's Kafka-source columns (``columns``:
    only those, in that order; nothing else is built, nor sent to Spark). ``partial``: instead,
    each task's counts per group (:mod:`txstore.spark.source.pushdown`; ``columns`` are ignored).

    One Spark partition per task of :func:`spark_tasks` (``mapInArrow`` over
    :func:`_one_task_per_group`, so classic and Spark Connect alike; each
    task reads its ranges in order, fixed before the job, so a retried task
    reads the same messages), read exactly like the plain-Python path (a
    range's ``verify`` is checked; a recreated topic fails the Spark job with
    :class:`~txstore.core.errors.TopicRecreated`, naming ``job``). ``last``: each
    partition's last message as the driver read it
    (:func:`~txstore.kafka.reader.last_messages`); the range (or piece) that ends the
    partition's read must end on it. ``min_partitions``: at least that many
    Spark partitions, one per range (cut them with
    :func:`~txstore.core.ranges.split_ranges` first). ``counts``: the tasks hand back each
    range's messages through it (:mod:`txstore.spark.ranges.range_counts`), for the driver to ask
    once the frame's action is done.
    """
    chosen = tuple(columns) if columns is not None else KAFKA_SOURCE_COLUMNS
    schema = kafka_source_schema(chosen)
    if partial is not None:
        from txstore.spark.source.pushdown import partial_schema

        chosen, schema = partial.read_columns(), partial_schema(partial)
    if not ranges:
        return spark.createDataFrame([], schema)
    ends = {}
    if last:
        final = {r.key: max(q.until_offset for q in ranges if q.key == r.key) for r in ranges}
        ends = {r: last[r.key] for r in ranges if r.key in last and r.until_offset == final[r.key]}
    groups = spark_tasks(spark, ranges, min_partitions)
    if counts is None:
        return _one_task_per_group(spark, len(groups)).mapInArrow(
            _RangeBatches(groups, dict(kafka_conf), job, ends, chosen, partial), schema
        )
    read = _RangeBatches(groups, dict(kafka_conf), job, ends, chosen, partial, counts.reading(ranges))
    return counts.wrap(_one_task_per_group(spark, len(groups)).mapInArrow(read, counts.schema(schema)))


_PY_ERROR_LINE = re.compile(
    r"^(?:[\w.]+\.)?"
    r"(\w+(?:Error|Unavailable|Missing|Loss|Committed|Gap|Overlap|Log|Failure|Exception|Recreated)): (.+)$"
)


def spark_failure_reason(error: BaseException) -> str:
    """The one line that matters from a failed Spark job: the Python error raised in the task."""
    text = str(error)
    for line in reversed(text.splitlines()):
        match = _PY_ERROR_LINE.match(line.strip())
        if match and match.group(1) not in ("Py4JJavaError", "PythonException", "SparkException"):
            return f"{match.group(1)}: {match.group(2)}"
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0][:500] if lines else type(error).__name__
