"""The idempotent sink: each Spark task stores its ranges' messages under their offsets.

Insert-or-ignore by ``(job, topic, partition, generation, offset)`` in
``txn_messages``, in the same transaction as the range's offset move
(:class:`~txstore.spark.ranges.range_task.MessageTask`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from txstore.core.failpoints import FailPoints
from txstore.core.ranges import OffsetRange
from txstore.postgres.idempotent import MessageTransform
from txstore.settings import JobSettings
from txstore.spark.ranges.range_task import MessageTask, RangeReport
from txstore.spark.ranges.tasks import run_ranges


@dataclass(frozen=True)
class IdempotentMode:
    tasks_commit: ClassVar[bool] = True
    spark: Any
    settings: JobSettings
    transform: MessageTransform | None
    failpoints: FailPoints

    def run(self, ranges: list[OffsetRange], description: str) -> tuple[list[RangeReport], float]:
        s = self.settings
        task = MessageTask(
            s.job, s.database_url, s.kafka_conf, self.transform, self.failpoints, s.on_bad_message
        )
        return run_ranges(self.spark, ranges, task, description), 0.0
