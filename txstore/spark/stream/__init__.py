"""The stream: ``spark.readStream.format("txstore")`` and ``writeStream.format("txstore")``.

Owns the stream source, which plans each micro-batch with the core's rules and hands its
ranges to the sink through PostgreSQL (:mod:`~txstore.spark.stream.stream_source`), its options
(:mod:`~txstore.spark.stream.stream_options`), its partitions, their log offsets and the job's rows
(:mod:`~txstore.spark.stream.stream_partitions`), the exactly-once sink, which commits a
micro-batch's results and offsets in one transaction (:mod:`~txstore.spark.stream.stream_sink`),
with its options (:mod:`~txstore.spark.stream.stream_sink_options`) and writing tasks
(:mod:`~txstore.spark.stream.stream_write_tasks`),
the sink's rows PostgreSQL refuses, named by their message
(:mod:`~txstore.spark.stream.stream_bad_rows`), and the shared code's advice restated for a
stream (:mod:`~txstore.spark.stream.stream_advice`).

Built on the batch data source (``txstore.spark.source``) and the range tasks
(``txstore.spark.ranges``), below only the registration (:mod:`txstore.spark.source_format`).
May import those, ``txstore.spark.runtime``, ``txstore.core``, ``txstore.kafka``,
``txstore.postgres`` and PySpark; never the driver.
"""
