"""Asking Spark about a DataFrame aggregate without running it: its output fields, quietly.

Jobs probe their aggregate once before the first batch (read-column inference, pushdown,
the results table's check). Spark analyses the query over an empty or never-run frame: no
Spark job, classic and Connect alike. A query that does not analyse is one line
(:class:`QueryRefused`), and PySpark's own JSON dump of the error is kept off stderr while
probing (:func:`quiet_analysis_errors`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from txstore.core.errors import first_line
from txstore.spark.source.source_columns import kafka_source_schema


class QueryRefused(ValueError):
    """Spark's analysis refused a DataFrame aggregate; the message is Spark's first line."""


QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")
"""PySpark's loggers that print each ``AnalysisException`` with a query context as a JSON line
holding the JVM's stack trace (``pyspark.errors.exceptions.base``)."""


_quiet_lock = threading.Lock()
_quiet_holders = 0  # probes inside quiet_analysis_errors, in any thread
_quiet_before: list[bool] = []  # the loggers' own state, restored when the last probe leaves


@contextmanager
def quiet_analysis_errors() -> Iterator[None]:
    """Silence :data:`QUERY_CONTEXT_LOGGERS` while probing a query that may not analyse: the
    probe expects that error and reports it in one line of its own. Jobs in threads of one
    process may probe at once: the loggers are silenced by the first to enter and restored by
    the last to leave."""
    from pyspark.logger import PySparkLogger  # not logging.getLogger: PySpark must create them

    global _quiet_holders, _quiet_before
    loggers = [PySparkLogger.getLogger(name) for name in QUERY_CONTEXT_LOGGERS]
    with _quiet_lock:
        if _quiet_holders == 0:
            _quiet_before = [logger.disabled for logger in loggers]
            for logger in loggers:
                logger.disabled = True
        _quiet_holders += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_holders -= 1
            if _quiet_holders == 0:
                for logger, disabled in zip(loggers, _quiet_before, strict=True):
                    logger.disabled = disabled


def analysed_fields(
    spark: Any, aggregate: Callable[[Any], Any], columns: Sequence[str] | None = None
) -> list[Any]:
    """The output fields (``StructField``) of ``aggregate`` over a batch with the Kafka-source
    ``columns`` (all if None), or :class:`QueryRefused`.

    Spark analyses the query over an empty DataFrame of those columns:
    nothing is read and no Spark job runs, classic and Connect alike (a
    Connect client's ``schema`` asks the server to analyse the plan).
    """
    from pyspark.errors import AnalysisException

    try:
        with quiet_analysis_errors():
            return list(aggregate(spark.createDataFrame([], kafka_source_schema(columns))).schema.fields)
    except AnalysisException as e:
        raise QueryRefused(first_line(e)) from None
