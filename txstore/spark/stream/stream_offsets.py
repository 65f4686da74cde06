"""A micro-batch as Spark and the stream source hand it over: offsets, ranges and tasks.

Spark keeps this source's offsets as JSON, ``{topic: {partition: offset}}`` (:data:`Offsets`;
exclusive ends, as in ``txn_offsets``); a micro-batch is the ranges between its start and end
(:func:`batch_ranges`), read by the Spark tasks :func:`micro_batch_tasks` groups them into, each
a :class:`StreamPartition` naming its plan and its place in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from txstore.core.ranges import OffsetRange, TopicPartition, group_ranges
from txstore.spark.source.datasource import RangesPartition

Offsets = dict[str, dict[str, int]]
"""Spark's offset of this source: ``{topic: {partition (a string, as JSON has it): offset}}``."""


class StreamPartition(RangesPartition):
    """One reading task of a micro-batch: its ranges, the plan's identity and the task's index in
    it, which its receipt names (:func:`~txstore.postgres.stream_plans.record_read`)."""

    def __init__(self, ranges: Sequence[OffsetRange], plan_id: str, index: int) -> None:
        super().__init__(ranges)
        self.plan_id = plan_id
        self.index = index


def micro_batch_tasks(ranges: Sequence[OffsetRange], tasks: int | None) -> list[list[OffsetRange]]:
    """A micro-batch's ranges (in order) as the Spark tasks that read them.

    A task each while there are no more ranges than ``tasks`` (or ``tasks`` is None): the ranges
    are read side by side. More ranges share ``tasks`` runs of neighbours of about equal work
    (:func:`~txstore.core.ranges.group_ranges`), as the batch jobs share a task per core
    (:func:`txstore.spark.ranges.tasks.task_groups`): each task of a Python source feeding a Python
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
