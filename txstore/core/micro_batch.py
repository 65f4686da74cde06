"""What a streaming sink may commit: a micro-batch proven read by its own query, each message once.

A streaming query is the user's: between ``readStream.format("txstore")`` and
``writeStream.format("txstore")`` it may filter, union, join, repartition or keep state, and a
sink may be fed by another source entirely. The sink commits the offset ranges the source
planned (``txn_stream_plans``), so it must prove that the rows it was handed are exactly those
ranges' messages, each at most once, read by this very query's micro-batch. Three witnesses:

- the **plan** (:class:`StreamPlan`): the ranges of the job's last planned micro-batch, and how
  many reading tasks they were cut into;
- the **receipts** (:class:`Receipt`, ``txn_stream_reads``): each reading task, when it has
  read its ranges to their end, records which streaming query and micro-batch ran it (Spark's
  task properties), the Spark stage and partition it ran as, and per range the messages it
  delivered and the fingerprint of the last one;
- the **delivery**: what the sink's writing tasks received, per ``(topic, partition)``: the
  spans of offsets of the rows (a row per message), or the source's count rows
  (``txstore.countMessages``), and the query and micro-batch the writing tasks ran in.

Steps of :func:`verify_micro_batch`, each a named error in one line, raised before anything is
written:

1. the writing tasks ran in one query's micro-batch, the one Spark commits (else
   :class:`MicroBatchNotRead`: no writing task, so nothing of this query was read);
2. every reading task of the plan left a receipt of that query and micro-batch
   (:class:`MicroBatchNotRead`: the plan was read by another query, or by one that stopped
   before its commit, or not at all: a ``rate`` source into the sink, or a union of another
   job's source);
3. no reading task ran twice as different Spark partitions (:class:`MicroBatchReadTwice`:
   a self-union or self-join reads every message twice);
4. every row's message is in a planned range (:class:`RowsOutsideBatch`: another job's source
   in a union, or state kept in the checkpoint emitting earlier messages), no message has two
   rows (:class:`RowsRepeated`), and no range delivered more rows than its task read;
   with count rows, each planned range has exactly one, equal to what its task read.

Fewer rows than messages are allowed (a filter); the offsets still move over the whole range.
Pure: no Spark, Kafka or PostgreSQL.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from txstore.core.errors import TxstoreError
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange, TopicPartition


class MicroBatchNotRead(TxstoreError):
    """The micro-batch the sink commits was not read, whole, by its own query's txstore source."""


class MicroBatchReadTwice(TxstoreError):
    """A reading task of the micro-batch ran twice as different Spark partitions (a self-union or join)."""


class RowsOutsideBatch(TxstoreError):
    """The sink received a row of a message outside its micro-batch's planned ranges."""


class RowsRepeated(TxstoreError):
    """The sink received two rows of one message (its count would count it twice)."""


@dataclass(frozen=True)
class RangeRead:
    """One range as a reading task read it: the messages it delivered and the last one's fingerprint."""

    range: OffsetRange
    messages: int
    last: Fingerprint | None = None


@dataclass(frozen=True)
class Receipt:
    """What one reading task of a plan read (``txn_stream_reads``)."""

    task: int
    stage: int
    spark_partition: int
    query_id: str | None
    batch_id: int | None
    reads: tuple[RangeRead, ...] = ()
    run_id: str | None = None


Piece = tuple[int, int, int]
"""A piece of a planned range, read by one task: ``(from, until, task)``."""


@dataclass(frozen=True)
class StreamPlan:
    """A job's planned micro-batch (``txn_stream_plans``): ``ranges`` in ``tasks`` reading tasks,
    each range with its task's index in ``task_of``, or, cut for ``minPartitions``, its pieces in
    ``pieces`` (each read by its own task; committed together, as the whole range)."""

    plan_id: str
    ranges: tuple[OffsetRange, ...]
    tasks: int
    task_of: Mapping[TopicPartition, int] = field(default_factory=dict)
    committed_by: str | None = None
    pieces: Mapping[TopicPartition, tuple[Piece, ...]] = field(default_factory=dict)

    @property
    def reading(self) -> tuple[OffsetRange, ...]:
        """The ranges with offsets to read (the rest only enter the job)."""
        return tuple(r for r in self.ranges if r.size > 0)

    def pieces_of(self, r: OffsetRange) -> tuple[Piece, ...]:
        """``r``'s pieces in offset order: the whole range in one task unless it was cut."""
        return self.pieces.get(r.key) or ((r.from_offset, r.until_offset, self.task_of.get(r.key, 0)),)

    def tasks_of(self, r: OffsetRange) -> set[int]:
        return {task for _, _, task in self.pieces_of(r)}


@dataclass(frozen=True)
class Delivery:
    """What the sink's writing tasks received.

    ``runs``: the (query, micro-batch, run) each writing task ran in; ``spans``: per partition, the
    offsets of the rows as ``[low, high)`` spans, all tasks' together (each task's disjoint;
    :func:`merge_spans` finds a message two tasks both had);
    ``counts``: the source's count rows, ``(range, messages)`` (``txstore.countMessages``),
    or None when the rows are a row per message.
    """

    runs: frozenset[tuple[str | None, int | None, str | None]]
    spans: Mapping[TopicPartition, Sequence[tuple[int, int]]] = field(default_factory=dict)
    counts: Sequence[tuple[OffsetRange, int]] | None = None


