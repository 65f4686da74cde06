"""txstore: exactly-once aggregation of Kafka data with Spark.

Kafka offsets and aggregated results are committed in the same PostgreSQL
transaction, so no message is lost or counted twice whatever Spark retries.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txstore.core.errors import (
        AlreadyCommitted,
        BadMessage,
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
        PublishFailed,
        ResultsTableInvalid,
        SchemaMissing,
        TxstoreError,
        UnknownTopic,
    )
    from txstore.core.ranges import OffsetRange, PartitionWatermarks, plan_ranges
    from txstore.core.results import (
        TOPIC_TOTAL,
        Deltas,
        ResultKey,
        add_metrics,
        by_key,
        by_key_and_window,
        by_window,
        decode_key,
    )
    from txstore.core.starting import StartingOffsets, parse_starting_offsets
    from txstore.core.windows import parse_duration_ms, window_start
    from txstore.job import BatchReport, DataFrameAggregate, JobSettings, TransactionalJob
    from txstore.kafka.bad_messages import BadOffset
    from txstore.postgres.idempotent import IdempotentSink, MessageTransform
    from txstore.postgres.outbox import OutboxPublisher
    from txstore.postgres.results.results_table import MERGE_RULES, ResultsTable
    from txstore.postgres.sink import TransactionalSink, classify_conflict
    from txstore.runner import run_job_main
    from txstore.spark.ranges.range_task import Aggregate, RangeReport
    from txstore.spark.ranges.tasks import read_ranges

__version__ = "0.1.0"
"""The one place the version is written: the wheel's metadata (pyproject.toml reads it) and
``txstore --version``."""


_LAZY = {
    "AlreadyCommitted": "txstore.core.errors",
    "BadMessage": "txstore.core.errors",
    "BatchFailed": "txstore.core.errors",
    "CommitConflict": "txstore.core.errors",
    "ConfigError": "txstore.core.errors",
    "DataLoss": "txstore.core.errors",
    "DatabaseUnavailable": "txstore.core.errors",
    "KafkaReadError": "txstore.core.errors",
    "KafkaUnavailable": "txstore.core.errors",
    "OffsetGap": "txstore.core.errors",
    "OffsetOutOfLog": "txstore.core.errors",
    "OffsetOverlap": "txstore.core.errors",
    "PublishFailed": "txstore.core.errors",
    "ResultsTableInvalid": "txstore.core.errors",
    "SchemaMissing": "txstore.core.errors",
    "TxstoreError": "txstore.core.errors",
    "UnknownTopic": "txstore.core.errors",
    "OffsetRange": "txstore.core.ranges",
    "PartitionWatermarks": "txstore.core.ranges",
    "plan_ranges": "txstore.core.ranges",
    "Deltas": "txstore.core.results",
    "ResultKey": "txstore.core.results",
    "TOPIC_TOTAL": "txstore.core.results",
    "add_metrics": "txstore.core.results",
    "by_key": "txstore.core.results",
    "by_key_and_window": "txstore.core.results",
    "by_window": "txstore.core.results",
    "decode_key": "txstore.core.results",
    "StartingOffsets": "txstore.core.starting",
    "parse_starting_offsets": "txstore.core.starting",
    "parse_duration_ms": "txstore.core.windows",
    "window_start": "txstore.core.windows",
    "BatchReport": "txstore.job",
    "DataFrameAggregate": "txstore.job",
    "JobSettings": "txstore.job",
    "TransactionalJob": "txstore.job",
    "BadOffset": "txstore.kafka.bad_messages",
    "IdempotentSink": "txstore.postgres.idempotent",
    "MessageTransform": "txstore.postgres.idempotent",
    "OutboxPublisher": "txstore.postgres.outbox",
    "MERGE_RULES": "txstore.postgres.results.results_table",
    "ResultsTable": "txstore.postgres.results.results_table",
    "TransactionalSink": "txstore.postgres.sink",
    "classify_conflict": "txstore.postgres.sink",
    "run_job_main": "txstore.runner",
    "Aggregate": "txstore.spark.ranges.range_task",
    "RangeReport": "txstore.spark.ranges.range_task",
    "read_ranges": "txstore.spark.ranges.tasks",
}
"""Each public name and the module it comes from, imported on first use (PEP 562): ``import
txstore`` (and so every ``txstore`` command, ``--help`` and typos included) loads none of
PySpark, confluent_kafka, psycopg, SQLAlchemy, pyarrow or prometheus_client until a name
needs them."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'txstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


def register(spark: Any) -> None:
    """Make ``spark.read.format("txstore")`` available in ``spark`` (classic or Spark Connect).

    Needs PySpark 4.0 or newer and pyarrow (from a clone: ``pip install -e '.[connect]'``);
    see :mod:`txstore.spark.source.read_options` for the options. The session's parallelism (under Spark
    Connect measured with one tiny Spark job) becomes ``readStream.format("txstore")``'s default
    ``txstore.tasks`` (:mod:`txstore.spark.stream.stream_source`).
    """
    from txstore.spark.source_format import register as register_data_source

    register_data_source(spark)


__all__ = [
    "MERGE_RULES",
    "TOPIC_TOTAL",
    "Aggregate",
    "AlreadyCommitted",
    "BadMessage",
    "BadOffset",
    "BatchFailed",
    "BatchReport",
    "CommitConflict",
    "ConfigError",
    "DataFrameAggregate",
    "DataLoss",
    "DatabaseUnavailable",
    "Deltas",
    "IdempotentSink",
    "JobSettings",
    "KafkaReadError",
    "KafkaUnavailable",
    "MessageTransform",
    "OffsetGap",
    "OffsetOutOfLog",
    "OffsetOverlap",
    "OffsetRange",
    "OutboxPublisher",
    "PartitionWatermarks",
    "PublishFailed",
    "RangeReport",
    "ResultKey",
    "ResultsTable",
    "ResultsTableInvalid",
    "SchemaMissing",
    "StartingOffsets",
    "TransactionalJob",
    "TransactionalSink",
    "TxstoreError",
    "UnknownTopic",
    "add_metrics",
    "by_key",
    "by_key_and_window",
    "by_window",
    "classify_conflict",
    "decode_key",
    "parse_duration_ms",
    "parse_starting_offsets",
    "plan_ranges",
    "read_ranges",
    "register",
    "run_job_main",
    "window_start",
]
