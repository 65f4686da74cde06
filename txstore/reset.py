"""Planning an offset reset (``txstore reset``): pure, so the plan shown is the plan applied.

A reset moves a job's stored offsets for one topic. Moving back means the
messages in between will be counted again; moving forward skips them. The
plan says which, per partition, before anything changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from txstore.errors import ConfigError
from txstore.ranges import PartitionWatermarks
from txstore.starting import offset_for_time

TARGETS = ("earliest", "latest", "offset", "datetime", "shift", "forget")


@dataclass(frozen=True)
class ResetTarget:
    """Where to move: ``kind`` in :data:`TARGETS`; ``value`` is the offset, shift or timestamp (ms)."""

    kind: str
    value: int | None = None


@dataclass(frozen=True)
class ResetMove:
    """One partition's change: ``old`` None means no row yet, ``new`` None means delete the row."""

    topic: str
    partition: int
    old: int | None
    new: int | None

    def describe(self) -> str:
        where = f"{self.topic}/{self.partition}"
        if self.new is None:
            return f"{where}: {self.old} -> (row deleted)"
        if self.old is None:
            return f"{where}: (no row) -> {self.new} (new row)"
        if self.new < self.old:
            return f"{where}: {self.old} -> {self.new} ({self.old - self.new} messages will be counted again)"
        if self.new > self.old:
            return f"{where}: {self.old} -> {self.new} ({self.new - self.old} messages will be skipped)"
        return f"{where}: {self.old} -> {self.new} (unchanged)"


def plan_reset(
    job: str,
    topic: str,
    partitions: Sequence[int] | None,
    stored: Mapping[int, int],
    watermarks: Mapping[int, PartitionWatermarks] | None,
    target: ResetTarget,
    time_offsets: Mapping[int, int] | None = None,
) -> list[ResetMove]:
    """The moves for ``partitions`` (default: every partition Kafka has, or every stored row for ``forget``).

    ``stored`` is the job's offsets for ``topic``; ``watermarks`` Kafka's view
    (not needed to forget); ``time_offsets`` the offsets-for-times answer for
    a datetime target. Offsets outside what Kafka holds are refused, except
    that ``shift`` is clamped to the log, like kafka-consumer-groups.
    """
    if target.kind == "forget":
        chosen = sorted(partitions) if partitions else sorted(stored)
        missing = [p for p in chosen if p not in stored]
        if missing:
            raise ConfigError(f"job {job!r} has no stored offset for {topic!r} partition(s) {missing}")
        if not chosen:
            raise ConfigError(f"job {job!r} has no stored offsets for topic {topic!r}")
        return [ResetMove(topic, p, stored[p], None) for p in chosen]
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
        moves.append(ResetMove(topic, p, old, new))
    return moves
