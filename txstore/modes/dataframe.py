"""A DataFrame aggregate: the user's Spark SQL over the batch's messages, committed per batch.

1. the batch's ranges, cut into pieces like per-batch commits, become one
   DataFrame with Spark's Kafka-source columns (:func:`~txstore.spark.read_ranges`;
   each range is verified, a recreated topic fails the Spark job);
2. the user's function turns it into a DataFrame of deltas, collected to
   the driver (:func:`~txstore.spark.dataframe_deltas`);
3. the driver commits it like :mod:`txstore.modes.per_batch`. No
   fingerprint is recorded here: Spark plans the DataFrame, not txstore.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txstore.driverdb import DriverConnection
from txstore.failpoints import FailPoints
from txstore.modes.per_batch import commit_result
from txstore.ranges import OffsetRange, split_ranges
from txstore.settings import JobSettings
from txstore.spark import BatchResult, dataframe_deltas, job_description, read_ranges
from txstore.task import RangeReport


@dataclass(frozen=True)
class DataFrameMode:
    spark: Any
    settings: JobSettings
    dataframe_aggregate: Callable[[Any], Any]
    failpoints: FailPoints
    connection: DriverConnection
    number: int  # the batch's, for error lines

    def run(self, ranges: list[OffsetRange], description: str) -> tuple[list[RangeReport], float]:
        s = self.settings
        if not ranges:
            return [], 0.0
        pieces = split_ranges(ranges, s.min_partitions)
        with job_description(self.spark, description):
            frame = self.dataframe_aggregate(read_ranges(self.spark, pieces, s.kafka_conf, s.job))
            result = BatchResult(dataframe_deltas(frame), {r.key: r.size for r in ranges})
        return commit_result(s, ranges, result, self.failpoints, self.connection, self.number)
