"""A micro-batch's offsets from Spark's checkpoint, against the job's rows in ``txn_offsets``.

The checkpoint names no job and may be an older copy, another query's or edited: the truth is in
PostgreSQL. Before anything is read, the stream source checks each micro-batch with these pure
functions, each raising :class:`CheckpointMismatch` (or :class:`ForeignCheckpoint`) in one line
that says how to realign:

- :func:`check_batch_ends`: no partition ends before it starts (a replayed batch 0 the job went
  past, or a damaged checkpoint);
- :func:`check_checkpoint_assigned` and :func:`check_checkpoint_starts`: every partition the
  checkpoint names is one the query reads, and one without a row starts where the job would
  start it;
- :func:`check_checkpoint_in_log`: a start outside Kafka's log where the job's offset is inside
  it is the checkpoint's, told as such (``latestOffset`` runs before the alignment check);
- :func:`check_alignment`: the batch starts at the stored offsets (to be committed) or ends at
  them (a replay of a committed batch), nothing else;
- :func:`check_idle_start`: a micro-batch that reads nothing (never checked by
  :func:`check_alignment`) starts no partition past its stored offset;
- ``failOnDataLoss`` false: :func:`losses_to_record` and :func:`past_recorded_losses` keep the
  checkpoint and ``txn_offsets`` agreeing across offsets Kafka no longer has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from txstore.core.assignment import assigned_keys
from txstore.core.errors import TxstoreError
from txstore.core.ranges import OffsetRange, PartitionWatermarks, TopicPartition, plan_ranges
from txstore.core.starting import StartDecision

NOTHING_WRITTEN_REALIGN = (
    "; nothing was written. To realign: restart the query with a new checkpointLocation (or delete "
    "this one: rm -r CHECKPOINT); it then starts at the stored offsets"
)
"""How a micro-batch the checkpoint does not align with ``txn_offsets`` ends its line."""


class CheckpointMismatch(TxstoreError):
    """The checkpoint's start offsets are not the ones ``txn_offsets`` stores (an older or foreign copy)."""


class ForeignCheckpoint(CheckpointMismatch):
    """The checkpoint is not this job's: it starts a partition the job has no row for elsewhere
    than the job would start it, or names a topic the query does not read."""


def check_batch_ends(
    job: str,
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    stored: Mapping[TopicPartition, int],
) -> None:
    """Raise :class:`CheckpointMismatch` where a micro-batch ends a partition before it starts it.

    Spark gives a checkpoint's batch 0, replayed after a crash before its commit, the start
    ``initialOffset()`` answers again: by then the ``stored`` offsets, which lie past the batch's
    logged end when the job went on without it (another checkpoint's query counted further).
    The checkpoint is behind the job. Any other such batch is a checkpoint edited or damaged."""
    for (topic, partition), until in sorted(end.items()):
        begin = start.get((topic, partition))
        if begin is None or begin <= until:
            continue
        found = stored.get((topic, partition))
        where = f"job {job!r} topic {topic!r} partition {partition}: "
        if found is not None and found > until:
            what = (
                f"txn_offsets stores offset {found} but the checkpoint ends this micro-batch at "
                f"{until} (committed offsets would be read again; the checkpoint is older than the "
                "job's offsets: another query of the job went on since)"
            )
        else:
            what = (
                f"the checkpoint starts this micro-batch at offset {begin} and ends it at {until}, "
                "before its start (the checkpoint was edited or damaged)"
            )
        raise CheckpointMismatch(where + what + NOTHING_WRITTEN_REALIGN)


def past_recorded_losses(
    ranges: Sequence[OffsetRange],
    stored: Mapping[TopicPartition, int],
    lost: Mapping[TopicPartition, Mapping[int, int]],
) -> list[OffsetRange]:
    """``failOnDataLoss`` false: each range past the losses recorded from its start (``lost``: per
    partition, each recorded range's end by its start), chained and within the range, up to the
    stored offset at most. A micro-batch whose aged-out start this source recorded before a crash
    is replayed from its checkpoint's start: the recorded losses lead to the stored offset (or to
    where the sink then committed from, for a replay of a committed micro-batch, which its tasks
    read again), never into offsets Kafka no longer has. A start no recorded loss begins at is
    left as it is (a mismatch stays one for :func:`check_alignment`)."""
    moved = []
    for r in ranges:
        start, ends = r.from_offset, lost.get(r.key, {})
        while start != stored.get(r.key) and start in ends and start < ends[start] <= r.until_offset:
            start = ends[start]
        moved.append(replace(r, from_offset=start))
    return moved


def losses_to_record(
    ranges: Sequence[OffsetRange],
    stored: Mapping[TopicPartition, int],
    watermarks: Sequence[PartitionWatermarks],
) -> list[OffsetRange]:
    """``failOnDataLoss`` false: the offsets of the micro-batch Kafka no longer has, per range that
    starts at its stored offset below the log start: ``[start, min(log start, end))``, never empty
    (an empty range reads nothing and loses nothing)."""
    lows = {w.key: w.low for w in watermarks}
    return [
        OffsetRange(r.topic, r.partition, r.from_offset, min(lows[r.key], r.until_offset))
        for r in ranges
        if r.key in lows and stored.get(r.key) == r.from_offset < min(lows[r.key], r.until_offset)
    ]


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
        f"checkpoint is an older copy, or another query's)" + NOTHING_WRITTEN_REALIGN
    )


