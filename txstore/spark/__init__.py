"""The Spark side: ranges as Spark tasks, DataFrames, and the ``txstore`` data source and sink.

Owns, in folders that each import only the ones below them (import-linter checks it):
``format("txstore")`` registered once for batch reads, stream reads and the stream sink
(:mod:`~txstore.spark.source_format`); the stream: its source, sink, options, refused rows and
advice (:mod:`txstore.spark.stream`); offset ranges as Spark tasks, for the batch jobs and the
stream alike: task groups, what a task does with each range, each range's messages handed back,
per-batch deltas, the search for a message a results table refuses (:mod:`txstore.spark.ranges`);
Kafka as Spark sees it: the Kafka-source columns, messages as Arrow batches, the batch data
source, and a query asked about without running it: its fields, the columns it uses, counts
pushed down to the reading tasks (:mod:`txstore.spark.source`); and the processes: the session's
kind, a quiet driver, start-up failures, the ``--py-files`` zip, a reused Python worker's heap
and log lines (:mod:`txstore.spark.runtime`).

Everything runs on classic Spark and Spark Connect alike (DataFrames and ``mapInArrow``,
no RDD, no ``sparkContext`` except behind ``is_connect``).

May import: ``txstore.core``, ``txstore.kafka``, ``txstore.postgres`` and PySpark; never the
driver (``txstore.job``, ``txstore.modes``, ...), ``txstore.report`` or ``txstore.ops``.
"""
