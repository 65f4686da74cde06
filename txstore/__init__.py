"""txstore: exactly-once aggregation of Kafka data with Spark.

Kafka offsets and aggregated results are committed in the same PostgreSQL
transaction, so no message is lost or counted twice whatever Spark retries.
"""

from txstore.errors import (
    AlreadyCommitted,
    BatchFailed,
    CommitConflict,
    ConfigError,
    DatabaseUnavailable,
    DataLoss,
    KafkaReadError,
    KafkaUnavailable,
    OffsetGap,
    OffsetOutOfLog,
    OffsetOverlap,
    SchemaMissing,
    TxstoreError,
)
from txstore.job import BatchReport, JobSettings, TransactionalJob
from txstore.ranges import OffsetRange, PartitionWatermarks, plan_ranges
from txstore.sink import TOPIC_TOTAL, ResultKey, TransactionalSink, classify_conflict
from txstore.spark import read_ranges
from txstore.starting import StartingOffsets, parse_starting_offsets
from txstore.task import Aggregate, RangeReport

__all__ = [
    "TOPIC_TOTAL",
    "Aggregate",
    "AlreadyCommitted",
    "BatchFailed",
    "BatchReport",
    "CommitConflict",
    "ConfigError",
    "DataLoss",
    "DatabaseUnavailable",
    "JobSettings",
    "KafkaReadError",
    "KafkaUnavailable",
    "OffsetGap",
    "OffsetOutOfLog",
    "OffsetOverlap",
    "OffsetRange",
    "PartitionWatermarks",
    "RangeReport",
    "ResultKey",
    "SchemaMissing",
    "StartingOffsets",
    "TransactionalJob",
    "TransactionalSink",
    "TxstoreError",
    "classify_conflict",
    "parse_starting_offsets",
    "plan_ranges",
    "read_ranges",
]
