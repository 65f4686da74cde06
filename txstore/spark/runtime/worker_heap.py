"""A reused Python worker's heap frozen once, so PySpark's collection after each task is cheap.

PySpark's daemon forks the Python workers and, with ``spark.python.worker.reuse`` (the
default), runs ``gc.collect()`` in a worker after every task before the worker takes the next
one (``pyspark/daemon.py``); the JVM hands the worker back to its pool as soon as the task's
stream ends, so the next task sent to it waits for that collection. A full collection scans
every object the collector tracks: after pyspark, pyarrow, psycopg, confluent-kafka and txstore
are imported, about 100,000, which took 0.1-0.6 s a task on the 2-core machine (a
timed run of the stream: 157 ms median between a worker's task ending and its next one
starting, 0 ms with the heap frozen; the counted micro-batch 20% faster).

:func:`freeze_once` moves what is alive into the collector's permanent generation
(``gc.freeze``), once per process, at the start of the first stream task the process runs, or
when the process first creates the stream sink's writer: then each later collection scans
only what the later tasks left. Objects freed by reference counting still are; what the freeze
cannot reclaim is reference cycles that were already garbage at that moment, once (bounded).
The stream source and sink call it (their tasks take two workers each, and Spark makes
the sink's writer in a planner worker, also a daemon's, also collected after each call, twice
a micro-batch, for its writer factory and for its commit, so the collections ran on the
cores the tasks and the commit needed: alternating runs of the counted stream, load 2-3, a
micro-batch 465 ms median with those planner workers' heaps unfrozen, 385 ms frozen, faster
in 7 of 8 pairs), and so do the batch jobs' tasks (:mod:`txstore.spark.ranges.tasks`: a per-range
batch of 400,000 messages in 4 partitions 0.25-0.27 s against 0.33-0.38 s, of 2,000,000 in 32
partitions 0.59 s against 0.68 s; A/B runs of 3-5 batches, load 3-5).
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_once() -> None:
    """``gc.freeze()`` the first time this process calls it; nothing after (see the module)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
