"""The limit: raw confluent-kafka consumers reading the same messages, counting only.

As many reader processes as the job has Spark cores; reader ``i`` takes
partitions ``i, i + k, i + 2k, ...`` and counts messages until it has them
all, in one of two ways:

- ``together``: assign all its partitions at once (one fetch serves many
  partitions);
- ``one_by_one``: one partition after another on the same consumer, as the
  job's tasks do;

each with Python's cyclic garbage collector on (a plain loop) and paused
(``_gc_paused``: the job pauses it while reading, so the limit must too).
The limit is the fastest of the four, measured one right after the other.
The readers use the job's own reader settings (``txstore.kafka.client_settings.reader_config``),
so the comparison measures what the job adds on top of reading, not a
difference in fetch tuning. The clock starts when every reader process is up
(a barrier) and stops when the last one has counted its share; creating the
consumer is inside the clock, as it is for the job.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from txstore.kafka.client_settings import client_config, reader_config

READ_TIMEOUT_SECONDS = 600.0


def processes_context() -> Any:
    """Helper processes forked from a clean server process (not from the driver, which runs
    Spark's threads), with confluent-kafka already imported: starting one takes milliseconds."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["bench.limit", "bench.workload"])
    return context


BARRIER_TIMEOUT_SECONDS = 120.0
STRATEGIES = ("together", "one_by_one", "together_gc_paused", "one_by_one_gc_paused")


def _count(consumer: Consumer, expected: int, deadline: float) -> int:
    count = 0
    while count < expected and time.monotonic() < deadline:
        count += len(consumer.consume(min(10_000, expected - count), 1.0))
    return count


def _read_share(
    bootstrap: str,
    topic: str,
    share: Sequence[tuple[int, int]],
    strategy: str,
    barrier: Any,
    results: Any,
) -> None:
    conf = reader_config(client_config(bootstrap))
    conf["enable.partition.eof"] = False  # counting only: no end-of-partition events to skip
    expected = sum(count for _, count in share)
    try:
        if strategy.endswith("_gc_paused"):
            gc.disable()
        barrier.wait(BARRIER_TIMEOUT_SECONDS)
        started = time.monotonic()
        deadline = started + READ_TIMEOUT_SECONDS
        consumer = Consumer(conf)
        if strategy.startswith("together"):
            consumer.assign([TopicPartition(topic, p, 0) for p, _ in share])
            count = _count(consumer, expected, deadline)
        else:
            count = 0
            for p, n in share:
                consumer.assign([TopicPartition(topic, p, 0)])
                count += _count(consumer, n, deadline)
                consumer.unassign()
        finished = time.monotonic()
        consumer.close()
        results.put((started, finished, count, expected, None))
    except Exception as e:
        results.put((0.0, 0.0, 0, expected, f"{type(e).__name__}: {e}"))


def raw_read_once(
    bootstrap: str, topic: str, counts: Sequence[int], readers: int, strategy: str
) -> dict[str, Any]:
    """Read ``counts[p]`` messages from each partition with ``readers`` processes."""
    shares = [[(p, counts[p]) for p in range(i, len(counts), readers)] for i in range(readers)]
    shares = [s for s in shares if s]
    context = processes_context()
    barrier = context.Barrier(len(shares))
    results = context.Queue()
    processes = [
        context.Process(
            target=_read_share, args=(bootstrap, topic, share, strategy, barrier, results), daemon=True
        )
        for share in shares
    ]
    for p in processes:
        p.start()
    try:
        outcomes = [results.get(timeout=READ_TIMEOUT_SECONDS + BARRIER_TIMEOUT_SECONDS) for _ in processes]
    finally:
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    errors = [o[4] for o in outcomes if o[4]]
    if errors:
        raise RuntimeError(f"raw reader failed: {errors[0]}")
    wrong = [(count, expected) for _, _, count, expected, _ in outcomes if count != expected]
    if wrong:
        raise RuntimeError(f"raw reader counted {wrong[0][0]} messages, expected {wrong[0][1]}")
    started = min(o[0] for o in outcomes)
    finished = max(o[1] for o in outcomes)
    messages = sum(o[2] for o in outcomes)
    seconds = finished - started
    return {
        "strategy": strategy,
        "readers": len(shares),
        "messages": messages,
        "seconds": seconds,
        "messages_per_second": messages / seconds if seconds > 0 else 0.0,
        "reader_seconds": sorted(o[1] - o[0] for o in outcomes),
    }


def raw_read(bootstrap: str, topic: str, counts: Sequence[int], readers: int) -> dict[str, Any]:
    """The limit: the faster of the raw strategies, with both measurements."""
    runs = [raw_read_once(bootstrap, topic, counts, readers, s) for s in STRATEGIES]
    best = max(runs, key=lambda r: r["messages_per_second"])
    return {**best, "strategies": {r["strategy"]: r for r in runs}}
