"""Kafka as Spark sees it: the Kafka-source columns, messages as Arrow batches, the batch data source.

Owns the columns of Spark's Kafka source (:mod:`~txstore.spark.source.source_columns`),
consumed messages as Arrow record batches of them (:mod:`~txstore.spark.source.arrow`),
``spark.read.format("txstore")``: its options (:mod:`~txstore.spark.source.read_options`), what a
read plans (:mod:`~txstore.spark.source.read_planning`) and its reader
(:mod:`~txstore.spark.source.datasource`), and what a DataFrame query needs of the source, asked
of Spark without running it: its output fields (:mod:`~txstore.spark.source.probing`), the
columns it uses (:mod:`~txstore.spark.source.used_columns`) and the counts the reading tasks can
compute for it (:mod:`~txstore.spark.source.pushdown`).

Below the tasks (``txstore.spark.ranges``) and the stream (``txstore.spark.stream``), which read
through it. May import ``txstore.spark.runtime``, ``txstore.core``, ``txstore.kafka``,
``txstore.postgres``, PySpark and pyarrow; never the tasks, the stream or the driver.
"""
