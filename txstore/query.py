"""What a job runs, checked before its first batch reads anything.

A job is given one of: a Python ``aggregate`` over a range's messages, a
``dataframe_aggregate`` (a DataFrame transformation of the batch's messages),
or, with the idempotent sink, an optional ``transform``. Steps:

1. :func:`check_arguments` refuses combinations that cannot work (both
   aggregates, a transform without the idempotent sink, a results table
   without a DataFrame aggregate or with ``--publish-topic``, ``--on-bad-message
   skip`` for a DataFrame aggregate into ``txn_data``), each in one line
   (:class:`~txstore.core.errors.ConfigError`), when the job is built;
2. :func:`prepare_query`, once, before the first batch plans (no Spark job
   runs: each step only asks Spark for a plan):

   a. without declared ``read_columns``: the columns Spark's optimized plan of
      the query uses (:mod:`txstore.spark.source.used_columns`; all of them when the
      plan cannot tell), so only those are built from Kafka's messages;
   b. with a results table: the table is checked against the query's rows
      (:func:`~txstore.modes.results_table.check_results_table`: columns that
      would round, time zones, collations, privileges; every problem one line);
      with declared ``read_columns`` and no table, the query must not need a
      column they leave out;
   c. with ``push_down_counts``: counts grouped by Kafka-source columns are
      counted in the reading tasks (:mod:`txstore.spark.source.pushdown`), kept only
      when the pushed query's columns equal the query's.

   Each choice is logged in one line, so an operator sees what is read and
   where it is counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from txstore.core.errors import ConfigError
from txstore.kafka.bad_messages import SKIP
from txstore.modes.dataframe import check_read_columns
from txstore.modes.results_table import check_results_table
from txstore.postgres.idempotent import MessageTransform
from txstore.postgres.results.results_table import ResultsTable
from txstore.settings import IDEMPOTENT, DataFrameAggregate, JobSettings
from txstore.spark.ranges.range_task import Aggregate
from txstore.spark.source.pushdown import PartialCount, infer_pushdown
from txstore.spark.source.source_columns import ColumnsInvalid, check_columns
from txstore.spark.source.used_columns import infer_read_columns

log = logging.getLogger("txstore")


def check_arguments(
    settings: JobSettings,
    aggregate: Aggregate | None,
    dataframe_aggregate: DataFrameAggregate | None,
    transform: MessageTransform | None,
    results_table: ResultsTable | None,
    read_columns: Sequence[str] | None,
) -> tuple[str, ...] | None:
    """Step 1: refuse what a job cannot run (one line each); the declared ``read_columns``,
    checked to be Kafka-source columns, or None."""
    if settings.sink == IDEMPOTENT:
        if aggregate is not None or dataframe_aggregate is not None:
            raise ConfigError("an idempotent sink stores messages; give a transform, not an aggregate")
    elif (aggregate is None) == (dataframe_aggregate is None):
        raise ConfigError("give exactly one of aggregate and dataframe_aggregate")
    elif transform is not None:
        raise ConfigError("transform is for the idempotent sink (settings.sink='idempotent')")
    if results_table is not None:
        if dataframe_aggregate is None:
            raise ConfigError("a results table takes a dataframe_aggregate: a DataFrame of its rows")
        if settings.publish_topic:
            raise ConfigError(
                "--publish-topic publishes txn_data results; it cannot be combined with a results table"
            )
    checked = None
    if read_columns is not None:
        if dataframe_aggregate is None:
            raise ConfigError("read_columns names what a dataframe_aggregate reads; this job has none")
        try:
            checked = tuple(check_columns(read_columns, "read_columns"))
        except ColumnsInvalid as e:
            raise ConfigError(str(e)) from None
    if dataframe_aggregate is not None and results_table is None and settings.on_bad_message == SKIP:
        raise ConfigError(
            "--on-bad-message skip needs a Python aggregate or a results table: a DataFrame aggregate "
            "into txn_data fails inside Spark SQL, where txstore cannot tell which message it failed on"
        )
    return checked


@dataclass(frozen=True)
class PreparedQuery:
    """What step 2 found: the Kafka-source columns to build (None: all), the counts pushed
    down to the reading tasks (None: Spark runs the whole query), and the results table's
    column types (None: no results table)."""

    read_columns: tuple[str, ...] | None
    pushdown: PartialCount | None
    results_types: dict[str, str] | None


def prepare_query(
    spark: Any,
    conn: psycopg.Connection,
    settings: JobSettings,
    dataframe_aggregate: DataFrameAggregate,
    results_table: ResultsTable | None,
    read_columns: Sequence[str] | None,
    push_down_counts: bool,
) -> PreparedQuery:
    """Step 2 for a ``dataframe_aggregate``: read columns, the results table's check, pushdown."""
    declared = read_columns is not None
    columns = (
        tuple(read_columns)
        if read_columns is not None
        else _inferred_read_columns(spark, settings.job, dataframe_aggregate)
    )  # proven: over them, the aggregate makes the same plan
    results_types = None
    if results_table is not None:
        results_types = check_results_table(
            spark, conn, results_table, dataframe_aggregate, columns, job=settings.job
        )
    elif declared:
        assert columns is not None
        check_read_columns(spark, dataframe_aggregate, columns)
    pushdown = _pushdown(spark, settings.job, dataframe_aggregate, columns) if push_down_counts else None
    return PreparedQuery(columns, pushdown, results_types)


def _pushdown(
    spark: Any, job: str, dataframe_aggregate: DataFrameAggregate, read_columns: Sequence[str] | None
) -> PartialCount | None:
    """Step 2c: count in the reading tasks when the query is only grouped counts, and say so in
    one line either way."""
    found = infer_pushdown(spark, dataframe_aggregate, read_columns)
    if found.partial is None:
        log.info("job %s: Spark runs the whole query: %s", job, found.reason)
    else:
        log.info(
            "job %s: %s (reading %s; push_down_counts=False or --no-push-down-counts to turn off)",
            job,
            found.reason,
            ", ".join(found.partial.read_columns()),
        )
    return found.partial


def _inferred_read_columns(
    spark: Any, job: str, dataframe_aggregate: DataFrameAggregate
) -> tuple[str, ...] | None:
    """Step 2a: the columns Spark's optimized plan of the query uses, or None (all of them)."""
    inferred = infer_read_columns(spark, dataframe_aggregate)
    if inferred.columns is None:
        log.info("job %s: reading every Kafka-source column: %s", job, inferred.reason)
        return None
    log.info(
        "job %s: reading only %s, %s (declare read_columns to choose)",
        job,
        ", ".join(inferred.columns),
        inferred.reason,
    )
    return tuple(inferred.columns)
