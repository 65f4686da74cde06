"""Offset ranges and the planner that cuts them (the KafkaRDD idea, in Python).

A batch is planned on the driver from two plain inputs: the offsets the
database says are committed, and the watermarks Kafka reports now. The
output is one :class:`OffsetRange` per partition that has new data. Each
range is read by exactly one Spark task (several small ranges may share
one), and because a range is fixed before any task runs, a retried task
reads exactly the same messages.

Everything here is pure: no Kafka, Spark or database is needed to test it.
"""

from __future__ import annotations

import itertools
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from txstore.core.errors import DataLoss, OffsetOutOfLog, UnknownTopic
from txstore.core.fingerprint import Fingerprint, recreated_error

TopicPartition = tuple[str, int]
"""``(topic, partition)``: the key of every per-partition mapping."""


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Messages ``[from_offset, until_offset)`` of one Kafka partition.

    ``until_offset`` is exclusive, exactly like ``txn_offsets.off``: after the
    range is committed, the stored offset equals ``until_offset``.

    ``verify``: the last message counted before ``from_offset``, still in the
    log, which the reader compares before delivering anything (a deleted and
    recreated topic holds another message there). ``generation``: the
    partition's generation the range was planned in (``txn_offsets.generation``);
    a commit only moves an offset of that generation. ``log_end``: Kafka's
    log-end offset when the range was planned (None: not known), so the commit
    can record the backlog the range started from (``txn_offsets.lag_samples``).
    None of the three takes part in comparisons.
    """

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    verify: Fingerprint | None = field(default=None, compare=False)
    generation: int = field(default=0, compare=False)
    log_end: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.from_offset <= self.until_offset:
            raise ValueError(
                f"invalid offset range for {self.topic!r} partition {self.partition}: "
                f"{self.from_offset} -> {self.until_offset}"
            )

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def size(self) -> int:
        """Offsets spanned; an upper bound on messages (offsets may have holes)."""
        return self.until_offset - self.from_offset

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition} {self.from_offset} -> {self.until_offset}"


@dataclass(frozen=True)
class PartitionHistory:
    """What the database remembers of a partition beside its offset (``txn_offsets``).

    ``last``: the last message counted (None before the first, or after a
    reset); ``topic_id``: Kafka's topic ID when it was stored (None: unknown).
    """

    generation: int = 0
    topic_id: str | None = None
    last: Fingerprint | None = None


@dataclass(frozen=True)
class PartitionWatermarks:
    """What Kafka holds for one partition now: offsets ``[low, high)``."""

    topic: str
    partition: int
    low: int
    high: int

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)


def plan_ranges(
    job: str,
    committed: Mapping[TopicPartition, int],
    watermarks: Iterable[PartitionWatermarks],
    history: Mapping[TopicPartition, PartitionHistory] | None = None,
    topic_ids: Mapping[str, str | None] | None = None,
) -> list[OffsetRange]:
    """Plan one range per partition with new data, ordered by topic and partition.

    Steps, per partition Kafka reports:
    1. take the committed offset (every reported partition must have one: the
       driver creates missing rows before planning);
    2. refuse offsets Kafka never had (above ``high``: the topic was recreated,
       or an unclean leader election), with the reset to run;
    3. refuse a partition whose stored topic ID differs from the one Kafka
       reports now (``topic_ids``; None where either is unknown):
       :class:`~txstore.core.errors.TopicRecreated`, before step 4: the new
       topic's offsets say nothing of the old one's, so they are never judged
       as aged out (whose advice, skipping them, would record a bogus loss);
    4. refuse offsets Kafka no longer has (below ``low``: aged out), never
       skipping silently;
    5. emit ``[committed, high)`` if it is not empty, with the partition's
       generation, and the last message counted to verify if Kafka can still
       hold it (its offset at or above ``low``; one compacted away is simply
       not found, which is not an error).

    A committed partition that Kafka no longer reports is refused too.
    """
    history = history or {}
    topic_ids = topic_ids or {}
    reported: dict[TopicPartition, PartitionWatermarks] = {w.key: w for w in watermarks}
    for key, stored in sorted(committed.items()):
        if key not in reported:
            topic, partition = key
            raise OffsetOutOfLog(
                f"job {job!r} topic {topic!r} partition {partition}: stored offset {stored} but "
                "Kafka no longer has this partition (topic deleted, or recreated with fewer partitions); "
                f"to drop its offset: {reset_command(job, topic, partition, '--forget')}"
            )
    ranges = []
    for key, marks in sorted(reported.items()):
        if key not in committed:
            raise KeyError(f"no committed or starting offset for {key[0]!r} partition {key[1]}")
        stored = committed[key]
        topic, partition = key
        if stored > marks.high:
            raise OffsetOutOfLog(
                f"job {job!r} topic {topic!r} partition {partition}: stored offset {stored} is "
                f"beyond the log-end offset {marks.high} (topic deleted and recreated, or an unclean "
                f"leader election); to start over from its earliest offset: "
                f"{reset_command(job, topic, partition, '--to-earliest')}"
            )
        past = history.get(key, PartitionHistory())
        now_id = topic_ids.get(topic)
        if past.topic_id is not None and now_id is not None and past.topic_id != now_id:
            raise recreated_error(
                job,
                topic,
                partition,
                f"topic ID {past.topic_id}",
                f"topic ID {now_id}",
                reset_command(job, topic, partition, "--to-earliest"),
            )
        if stored < marks.low:
            raise DataLoss(
                f"job {job!r} topic {topic!r} partition {partition}: stored offset {stored} is "
                f"below the log-start offset {marks.low}; {marks.low - stored} messages aged out "
                "of Kafka before they were counted. To skip them and record the loss in "
                "txn_lost_ranges, rerun with --fail-on-data-loss false"
            )
        if stored < marks.high:
            last = past.last
            verify = last if last is not None and marks.low <= last.offset < stored else None
            ranges.append(
                OffsetRange(topic, partition, stored, marks.high, verify, past.generation, marks.high)
            )
    return ranges


def reset_command(job: str, topic: str, partition: int | None, target: str) -> str:
    """The exact ``txstore reset`` command line an error message suggests (``partition`` None:
    every partition of the topic)."""
    where = [] if partition is None else ["--partition", str(partition)]
    return " ".join(
        [
            "txstore reset",
            "--job",
            shlex.quote(job),
            "--topic",
            shlex.quote(topic),
            *where,
            target,
            "--execute",
        ]
    )


def topic_missing_now(job: str, topic: str, servers: str, stored_partitions: int) -> UnknownTopic:
    """The one-line error for a topic Kafka does not have although the job stored offsets for
    ``stored_partitions`` of its partitions: it existed, so it is not a typo (not "check
    --topic"). A recreation deletes, then creates: planned in between, the job finds no topic.
    Run again once the topic exists, the job stops on the recreation with the reset to run;
    a topic deleted for good needs its offsets forgotten."""
    return UnknownTopic(
        f"job {job!r} topic {topic!r} does not exist on Kafka at {servers} now, though the job stored "
        f"offsets for {stored_partitions} of its partitions: it may be being deleted and recreated. "
        "Run the job again once the topic exists (a recreated topic then stops it in one line naming "
        "the reset to run); if it was deleted for good, forget its offsets: "
        f"{reset_command(job, topic, None, '--forget')}",
        topic,
        servers,
    )


def without_vanished(
    job: str, error: UnknownTopic, topics: tuple[str, ...], stored_partitions: int, pattern: bool
) -> tuple[str, ...]:
    """The topics to plan once Kafka reported ``error``'s topic unknown, or the line to stop with.

    Steps:
    1. the job stored offsets for ``stored_partitions`` of the topic's partitions: it existed,
       so it is no typo (:func:`topic_missing_now`);
    2. a topic no pattern matched (``pattern`` false, or not among ``topics``): ``error`` itself;
    3. else a pattern matched it a moment ago and it was deleted since, never started: it
       matches nothing now, so ``topics`` without it.
    """
    if stored_partitions:
        raise topic_missing_now(job, error.topic, error.servers, stored_partitions) from None
    if not pattern or error.topic not in topics:
        raise error
    return tuple(t for t in topics if t != error.topic)


def recreated_topics(
    history: Mapping[TopicPartition, PartitionHistory], topic_ids: Mapping[str, str | None]
) -> set[str]:
    """The topics whose stored topic ID differs from the one Kafka reports now (deleted and
    recreated): their offsets are the new topic's, never an aged-out range of the old one."""
    return {
        topic
        for (topic, _), past in history.items()
        if past.topic_id is not None and topic_ids.get(topic) not in (None, past.topic_id)
    }


def log_start_wanted(
    committed: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int]
) -> list[TopicPartition]:
    """The partitions (of ``ends``, Kafka's log ends now) whose log start a plan needs.

    A partition whose committed offset is its log end has nothing to read, and its log start
    changes nothing: no range is planned there, none of its offsets can have aged out, and no
    start is decided for it. Every other one needs it: one with no committed offset (a start at
    the earliest offset), one with new data (its range's data loss and verified message), one
    beyond its log end (refused, with the log's offsets in the error). A running job that is
    idle so asks Kafka one question per plan, not two (at 1,024 partitions, ListOffsets takes
    about 10 ms on Apache Kafka).
    """
    return [key for key, end in ends.items() if committed.get(key) != end]


