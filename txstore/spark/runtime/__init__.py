"""The processes Spark runs txstore in: the driver's session and the Python workers.

Owns which kind of session a job was given, classic or Spark Connect
(:mod:`~txstore.spark.runtime.sessions`), a quiet driver JVM (:mod:`~txstore.spark.runtime.quiet`,
with its ``log4j2-quiet.properties``), what a job says when Spark does not start
(:mod:`~txstore.spark.runtime.startup`), the zip that ships txstore to executors
(:mod:`~txstore.spark.runtime.pyfiles`), and in a reused Python worker its heap frozen once
(:mod:`~txstore.spark.runtime.worker_heap`) and its INFO lines sent to stderr
(:mod:`~txstore.spark.runtime.worker_log`).

The bottom of ``txstore.spark``: imports no other part of it. May import the standard library
and PySpark; nothing else of txstore.
"""