def spans_array(spans: Iterable[tuple[int, int]]) -> bytes:
    """Spans as the bytes of an ``array('q')`` of ``low, high`` pairs: a compact commit message."""
    flat = array("q")
    for low, high in spans:
        flat.append(low)
        flat.append(high)
    return flat.tobytes()


def spans_from_array(data: bytes) -> list[tuple[int, int]]:
    flat = array("q")
    flat.frombytes(data)
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def merge_spans(parts: Iterable[Iterable[tuple[int, int]]]) -> tuple[list[tuple[int, int]], int | None]:
    """Spans of offsets from several tasks as sorted disjoint spans, neighbours joined; and the first
    offset two of them share (None: none), which is a message with two rows."""
    spans = sorted(s for part in parts for s in part)
    merged: list[tuple[int, int]] = []
    repeated = None
    for low, high in spans:
        if merged and low < merged[-1][1]:
            if repeated is None:
                repeated = low
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        elif merged and low == merged[-1][1]:
            merged[-1] = (merged[-1][0], high)
        else:
            merged.append((low, high))
    return merged, repeated


def _sink_hint() -> str:
    return (
        "the txstore sink commits only a micro-batch that its own query read with one "
        "readStream.format('txstore') of the same txstore.job"
    )


def verify_micro_batch(
    job: str, batch_id: int, plan: StreamPlan, receipts: Sequence[Receipt], delivery: Delivery
) -> dict[TopicPartition, RangeRead]:
    """Steps 1-4 of the module docstring; the planned ranges' reads, by partition, to commit."""
    where = f"job {job!r} micro-batch {batch_id}"
    reading = plan.reading
    if not reading and not delivery.spans and not delivery.counts:
        return {}
    runs = {run for run in delivery.runs}
    if not runs:
        raise MicroBatchNotRead(
            f"{where}: the sink received no rows from any task, yet the job's planned micro-batch "
            f"has {len(reading)} ranges to read: this query did not read it; nothing was written. "
            + _sink_hint()
        )
    if len(runs) > 1 or next(iter(runs))[1] not in (None, batch_id):
        raise MicroBatchNotRead(
            f"{where}: the sink's tasks ran in {_describe_runs(runs)}; nothing was written. " + _sink_hint()
        )
    query_id, _, run_id = next(iter(runs))
    # This run's receipts: a restarted query re-reads its last micro-batch under the same query
    # and micro-batch ids, as a new run.
    ours = [
        r for r in receipts if (r.query_id, r.run_id) == (query_id, run_id) and r.batch_id in (None, batch_id)
    ]
    by_task: dict[int, set[tuple[int, int]]] = {}
    for r in ours:
        by_task.setdefault(r.task, set()).add((r.stage, r.spark_partition))
    needed = sorted({t for r in reading for t in plan.tasks_of(r)})
    unread = [t for t in needed if t not in by_task]
    if unread:
        others = sorted({(r.query_id, r.batch_id) for r in receipts if r not in ours}, key=str)
        by = (
            f"it was read by {_describe_runs(others)} (another query of this job, or one that "
            "stopped before its commit)"
            if others
            else "no task of this query read it (a source other than txstore's, or another job's)"
        )
        first = next(r for r in reading if plan.tasks_of(r) & set(unread))
        raise MicroBatchNotRead(
            f"{where} of query {query_id}: the job's planned micro-batch ({first}"
            f"{', ...' if len(reading) > 1 else ''}) was not read by this micro-batch: {by}; nothing "
            "was written. " + _sink_hint()
        )
    twice = next((t for t, runs_of in sorted(by_task.items()) if len(runs_of) > 1), None)
    if twice is not None:
        first = next((r for r in reading if twice in plan.tasks_of(r)), reading[0])
        raise MicroBatchReadTwice(
            f"{where}: this query read the micro-batch's messages twice (range {first} was read as "
            f"{len(by_task[twice])} Spark partitions: a self-union or self-join of the txstore "
            "source); every message would be counted twice; nothing was written. Read the source "
            "once per query"
        )
    piece_reads: dict[tuple[TopicPartition, int, int], RangeRead] = {}
    for receipt in ours:
        for read in receipt.reads:
            piece_reads[(read.range.key, read.range.from_offset, read.range.until_offset)] = read
    planned = {r.key: r for r in reading}
    reads: dict[TopicPartition, RangeRead] = {}
    for planned_range in reading:
        cut = plan.pieces_of(planned_range)
        whole = whole_read(planned_range, [piece_reads.get((planned_range.key, a, b)) for a, b, _ in cut])
        if whole is None:
            raise MicroBatchNotRead(
                f"{where}: no task of this query read range {planned_range} of the planned micro-batch"
                f"{' whole' if len(cut) > 1 else ''}; nothing was written. " + _sink_hint()
            )
        reads[planned_range.key] = whole
    if delivery.counts is not None:
        _check_counts(where, plan, planned, piece_reads, delivery.counts)
    else:
        _check_spans(where, planned, reads, delivery.spans)
    return reads


