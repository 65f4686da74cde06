"""Each range's messages as the reading tasks counted them, for a DataFrame job's report.

A DataFrame job (:mod:`txstore.modes.dataframe`, :mod:`txstore.modes.results_table`)
hands its messages to Spark, and the user's query consumes them: the driver never
sees a message. A range's offsets are not its messages: on a transactional topic
every commit or abort leaves a control marker, and a read-committed consumer skips
aborted messages; a compacted topic has holes. The report (its log line,
``txstore_messages``) needs what the tasks read. Steps:

1. the driver makes a :class:`RangeCounts` for one Spark action and passes it to
   :func:`~txstore.spark.ranges.tasks.read_ranges`, which notes the pieces to read
   (:meth:`RangeCounts.reading`) and hands the reading tasks its :class:`CountChannel`;
2. each task counts the messages of every piece it reads *to its end*, and hands the
   counts back once its reading is done (:meth:`CountChannel.handed_back`):

   - on classic Spark through one accumulator per ``SparkContext`` (nothing per row),
     filed under the :class:`RangeCounts`'s token;
   - under Spark Connect, which has no accumulators, as one marker row per piece with a
     column of its own (:data:`MARKER`, null on every message's row), which an
     ``Observation`` collects as JSON lines (``collect_list`` skips nulls) and a filter then drops,
     below the user's query (:meth:`RangeCounts.wrap`; Spark pushes no filter through
     an observation, so every marker reaches it). An observation would not do on
     classic Spark: a ``toLocalIterator`` whose plan has no shuffle ends its query
     before its partitions are read, and reports nothing;
3. after the action, :meth:`RangeCounts.messages` adds each range's pieces up.

Why exact: a retried or speculative task, a stage run again, or a query that reads
the frame twice, reports the same piece again with the same count (reads are
deterministic), so pieces are keyed, never added twice; Spark drops a failed
attempt's counts. A range with a piece no task reported (the query stopped reading
early, as a ``limit`` does, or Spark never read it) is left out of
:meth:`RangeCounts.messages`: its caller reports the range's offset span instead. So does every
range under a Spark Connect client older than PySpark 4.2 (:func:`observations_merge`).
"""

from __future__ import annotations

import json
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txstore.core.ranges import OffsetRange, TopicPartition
from txstore.spark.runtime.sessions import is_connect

if TYPE_CHECKING:
    import pyarrow as pa

MARKER = "__txstore_range"
"""Under Spark Connect, the column of the marker rows: a piece and its messages; null on messages."""

Piece = tuple[str, int, int, int]
"""A piece read: topic, partition, its first offset and its end."""

Counts = dict[str, dict[Piece, int]]
"""The accumulator's value: under each :class:`RangeCounts`'s token, its pieces' messages."""


def piece_of(offset_range: OffsetRange) -> Piece:
    return (offset_range.topic, offset_range.partition, offset_range.from_offset, offset_range.until_offset)


class _PieceCounts:
    """The accumulator's ``AccumulatorParam`` (PySpark asks for these two methods only): tasks'
    counts merged by token and piece, the same piece again (a retry) replacing itself."""

    def zero(self, value: Counts) -> Counts:
        return {}

    def addInPlace(self, value1: Counts, value2: Counts) -> Counts:
        for token, pieces in value2.items():
            value1.setdefault(token, {}).update(pieces)
        return value1


def _marker_type() -> pa.DataType:
    import pyarrow as pa

    return pa.struct(
        [
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("from_offset", pa.int64()),
            pa.field("until_offset", pa.int64()),
            pa.field("messages", pa.int64()),
        ]
    )


def _filler(field: pa.Field, rows: int) -> pa.Array:
    """A marker row's value in a data column: null where the column may be null, else a zero of
    its type (the column keeps the type Spark was told; the row is dropped before anyone reads it)."""
    import pyarrow as pa

    if field.nullable:
        return pa.nulls(rows, field.type)
    t = field.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        zero: Any = ""
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        zero = b""
    elif pa.types.is_integer(t) or pa.types.is_timestamp(t):
        zero = 0
    else:
        raise TypeError(f"no marker value for a non-nullable column {field.name} of type {t}")
    return pa.array([zero] * rows, t)


@dataclass(frozen=True)
class CountChannel:
    """What a reading task gets (pickled into it): how to hand its pieces' counts back."""

    token: str
    accumulator: Any = None  # classic: the SparkContext's accumulator; None: marker rows (Connect)

    def handed_back(
        self, batches: Iterable[pa.RecordBatch], schema: pa.Schema, counted: Mapping[OffsetRange, int]
    ) -> Iterator[pa.RecordBatch]:
        """``batches`` (of ``schema``) as the task hands them to Spark, then its counts.
        ``counted`` is filled by the reading as each piece ends: complete once ``batches`` is."""
        if self.accumulator is not None:
            yield from batches
            self.accumulator.add({self.token: {piece_of(r): n for r, n in counted.items()}})
            return
        import pyarrow as pa

        kind = _marker_type()
        marked = schema.append(pa.field(MARKER, kind))
        for batch in batches:
            yield pa.RecordBatch.from_arrays([*batch.columns, pa.nulls(batch.num_rows, kind)], schema=marked)
        if counted:
            rows = len(counted)
            markers = pa.array(
                [
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "from_offset": r.from_offset,
                        "until_offset": r.until_offset,
                        "messages": n,
                    }
                    for r, n in counted.items()
                ],
                kind,
            )
            yield pa.RecordBatch.from_arrays([*(_filler(f, rows) for f in schema), markers], schema=marked)


