"""Per-range commits (the default): each Spark task reads, aggregates and commits its ranges.

A task's ranges commit in one transaction, or one by one if that is
refused (:meth:`~txstore.spark.ranges.range_task.RangeTask.run_together`); the driver only
collects the reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from txstore.core.failpoints import FailPoints
from txstore.core.ranges import OffsetRange
from txstore.settings import JobSettings
from txstore.spark.ranges.range_task import Aggregate, RangeReport, RangeTask
from txstore.spark.ranges.tasks import run_ranges


@dataclass(frozen=True)
class PerRangeMode:
    tasks_commit: ClassVar[bool] = True
    spark: Any
    settings: JobSettings
    aggregate: Aggregate
    failpoints: FailPoints

    def run(self, ranges: list[OffsetRange], description: str) -> tuple[list[RangeReport], float]:
        s = self.settings
        task = RangeTask(
            s.job,
            s.database_url,
            s.kafka_conf,
            self.aggregate,
            self.failpoints,
            s.publish_topic,
            s.publish_max_bytes,
            s.on_bad_message,
        )
        return run_ranges(self.spark, ranges, task, description), 0.0
