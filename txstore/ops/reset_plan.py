"""Planning an offset reset (``txstore reset``): pure, so the plan shown is the plan applied.

A reset moves a job's stored offsets for one topic. Moving back means the
messages in between will be counted again; moving forward skips them. The
plan says which, per partition, before anything changes.

A reset across a deleted and recreated topic starts a new *generation* of
the partition: the stored offset lies beyond the new log end, Kafka's topic
ID differs from the stored one, or the last message counted is another
message now (or ``--new-generation`` says so). Applying it increments
``txn_offsets.generation`` and forgets the old log's last message, so the
new log is counted from the target offset and, with ``--sink idempotent``,
its messages are stored apart from the old log's under the same offsets.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from txstore.core.errors import ConfigError
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import PartitionHistory, PartitionWatermarks
from txstore.core.starting import format_timestamp, offset_for_time

TARGETS = ("earliest", "latest", "offset", "datetime", "shift", "forget")


@dataclass(frozen=True)
class ResetTarget:
    """Where to move: ``kind`` in :data:`TARGETS`; ``value`` is the offset, shift or timestamp (ms)."""

    kind: str
    value: int | None = None


@dataclass(frozen=True)
class ResetMove:
    """One partition's change: ``old`` None means no row yet, ``new`` None means delete the row.

    ``generation``: the row's generation now; ``new_generation``: the one the
    reset starts (None: it stays), because of ``reason``; ``topic_id``: Kafka's
    topic ID to store with a new generation (None: unknown).

    For ``--forget`` (``new`` None): ``kafka_has`` whether Kafka still has the partition (None:
    not known, ``kafka_problem`` says why), with its log (``log_start``, ``log_end``); and
    ``others_kept``: the job keeps rows of other partitions of the topic, so it starts this one
    again at its earliest offset (else its ``--starting-offsets`` decide).
    """

    topic: str
    partition: int
    old: int | None
    new: int | None
    generation: int = 0
    new_generation: int | None = None
    reason: str | None = None
    topic_id: str | None = None
    at_ms: int | None = None  # --to-datetime: the instant looked up (epoch ms), shown in the plan
    # --to-datetime: Kafka found no message at or after it, nor after 1970, in a partition with
    # messages: it cannot answer time lookups there (see blind_skip_problem).
    unanswered: bool = False
    # an unanswered one: what a new row skips; a forgotten one Kafka still has: where its log starts
    log_start: int | None = field(default=None, compare=False)
    kafka_has: bool | None = None
    kafka_problem: str | None = field(default=None, compare=False)
    log_end: int | None = field(default=None, compare=False)
    others_kept: bool = False

    @property
    def counted_again(self) -> int:
        """A forgotten partition Kafka still has: the messages the job counts again when it starts it
        again at the log start (those before the stored offset still in the log)."""
        if not self.kafka_has or self.old is None or self.log_start is None or self.log_end is None:
            return 0
        return max(0, min(self.old, self.log_end) - self.log_start)

    def describe(self) -> str:
        where = f"{self.topic}/{self.partition}"
        at = f"--to-datetime {format_timestamp(self.at_ms)}; " if self.at_ms is not None else ""
        if self.new_generation is not None:
            return (
                f"{where}: {self.old} -> {self.new}, new generation {self.new_generation} ({at}{self.reason}); "
                "the new log is counted from there, results so far are kept"
            )
        if self.new is None:
            return f"{where}: {self.old} -> (row deleted; {self._forgotten()})"
        if self.old is None:
            return f"{where}: (no row) -> {self.new} ({at}new row)"
        if self.new < self.old:
            return f"{where}: {self.old} -> {self.new} ({at}{self.old - self.new} messages will be counted again)"
        if self.new > self.old:
            return f"{where}: {self.old} -> {self.new} ({at}{self.new - self.old} messages will be skipped)"
        return f"{where}: {self.old} -> {self.new} ({at}unchanged)"

    def _forgotten(self) -> str:
        if self.kafka_has is None:
            return "whether Kafka still has it is not known"
        if not self.kafka_has:
            return "Kafka no longer has it"
        held = f"Kafka still has it, offsets {self.log_start} to {self.log_end}: the job starts it again"
        if self.others_kept:
            return f"{held} at its earliest offset {self.log_start}, {_again(self.counted_again)}"
        return (
            f"{held} where its --starting-offsets say, at earliest offset {self.log_start} (the default): "
            f"{_again(self.counted_again)}"
        )


def _again(messages: int) -> str:
    return f"{messages} messages counted again" if messages else "nothing counted again"


def plan_reset(
    job: str,
    topic: str,
    partitions: Sequence[int] | None,
    stored: Mapping[int, int],
    watermarks: Mapping[int, PartitionWatermarks] | None,
    target: ResetTarget,
    time_offsets: Mapping[int, int] | None = None,
    history: Mapping[int, PartitionHistory] | None = None,
    topic_id: str | None = None,
    found: Mapping[int, Fingerprint | None] | None = None,
    new_generation: bool = False,
    unanswered: Collection[int] = (),
    kafka_problem: str | None = None,
) -> list[ResetMove]:
    """The moves for ``partitions`` (default: every partition Kafka has, or every stored row for ``forget``).

    ``stored`` is the job's offsets for ``topic``; ``watermarks`` Kafka's view
    (for ``forget``: None when not known); ``time_offsets`` the offsets-for-times answer for
    a datetime target. Offsets outside what Kafka holds are refused, except
    that ``shift`` is clamped to the log, like kafka-consumer-groups.

    ``history`` is what is stored beside each offset, ``topic_id`` Kafka's
    topic ID now (None: unknown), ``found`` the fingerprint of the message
    now at each partition's last-counted offset (None or no entry: no message
    there, or not looked at; either way nothing to compare). From them
    :func:`generation_reason` decides whether the move starts a new
    generation; ``new_generation`` forces it. ``unanswered``: the partitions where Kafka
    cannot answer the datetime target's lookup (:func:`blind_skip_problem`). ``kafka_problem``:
    why ``watermarks`` is None (for ``forget``, which plans without them).
    """
    if target.kind == "forget":
        return plan_forget(job, topic, partitions, stored, watermarks, kafka_problem)
    if watermarks is None:
        raise ConfigError(
            "this reset needs Kafka's offsets; pass --bootstrap-servers or set KAFKA_BOOTSTRAP_SERVERS"
        )
    chosen = sorted(partitions) if partitions else sorted(watermarks)
    unknown = [p for p in chosen if p not in watermarks]
    if unknown:
        raise ConfigError(
            f"Kafka has no partition(s) {unknown} in topic {topic!r} (it has {sorted(watermarks)}); "
            "to drop a vanished partition's offset use --forget"
        )
    moves = []
    for p in chosen:
        marks = watermarks[p]
        old = stored.get(p)
        if target.kind == "earliest":
            new = marks.low
        elif target.kind == "latest":
            new = marks.high
        elif target.kind == "offset":
            assert target.value is not None
            if not marks.low <= target.value <= marks.high:
                raise ConfigError(
                    f"--to-offset {target.value} is outside what Kafka holds for {topic!r} partition {p} "
                    f"({marks.low} to {marks.high})"
                )
            new = target.value
        elif target.kind == "shift":
            assert target.value is not None
            new = min(max((old if old is not None else marks.low) + target.value, marks.low), marks.high)
        elif target.kind == "datetime":
            new = offset_for_time((time_offsets or {}).get(p, -1), marks)
        else:
            raise ConfigError(f"unknown reset target {target.kind!r}; use one of {', '.join(TARGETS)}")
        past = (history or {}).get(p, PartitionHistory())
        reason = None
        if old is not None:
            reason = generation_reason(old, marks, past, topic_id, (found or {}).get(p), new_generation)
        at = target.value if target.kind == "datetime" else None
        blind = p in unanswered
        low = marks.low if blind else None
        if reason is None:
            moves.append(
                ResetMove(
                    topic, p, old, new, past.generation, at_ms=at, unanswered=blind, log_start=marks.low
                )
            )
        else:
            moves.append(
                ResetMove(
                    topic,
                    p,
                    old,
                    new,
                    past.generation,
                    past.generation + 1,
                    reason,
                    topic_id,
                    at,
                    blind,
                    low,
                )
            )
    return moves


def plan_forget(
    job: str,
    topic: str,
    partitions: Sequence[int] | None,
    stored: Mapping[int, int],
    watermarks: Mapping[int, PartitionWatermarks] | None,
    kafka_problem: str | None = None,
) -> list[ResetMove]:
    """``--forget``: delete the rows of ``partitions`` (default: every stored row of ``topic``), each
    with whether Kafka still has it (``watermarks`` None: not known, because of ``kafka_problem``;
    a topic Kafka does not have: an empty mapping). :func:`live_forget_problem` says whether the
    plan needs ``--force``."""
    chosen = sorted(partitions) if partitions else sorted(stored)
    missing = [p for p in chosen if p not in stored]
    if missing:
        raise ConfigError(f"job {job!r} has no stored offset for {topic!r} partition(s) {missing}")
    if not chosen:
        raise ConfigError(f"job {job!r} has no stored offsets for topic {topic!r}")
    others_kept = bool(set(stored) - set(chosen))
    moves = []
    for p in chosen:
        if watermarks is None:
            moves.append(ResetMove(topic, p, stored[p], None, kafka_problem=kafka_problem))
        elif p not in watermarks:
            moves.append(ResetMove(topic, p, stored[p], None, kafka_has=False))
        else:
            marks = watermarks[p]
            moves.append(
                ResetMove(
                    topic,
                    p,
                    stored[p],
                    None,
                    log_start=marks.low,
                    kafka_has=True,
                    log_end=marks.high,
                    others_kept=others_kept,
                )
            )
    return moves


def live_forget_problem(topic: str, moves: Sequence[ResetMove]) -> str | None:
    """Why a ``--forget`` plan needs ``--force``, or None: it deletes the rows of partitions Kafka
    still has (the job would read them again from where it starts them, counting again what they
    counted), or of partitions it cannot tell about (Kafka not given, or not answering)."""
    forgotten = [m for m in moves if m.new is None]
    unknown = [m for m in forgotten if m.kafka_has is None]
    if unknown:
        why = unknown[0].kafka_problem or "Kafka did not answer"
        return (
            f"cannot tell whether Kafka still has topic {topic!r} partitions {[m.partition for m in unknown]}: "
            f"{why}"
        )
    live = [m for m in forgotten if m.kafka_has]
    if not live:
        return None
    return (
        f"Kafka still has topic {topic!r} partitions {[m.partition for m in live]}: forgetting them makes "
        f"the job read them again ({_again(sum(m.counted_again for m in live))})"
    )


def blind_skip_problem(servers: str, moves: Sequence[ResetMove]) -> str | None:
    """Why a ``--to-datetime`` plan skips messages on Kafka's word that cannot be trusted, or None.

    Kafka answers "no message at or after the time" (-1) both when every message is older and
    when it cannot look times up (messages without timestamps, a broker or mock that does not
    implement the lookup). A partition with messages that answers -1 even for 1970 is the
    second: moving it to the log end would skip its messages for a wrong reason.
    """
    skips = {
        m.partition: m.new - (m.old if m.old is not None else (m.log_start or 0))
        for m in moves
        if m.unanswered and m.new is not None
    }
    skipping = sorted(p for p, n in skips.items() if n > 0)
    if not skipping:
        return None
    first = next(m for m in moves if m.partition == skipping[0])
    at = format_timestamp(first.at_ms) if first.at_ms is not None else "the time given"
    return (
        f"Kafka at {servers} found no message at or after {at} on topic {first.topic!r} partitions "
        f"{skipping}, not even after 1970: it cannot answer time lookups there, and moving them to "
        f"the log end would skip {sum(skips[p] for p in skipping)} messages"
    )


def generation_reason(
    stored: int,
    marks: PartitionWatermarks,
    past: PartitionHistory,
    topic_id: str | None,
    found: Fingerprint | None,
    forced: bool = False,
) -> str | None:
    """Why Kafka's partition is another log than the one counted (None: it is the same one, as far
    as can be told)."""
    if past.topic_id is not None and topic_id is not None and past.topic_id != topic_id:
        return f"topic ID {past.topic_id} is now {topic_id}"
    if stored > marks.high:
        return f"stored offset {stored} is beyond the log end {marks.high}"
    if past.last is not None and found is not None and found != past.last:
        return f"the message at offset {past.last.offset} is not the one last counted"
    if forced:
        return "--new-generation"
    return None
