"""How a batch runs: one module per execution mode, each behind the same small interface.

A mode gets the planned ranges and the batch's Spark job description, runs
them, and returns a :class:`~txstore.spark.ranges.range_task.RangeReport` per range plus the
milliseconds the driver spent committing (0 when tasks commit):

* :mod:`~txstore.modes.per_range`: each task reads, aggregates and commits
  its ranges (the default);
* :mod:`~txstore.modes.idempotent`: each task stores its ranges' messages
  under their offsets;
* :mod:`~txstore.modes.per_batch`: tasks aggregate, the driver sums and
  commits the whole batch in one transaction;
* :mod:`~txstore.modes.dataframe`: the user's DataFrame aggregation over
  the batch's messages, committed like per-batch;
* :mod:`~txstore.modes.results_table`: the user's DataFrame aggregation (or
  ``--sql``) merged into a table of their own by merge rules, streamed
  through ``COPY``, committed with the offsets per batch.

A new mode is a new module with a class like these, chosen in
:meth:`txstore.job.TransactionalJob.mode`.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from txstore.core.errors import BadMessage
from txstore.core.ranges import OffsetRange
from txstore.kafka.bad_messages import BadOffset
from txstore.settings import IDEMPOTENT, JobSettings
from txstore.spark.ranges.range_task import RangeReport


class Mode(Protocol):
    tasks_commit: ClassVar[bool]
    """True when each task commits its ranges, so each report carries its range's own read and
    commit times; False when the driver commits the batch (its ranges have no times of their own)."""

    def run(self, ranges: list[OffsetRange], description: str) -> tuple[list[RangeReport], float]:
        """Run the batch's ranges; return a report per range and the driver's commit milliseconds."""
        ...


def bad_message(settings: JobSettings, bad: BadOffset) -> BadMessage:
    """The error that stops the job at a message its aggregate (or transform) fails on."""
    stage = "transform" if settings.sink == IDEMPOTENT else "aggregate"
    return BadMessage(settings.job, bad.topic, bad.partition, bad.offset, bad.reason, stage)
