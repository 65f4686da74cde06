"""A DataFrame aggregate: the user's Spark SQL over the batch's messages, committed per batch.

1. the batch's ranges, cut into pieces like per-batch commits, become one
   DataFrame with Spark's Kafka-source columns, or only the ``read_columns``
   the job declared (:func:`~txstore.spark.ranges.tasks.read_ranges`;
   each range is verified, a recreated topic fails the Spark job);
2. the user's function turns it into a DataFrame of deltas, collected to
   the driver (:func:`~txstore.spark.ranges.deltas.dataframe_deltas`); the tasks hand back how
   many messages each range had (:mod:`txstore.spark.ranges.range_counts`), for the batch's
   report (offsets are not messages: transaction markers, aborted messages). A query that is only
   counts grouped by Kafka-source columns (found before the first batch,
   :mod:`txstore.spark.source.pushdown`) is instead counted per group by the reading
   tasks, and those counts are collected and summed on the driver
   (:func:`~txstore.spark.source.pushdown.final_counts`): the same rows, without one
   Spark row per message or a shuffle;
3. the driver commits it like :mod:`txstore.modes.per_batch`, with each
   range's last message as the driver read it before the Spark job
   (:func:`~txstore.kafka.reader.last_messages`); every read must end on that
   message, so a topic recreated meanwhile fails the job rather than being
   stored as the one counted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from txstore.core.errors import ConfigError
from txstore.core.failpoints import FailPoints
from txstore.core.ranges import OffsetRange, split_ranges
from txstore.kafka.reader import last_messages
from txstore.modes.per_batch import commit_result
from txstore.postgres.driverdb import DriverConnection
from txstore.settings import JobSettings
from txstore.spark.ranges.deltas import BatchResult, arrow_deltas, dataframe_deltas
from txstore.spark.ranges.range_counts import RangeCounts
from txstore.spark.ranges.range_task import RangeReport
from txstore.spark.ranges.tasks import job_description, read_ranges
from txstore.spark.source.probing import QueryRefused, analysed_fields
from txstore.spark.source.pushdown import PartialCount, final_counts


@dataclass(frozen=True)
class DataFrameMode:
    tasks_commit: ClassVar[bool] = False
    spark: Any
    settings: JobSettings
    dataframe_aggregate: Callable[[Any], Any]
    failpoints: FailPoints
    connection: DriverConnection
    number: int  # the batch's, for error lines
    read_columns: Sequence[str] | None = None  # the Kafka-source columns the aggregate uses; None: all
    # counted in part by the reading tasks (txstore.spark.source.pushdown)
    pushdown: PartialCount | None = None

    def run(self, ranges: list[OffsetRange], description: str) -> tuple[list[RangeReport], float]:
        s = self.settings
        if not ranges:
            return [], 0.0
        pieces = split_ranges(ranges, s.min_partitions)
        last = last_messages(s.kafka_conf, ranges, s.job)
        counted = RangeCounts(self.spark)  # each range's messages, as the reading tasks count them
        read = functools.partial(
            read_ranges, self.spark, pieces, s.kafka_conf, s.job, last, s.min_partitions, counts=counted
        )
        with job_description(self.spark, description):
            if self.pushdown is None:
                deltas = dataframe_deltas(self.dataframe_aggregate(read(self.read_columns)))
            else:  # the tasks' counts per group, summed here: no shuffle, no second Spark stage
                partial = read(partial=self.pushdown).toArrow()
                deltas = arrow_deltas(final_counts(partial, self.pushdown))
            messages = counted.messages(ranges)
            result = BatchResult(deltas, {r.key: messages.get(r.key, r.size) for r in ranges}, last)
        return commit_result(s, ranges, result, self.failpoints, self.connection, self.number)


def check_read_columns(spark: Any, aggregate: Callable[[Any], Any], read_columns: Sequence[str]) -> None:
    """Refuse, in one line, an aggregate that needs a Kafka-source column ``read_columns`` leaves
    out (:func:`~txstore.spark.source.probing.analysed_fields`: nothing is read)."""
    try:
        analysed_fields(spark, aggregate, read_columns)
    except QueryRefused as e:
        raise ConfigError(
            f"the dataframe_aggregate cannot run over read_columns {', '.join(read_columns)}: "
            f"{str(e).rstrip(';')}; add the columns it uses to read_columns"
        ) from None