IDLE_TOPIC_ID_SECONDS = 5.0
"""How often an idle topic's Kafka topic ID is asked again (:func:`topic_ids_wanted`)."""


def topic_ids_wanted(
    committed: Mapping[TopicPartition, int],
    watermarks: Iterable[PartitionWatermarks],
    history: Mapping[TopicPartition, PartitionHistory],
    checked: Mapping[str, float] | None = None,
    now: float = 0.0,
    every: float = IDLE_TOPIC_ID_SECONDS,
) -> tuple[str, ...]:
    """The topics whose Kafka topic ID a plan asks for, in order.

    A topic ID tells a recreated topic whose log is no shorter than the stored offsets. It is
    always asked where a range is planned (a committed offset other than the log end: the ID is
    compared before anything is read) and where a row has no ID stored yet (it is stored now, so
    that a recreation before the partition's first message is still told). A topic whose every
    partition is at its log end, with its IDs stored, plans nothing; it is asked again when its
    ID was last asked (``checked``, a clock's reading per topic) ``every`` seconds or more before
    ``now``, or never. So an idle plan mostly spares DescribeTopics (about 13 ms at 1,024
    partitions on Apache Kafka), and a topic recreated at exactly its stored log end, whose new
    messages would otherwise wait uncounted and untold, still stops the job within ``every``
    seconds of idle plans, or at once when a range of it is planned.
    """
    checked = checked or {}
    wanted = {w.topic for w in watermarks if committed.get(w.key) != w.high}
    wanted |= {topic for (topic, _), past in history.items() if past.topic_id is None}
    wanted |= {key[0] for key in committed if key not in history}
    idle = {w.topic for w in watermarks} - wanted
    wanted |= {t for t in idle if t not in checked or now - checked[t] >= every}
    return tuple(sorted(wanted))


