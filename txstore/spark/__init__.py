"""The Spark side: ranges as Spark tasks, what a task does, DataFrames and the data source.

Owns cutting ranges into task groups and running them (:mod:`~txstore.spark.ranges.tasks`), what a
task does with each range: read, aggregate, commit (:mod:`~txstore.spark.ranges.range_task`),
per-batch partial deltas summed on the driver (:mod:`~txstore.spark.ranges.deltas`), messages as
Arrow batches (:mod:`~txstore.spark.source.arrow`), the Kafka-source columns
(:mod:`~txstore.spark.source.source_columns`), asking Spark about a query without running it
(:mod:`~txstore.spark.source.probing`, :mod:`~txstore.spark.source.used_columns`), counts pushed down to the
reading tasks (:mod:`~txstore.spark.source.pushdown`), finding the message a results table refuses
(:mod:`~txstore.spark.ranges.bad_rows`; in a streaming query's rows, :mod:`~txstore.spark.stream.stream_bad_rows`), the ``txstore`` data source for batch and streaming reads
and the streaming sink (:mod:`~txstore.spark.source_format`, :mod:`~txstore.spark.source.datasource`,
:mod:`~txstore.spark.stream.stream_source`, :mod:`~txstore.spark.stream.stream_sink`) shipping txstore to executors
(:mod:`~txstore.spark.runtime.pyfiles`), and a reused Python worker's heap frozen once
(:mod:`~txstore.spark.runtime.worker_heap`).

Everything runs on classic Spark and Spark Connect alike (DataFrames and ``mapInArrow``,
no RDD, no ``sparkContext`` except behind ``is_connect``).

May import: ``txstore.core``, ``txstore.kafka``, ``txstore.postgres`` and PySpark; never the
driver (``txstore.job``, ``txstore.modes``, ...), ``txstore.report`` or ``txstore.ops``.
"""
