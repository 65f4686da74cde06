"""A Python worker's heap frozen once, so PySpark's gc.collect() after each task stays cheap.

PySpark's daemon runs ``gc.collect()`` in a reused worker after every task
(``pyspark/daemon.py``), and the next task handed to that worker waits for it: a full
collection of the ~100,000 objects pyspark, pyarrow, psycopg, confluent-kafka and txstore
leave after their imports took 0.1-0.6 s a task on the 2-core machine. The stream source and
sink, and the batch jobs' tasks, freeze what is alive at their first task in a process
(``gc.freeze``), once. Run in a
child Python, so this test process's own collector is left alone.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import REPO
from txstore.core.ranges import OffsetRange
from txstore.spark.ranges.tasks import run_ranges

CHILD = """
import gc, time
import pyarrow, psycopg, confluent_kafka
import txstore.spark.stream.stream_sink, txstore.spark.stream.stream_source
from txstore.spark.runtime.worker_heap import freeze_once

assert gc.get_freeze_count() == 0
before = len(gc.get_objects())
started = time.perf_counter(); gc.collect(); full = time.perf_counter() - started
freeze_once()
frozen = gc.get_freeze_count()
assert frozen >= before * 0.9, (frozen, before)  # what the imports left, now out of the collector's way
garbage = [[i] for i in range(1000)]  # a later task's objects: still collected as usual
freeze_once()  # a later task: nothing more is frozen
assert gc.get_freeze_count() == frozen, (gc.get_freeze_count(), frozen)
cycle = []
cycle.append(cycle)
del cycle
started = time.perf_counter(); collected = gc.collect(); after = time.perf_counter() - started
assert collected >= 1  # the cycle made after the freeze is still collected
assert len(gc.get_objects()) < before / 10, len(gc.get_objects())
print(f"objects {before}, frozen {frozen}, full collection {full * 1000:.1f} ms, after freezing {after * 1000:.2f} ms")
"""


@pytest.mark.slow
def test_the_first_task_in_a_worker_freezes_the_imports_once_and_later_garbage_is_still_collected() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("objects ")


def _freeze_counts(ranges: Iterator[OffsetRange]) -> Iterator[int]:
    import gc

    for _ in ranges:
        yield gc.get_freeze_count()


@pytest.mark.spark
def test_a_batch_task_runs_in_a_worker_whose_heap_is_frozen(spark: Any) -> None:
    """The batch jobs' tasks (per-range, per-batch, DataFrame reads) freeze their worker's heap too:
    a per-range batch of 400,000 messages in 4 partitions took 0.25-0.27 s with it against
    0.33-0.38 s without (two A/B pairs, 5 batches each, load 3-5)."""
    ranges = [OffsetRange("t", p, 0, 0) for p in range(4)]
    counts = run_ranges(spark, ranges, _freeze_counts, "freeze counts")
    assert len(counts) == 4 and min(counts) > 10_000, counts