def topic_ids_to_store(
    ids: Mapping[str, str], history: Mapping[TopicPartition, PartitionHistory]
) -> dict[str, str]:
    """Of Kafka's topic ``ids``, those of topics some row of which (``history``) has no ID yet:
    stored now, so that a recreation is seen later. A stored ID is never replaced (a different
    one is a recreated topic, :func:`plan_ranges`'s to tell), and a topic without a row has
    nowhere to store it."""
    missing = {topic for (topic, _), past in history.items() if not past.topic_id}
    return {t: i for t, i in ids.items() if t in missing}


def aged_out(
    committed: Mapping[TopicPartition, int], watermarks: Iterable[PartitionWatermarks]
) -> list[OffsetRange]:
    """The offsets the job still had to count that Kafka no longer holds, per partition."""
    return [
        OffsetRange(w.topic, w.partition, committed[w.key], w.low)
        for w in sorted(watermarks, key=lambda w: w.key)
        if w.key in committed and committed[w.key] < w.low
    ]


def limit_ranges(ranges: Sequence[OffsetRange], max_offsets: int | None) -> list[OffsetRange]:
    """Cap a batch at about ``max_offsets`` offsets, split in proportion to backlog.

    Spark's ``maxOffsetsPerTrigger`` semantics: each range keeps
    ``max_offsets * size / total`` offsets, rounded down, except that a share
    below one is rounded up so no partition with a backlog starves. Each range
    is cut at its end only, so the next batch continues exactly where this
    one stopped.
    """
    total = sum(r.size for r in ranges)
    if max_offsets is None or total <= max_offsets:
        return list(ranges)
    limited = []
    for r in ranges:
        share = max_offsets * r.size / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        limited.append(
            OffsetRange(
                r.topic,
                r.partition,
                r.from_offset,
                min(r.until_offset, r.from_offset + take),
                r.verify,
                r.generation,
                r.log_end,
            )
        )
    return limited


RANGE_COST_MESSAGES = 1_000
"""A range's fixed cost (assign, first fetch, commit) in messages, for balancing tasks."""


def group_ranges(ranges: Sequence[OffsetRange], groups: int) -> list[list[OffsetRange]]:
    """The ranges, in order, cut into at most ``groups`` runs of neighbours of about equal work.

    A range's work is its size plus :data:`RANGE_COST_MESSAGES`. Walking the ranges in order,
    a new run starts when the work done so far, counting half of the next range, passes the
    runs so far times an equal share; so every range is in exactly one run, the runs keep the
    planned order, and a range much larger than the share gets a run of its own. Pure, so the
    same ranges always give the same runs (a retried task re-reads exactly its run).
    """
    if groups < 1:
        raise ValueError(f"groups must be at least 1, got {groups}")
    weights = [r.size + RANGE_COST_MESSAGES for r in ranges]
    share = sum(weights) / groups
    runs: list[list[OffsetRange]] = [[]]
    done = 0
    for r, weight in zip(ranges, weights, strict=True):
        if runs[-1] and len(runs) < groups and done + weight / 2 > share * len(runs):
            runs.append([])
        runs[-1].append(r)
        done += weight
    return runs if ranges else []


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Cut ranges into at least ``min_partitions`` pieces, each range in proportion to its size.

    Like Spark's ``minPartitions`` for its Kafka source: a big partition's
    range is read by several tasks at once. Only for per-batch commits,
    which commit the whole ranges, never the pieces. Only a range's first
    piece verifies the last message counted (it starts where the range does).
    """
    if not min_partitions or len(ranges) >= min_partitions:
        return list(ranges)
    total = sum(r.size for r in ranges)
    pieces: list[OffsetRange] = []
    for r in ranges:
        parts = max(1, min(r.size, math.ceil(r.size / total * min_partitions))) if total else 1
        bounds = [r.from_offset + (r.size * i) // parts for i in range(parts + 1)]
        pieces += [
            OffsetRange(
                r.topic, r.partition, a, b, r.verify if a == r.from_offset else None, r.generation, r.log_end
            )
            for a, b in itertools.pairwise(bounds)
        ]
    return pieces