def whole_read(r: OffsetRange, pieces: Sequence[RangeRead | None]) -> RangeRead | None:
    """The read of range ``r`` from its pieces' reads, in offset order (None: a piece unread): the
    messages added up, the last message the last piece's that has one (a piece may hold only
    aborted transactions' offsets)."""
    if any(p is None for p in pieces):
        return None
    read = [p for p in pieces if p is not None]
    last = next((p.last for p in reversed(read) if p.last is not None), None)
    return RangeRead(r, sum(p.messages for p in read), last)


def _describe_runs(runs: Iterable[tuple[Any, ...]]) -> str:
    return ", ".join(
        f"query {run[0] or 'unknown'} micro-batch {'unknown' if run[1] is None else run[1]}" for run in runs
    )


def _outside(
    where: str, topic: str, partition: int, low: int, high: int, r: OffsetRange | None
) -> RowsOutsideBatch:
    span = "none" if r is None else f"[{r.from_offset}, {r.until_offset})"
    return RowsOutsideBatch(
        f"{where}: the sink received rows of topic {topic!r} partition {partition} offsets "
        f"{low}..{high}, outside this micro-batch's range {span}: rows of another source (a union "
        "with another job's or another kind of source), or rows a stateful operator (aggregation, "
        "deduplication, join) kept in the checkpoint from earlier micro-batches; txstore cannot "
        "count them exactly once; nothing was written. Write each micro-batch's own rows of one "
        "readStream.format('txstore') of this job"
    )


def _check_spans(
    where: str,
    planned: Mapping[TopicPartition, OffsetRange],
    reads: Mapping[TopicPartition, RangeRead],
    spans: Mapping[TopicPartition, Sequence[tuple[int, int]]],
) -> None:
    for key in sorted(spans, key=lambda k: (str(k[0]), k[1])):
        parts, repeated = merge_spans([spans[key]])
        if not parts:
            continue
        topic, partition = key
        r = planned.get(key)
        if repeated is not None and r is not None and r.from_offset <= repeated < r.until_offset:
            raise repeated_error(where, topic, partition, repeated)
        low, high = parts[0][0], parts[-1][1] - 1
        if r is None or low < r.from_offset or high >= r.until_offset:
            raise _outside(where, topic, partition, low, high, r)
        rows = sum(h - lo for lo, h in parts)
        if rows > reads[key].messages:
            raise RowsRepeated(
                f"{where}: the sink received {rows} rows of distinct offsets of topic {topic!r} "
                f"partition {partition} range [{r.from_offset}, {r.until_offset}), which holds "
                f"{reads[key].messages} messages: rows that are not this range's messages; nothing "
                "was written"
            )


def repeated_error(where: str, topic: str, partition: int, offset: int) -> RowsRepeated:
    """Two rows of one message: a self-union, a join or explode that repeats a message's row."""
    return RowsRepeated(
        f"{where}: the sink received two rows of the message at topic {topic!r} partition "
        f"{partition} offset {offset} (a self-union, or a join or explode repeating a message's "
        "row): it would be counted twice; nothing was written. Count each message's row once"
    )


def _check_counts(
    where: str,
    plan: StreamPlan,
    planned: Mapping[TopicPartition, OffsetRange],
    reads: Mapping[tuple[TopicPartition, int, int], RangeRead],
    counts: Sequence[tuple[OffsetRange, int]],
) -> None:
    """One count row per piece of each planned range (a range not cut is one piece), equal to
    what the piece's task read."""
    expected = {(r.key, a, b) for r in planned.values() for a, b, _ in plan.pieces_of(r)}
    seen: set[tuple[TopicPartition, int, int]] = set()
    for r, n in sorted(counts, key=lambda c: c[0]):
        piece = (r.key, r.from_offset, r.until_offset)
        if piece not in expected:
            raise _outside(where, r.topic, r.partition, r.from_offset, r.until_offset - 1, planned.get(r.key))
        if piece in seen:
            raise RowsRepeated(
                f"{where}: the sink received range {r}'s count row twice (a self-union of the "
                "counting source): it would be counted twice; nothing was written. Read the source once"
            )
        seen.add(piece)
        if n != reads[piece].messages:
            raise RowsOutsideBatch(
                f"{where}: range {r}'s count row says {n} messages, but its reading task read "
                f"{reads[piece].messages}: the row is not this micro-batch's; nothing was written"
            )
    missing = sorted(expected - seen)  # by topic, partition and offset: the first missing piece
    if missing:
        key, a, b = missing[0]
        r = replace(planned[key], from_offset=a, until_offset=b)
        raise MicroBatchNotRead(
            f"{where}: the sink received no count row for range {r} (txstore.countMessages gives one "
            "per range; a filter between source and sink would drop a range's whole count); nothing "
            "was written. Write the counting source's rows as they are"
        )