def check_checkpoint_in_log(
    job: str,
    start: Mapping[TopicPartition, int],
    stored: Mapping[TopicPartition, int],
    watermarks: Sequence[PartitionWatermarks],
    fail_on_data_loss: bool = True,
) -> None:
    """Raise where the checkpoint's ``start`` lies outside Kafka's log for a partition whose
    ``stored`` offset is another.

    ``latestOffset`` plans from Spark's start, before :func:`check_alignment` runs (in
    ``partitions``): it may differ from the stored offset legitimately there (a checkpoint-led
    job's offsets move at Spark's commit, after the next ``latestOffset``). Out of the log, the
    planner's line would call the checkpoint's offset the *stored* one, with a reset for advice.
    Steps, per partition whose start differs from its stored offset and lies outside
    ``[low, high]``:

    1. the stored offset one the job can go on from (inside the log, or below its start with
       ``fail_on_data_loss`` false): :class:`CheckpointMismatch`, naming both offsets: the
       checkpoint is an older copy or another query's, and a new checkpoint starts at the
       stored offset (a reset would count the job's counted messages again, or skip messages
       it never counted as "aged out");
    2. else the planner's line for the stored offset (:func:`~txstore.core.ranges.plan_ranges`),
       which is then the job's to fix.
    """
    for w in sorted(watermarks, key=lambda w: w.key):
        begin, found = start.get(w.key), stored.get(w.key)
        if begin is None or found is None or begin == found or w.low <= begin <= w.high:
            continue
        if found > w.high or (found < w.low and fail_on_data_loss):
            plan_ranges(job, {w.key: found}, [w])
        where = (
            f"beyond the log-end offset {w.high}" if begin > w.high else f"below the log-start offset {w.low}"
        )
        inside = ", inside the log" if found >= w.low else ""
        raise CheckpointMismatch(
            f"job {job!r} topic {w.topic!r} partition {w.partition}: the checkpoint starts this micro-batch "
            f"at offset {begin}, {where}, but txn_offsets stores offset {found}{inside} (the checkpoint "
            "is an older copy, or another query's)" + NOTHING_WRITTEN_REALIGN
        )


def check_idle_start(
    job: str,
    start: Mapping[TopicPartition, int],
    stored: Mapping[TopicPartition, int],
    pending: Mapping[TopicPartition, tuple[int, int]],
) -> None:
    """Raise :class:`CheckpointMismatch` where a micro-batch that reads nothing starts a partition
    past its stored offset, unless ``pending`` (the job's last planned micro-batch: start and end
    per partition) goes from the stored offset to that start.

    Spark plans no micro-batch that reads nothing, so ``partitions`` and :func:`check_alignment`
    never see its start. A checkpoint ahead of the job (``txn_offsets`` moved back by
    ``txstore reset`` while the old checkpoint was kept, or another query's checkpoint) would then
    keep the query idle, its messages from the stored offset never read, until a new message
    comes. The one start past the stored offset that is the job's: with a sink other than
    txstore's, the offsets move at Spark's commit of a micro-batch
    (:mod:`~txstore.spark.stream.stream_follow`), which Spark makes only when it plans the next
    one, so an idle query starts at its last micro-batch's end until then. A start below the
    stored offset reads nothing only where ``failOnDataLoss`` false skipped what aged out (the
    losses recorded lead there): left to :func:`past_recorded_losses` and ``partitions``.
    """
    for key, begin in sorted(start.items()):
        found = stored.get(key)
        if found is None or begin <= found or pending.get(key) == (found, begin):
            continue
        raise CheckpointMismatch(
            f"job {job!r} topic {key[0]!r} partition {key[1]}: txn_offsets stores offset {found} but the "
            f"checkpoint starts the next micro-batch at {begin}, so the {begin - found} messages from offset "
            f"{found} would never be read (txn_offsets was moved back after the checkpoint was written, by "
            "txstore reset, or the checkpoint is another query's)" + NOTHING_WRITTEN_REALIGN
        )


def check_checkpoint_assigned(
    job: str, assignment: Mapping[str, tuple[int, ...]] | None, start: Mapping[TopicPartition, int], name: str
) -> None:
    """Raise :class:`CheckpointMismatch` if the checkpoint's ``start`` names a partition ``assign``
    (shown as ``name``) no longer names: Spark keeps every partition a query read in its offsets,
    so a query restarted with fewer assigned partitions cannot go on from its checkpoint."""
    if assignment is None:
        return
    dropped = sorted(k for k in start if k not in assigned_keys(assignment))
    if dropped:
        t, p = dropped[0]
        more = f" (and {len(dropped) - 1} more)" if len(dropped) > 1 else ""
        raise CheckpointMismatch(
            f"job {job!r} topic {t!r} partition {p}{more}: the checkpoint reads this partition, but option "
            f"{name} no longer assigns it (a query restarted with fewer assigned partitions); the job's "
            "offset for it stays in txn_offsets; nothing was read. Assign it again, or restart the query "
            "with a new checkpointLocation: it then starts at the job's offsets of the assigned partitions"
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
            f"(it reads {', '.join(repr(t) for t in topics)}): the checkpoint is another query's, or this "
            "query's from before that topic left its subscribe; "
            "nothing was read. Restart the query with a new checkpointLocation: it then starts at the "
            "job's offsets in txn_offsets (startingOffsets where it has none)"
        )
    for key, offset in sorted(start.items()):
        if key in stored:
            continue
        expected = would.get(key)
        if expected is not None and expected[0] == offset:
            continue
        where = "Kafka reports no such partition" if expected is None else f"would start it at {expected[1]}"
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