class _Tally:
    """A ``SparkContext``'s accumulator of counts, and the tokens of the :class:`RangeCounts`
    still alive: counts under any other token (a task that ended after its action was
    answered) are dropped, so the value never grows past the counts being waited for."""

    def __init__(self, context: Any) -> None:
        self.accumulator = context.accumulator({}, _PieceCounts())
        self.alive: set[str] = set()
        self.lock = threading.Lock()

    def take(self, token: str) -> dict[Piece, int]:
        with self.lock:
            self.alive.discard(token)
            value: Counts = self.accumulator.value  # the driver's own dict, merged into in place
            mine = value.pop(token, {})
            for stale in tuple(value):
                if stale not in self.alive:
                    value.pop(stale, None)
        return mine

    def forget(self, token: str) -> None:
        with self.lock:
            self.alive.discard(token)


_tallies: weakref.WeakKeyDictionary[Any, _Tally] = weakref.WeakKeyDictionary()
_tallies_lock = threading.Lock()


def _tally(spark: Any) -> _Tally:
    context = spark.sparkContext
    with _tallies_lock:
        if context not in _tallies:
            _tallies[context] = _Tally(context)
        return _tallies[context]


class RangeCounts:
    """The counts of one Spark action's reads (the module's steps), on classic Spark or Connect."""

    def __init__(self, spark: Any) -> None:
        self.token = uuid.uuid4().hex
        self.expected: set[Piece] = set()
        self.observation: Any = None
        self._tally: _Tally | None = None
        self.channel: CountChannel | None = None  # None: nothing counted, the spans are reported
        if is_connect(spark):
            if not observations_merge():
                return
            from pyspark.sql.connect.observation import Observation

            self.observation = Observation(f"txstore_range_counts_{self.token}")
            self.channel = CountChannel(self.token)
        else:
            self._tally = _tally(spark)
            with self._tally.lock:
                self._tally.alive.add(self.token)
            weakref.finalize(self, self._tally.forget, self.token)
            self.channel = CountChannel(self.token, self._tally.accumulator)

    def reading(self, pieces: Sequence[OffsetRange]) -> CountChannel | None:
        """Note the pieces the action reads; the channel their tasks hand counts back through
        (None: they count nothing)."""
        self.expected.update(piece_of(p) for p in pieces if p.size > 0)
        return self.channel

    def schema(self, schema: Any) -> Any:
        """The Spark schema of what the reading tasks hand Spark: ``schema``, and under Connect
        the marker column."""
        if self.observation is None:
            return schema
        from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

        kind = StructType(
            [
                StructField("topic", StringType()),
                StructField("partition", IntegerType()),
                StructField("from_offset", LongType()),
                StructField("until_offset", LongType()),
                StructField("messages", LongType()),
            ]
        )
        return StructType([*schema.fields, StructField(MARKER, kind, True)])

    def wrap(self, frame: Any) -> Any:
        """The read frame as the query gets it: under Connect, the markers observed, then dropped."""
        if self.observation is None:
            return frame
        from pyspark.sql.connect.functions import builtin as functions

        # One string, a JSON line per marker: a Connect server of PySpark 4.0 cannot send an
        # observed array back ("Unsupported component type class java.lang.Object in arrays").
        pieces = functions.concat_ws("\n", functions.collect_list(functions.to_json(functions.col(MARKER))))
        observed = frame.observe(self.observation, pieces.alias("pieces"))
        return observed.where(f"`{MARKER}` IS NULL").drop(MARKER)

    def messages(self, ranges: Sequence[OffsetRange]) -> dict[TopicPartition, int]:
        """After the action: each range's messages, for the ranges every expected piece of which a
        task reported (the module's step 3); call once."""
        if self.channel is None:
            return {}
        reported: dict[Piece, int] = {}
        if self._tally is not None:
            reported = self._tally.take(self.token)
        elif self.observation is not None:
            for line in (self.observation.get.get("pieces") or "").splitlines():
                p = json.loads(line)
                reported[(p["topic"], int(p["partition"]), int(p["from_offset"]), int(p["until_offset"]))] = (
                    int(p["messages"])
                )
        return range_messages(ranges, self.expected, reported)


def observations_merge() -> bool:
    """Whether this process's Spark Connect client can send a plan that holds one observation in
    two branches (a query that unions or joins the batch with itself). PySpark 4.2 and newer
    can; 4.0 and 4.1 merge the branches' observations with ``dict(**a, **b)``, which fails on
    the shared name ("got multiple values for keyword argument"): there the counts are not
    observed, and the report gives the ranges' offset spans, as it did before."""
    from pyspark.version import __version__

    major, minor = (int(x) for x in __version__.split(".")[:2])
    return (major, minor) >= (4, 2)


def range_messages(
    ranges: Sequence[OffsetRange], expected: Iterable[Piece], reported: Mapping[Piece, int]
) -> dict[TopicPartition, int]:
    """Each range's messages: the sum of its ``expected`` pieces' ``reported`` counts, for the
    ranges whose every expected piece was reported (a range with none expected: 0, nothing to
    read); the others are left out."""
    by_partition: dict[TopicPartition, list[Piece]] = {}
    for p in expected:
        by_partition.setdefault((p[0], p[1]), []).append(p)
    out: dict[TopicPartition, int] = {}
    for r in ranges:
        mine = [p for p in by_partition.get(r.key, ()) if r.from_offset <= p[2] < r.until_offset]
        if all(p in reported for p in mine):
            out[r.key] = sum(reported[p] for p in mine)
    return out
