"""Offset ranges as Spark tasks: task groups, what a task does with each range, what comes back.

Owns cutting ranges into task groups and running them as DataFrames
(:mod:`~txstore.spark.ranges.tasks`), what a task does with each range: read, aggregate or
store, commit (:mod:`~txstore.spark.ranges.range_task`), each range's messages handed back to
the driver (:mod:`~txstore.spark.ranges.range_counts`), per-batch partial deltas summed on the
driver (:mod:`~txstore.spark.ranges.deltas`) and the bisection that finds the message a query
or a results table refuses (:mod:`~txstore.spark.ranges.bad_rows`).

Shared by the batch jobs (``txstore.modes``) and the stream (``txstore.spark.stream``), below
the stream. May import ``txstore.spark.source``, ``txstore.spark.runtime``, ``txstore.core``,
``txstore.kafka``, ``txstore.postgres``, PySpark and pyarrow; never the stream or the driver.
"""
