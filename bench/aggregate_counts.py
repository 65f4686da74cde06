"""Per-key and per-window counting: the per-message path before, now, and on Arrow arrays.

``python -m bench.aggregate_counts [--messages 1000000] [--partitions 10] [--keys 1000] [--rounds 5]``

Produces the messages to the test broker (keys ``user-NNNNN`` of ``--keys``
distinct users, timestamps spread over an hour), reads every range once into
memory with :class:`~txstore.kafka.reader.RangeReader` (the batches a task's
aggregate gets), then, for each grouping (key, 1-minute window, key and
window), times three aggregates over those batches, in turn in each round so
all see the same machine load:

- ``before``: :class:`PerMessageCounts`, ``CountMessages`` as it was (a
  generator and a tuple per message, every distinct ``(key, window)`` pair
  decoded on its own);
- ``now``: :class:`txstore.count_topic.CountMessages`;
- ``Arrow``: :class:`ArrowCounts`, each batch as Arrow arrays grouped by
  ``pyarrow`` (``group_by().aggregate(count_all)``), the groups of a range
  summed by Arrow, decoded like ``now``. Measured, not kept: it is slower.

All three must give identical deltas. Rates are messages per second of
process CPU time (median over the rounds): the machine is shared, and CPU
time is what another process's load disturbs least. Then the same with the
read included (a range read from the broker and counted, as a task does),
in CPU and wall-clock time. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message, Producer

from bench.broker import BrokerProcess
from txstore.core.ranges import OffsetRange
from txstore.core.results import (
    GRAIN_KEY,
    GRAIN_KEY_WINDOW,
    GRAIN_WINDOW,
    TOPIC_TOTAL,
    Number,
    ResultKey,
    add_metrics,
    decode_key,
)
from txstore.core.windows import window_start, window_start_ms
from txstore.count_topic import CountMessages
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader, close_idle_consumers, gc_paused

HOUR_MS = 3_600_000
BASE_MS = 1_700_000_000_000


def _bucket(timestamp: tuple[int, int], window_ms: int) -> int | None:
    ts_type, ts = timestamp
    return window_start_ms(ts, window_ms) if ts_type else None  # type 0: no timestamp


@dataclass(frozen=True)
class PerMessageCounts:
    """``CountMessages`` before this measurement (commit 29629c6), verbatim: the "before"."""

    by_key: bool = False
    window_ms: int | None = None

    def __call__(self, offset_range: OffsetRange, batches: Iterable[list[Message]]) -> dict[ResultKey, int]:
        total = 0
        counts: Counter[Hashable] = Counter()
        w = self.window_ms
        for batch in batches:
            total += len(batch)
            if w is None:
                counts.update(m.key() for m in batch)
            elif self.by_key:
                counts.update((m.key(), _bucket(m.timestamp(), w)) for m in batch)
            else:
                counts.update(_bucket(m.timestamp(), w) for m in batch)
        deltas: dict[ResultKey, int] = {TOPIC_TOTAL: total}
        for raw, n in counts.items():
            address = self._address(raw)
            deltas[address] = deltas.get(address, 0) + n
        return deltas

    def _address(self, raw: Hashable) -> ResultKey:
        w = self.window_ms
        if w is None:
            return ResultKey(GRAIN_KEY, decode_key(raw))  # type: ignore[arg-type]
        if self.by_key:
            key, start = cast("tuple[bytes | None, int | None]", raw)
            return ResultKey(
                GRAIN_KEY_WINDOW, decode_key(key), None if start is None else window_start(start, w)
            )
        return ResultKey(GRAIN_WINDOW, None, None if raw is None else window_start(raw, w))  # type: ignore[arg-type]


SAFE_MS = 2**62
"""Timestamps and window sizes (milliseconds) within ±this cannot overflow ``ts - ts mod w`` in int64."""

COMPACT_ROWS = 200_000
"""Per-batch group rows kept before they are grouped again into one table."""

_key = Message.key
_timestamp = Message.timestamp
_STAMP_TYPE = pa.struct([pa.field("type", pa.int32(), False), pa.field("ms", pa.int64(), False)])
_NO_TIMESTAMP = 0  # librdkafka's TIMESTAMP_NOT_AVAILABLE
_COUNT = "n"


def _window_starts(messages: Sequence[Message], window_ms: int) -> pa.Array | None:
    """Each message's window start (epoch ms), null without a timestamp; None if not exact in int64."""
    if not 0 < window_ms <= SAFE_MS:
        return None
    kinds, millis = pa.array(list(map(_timestamp, messages)), _STAMP_TYPE).flatten()
    missing = pc.equal(kinds, _NO_TIMESTAMP)
    low, high = pc.min_max(pc.if_else(missing, 0, millis)).values()
    if low.as_py() < -SAFE_MS or high.as_py() > SAFE_MS:
        return None
    # Arrow's modulo is floored like Python's %: epoch-aligned windows before 1970 too.
    starts = pc.subtract(millis, pc.modulo(millis, window_ms))
    if pc.any(missing).as_py():
        starts = pc.if_else(missing, pa.scalar(None, pa.int64()), starts)
    return starts


class ArrowCounter:
    """Counts of raw keys and/or window starts over batches of messages, grouped by Arrow."""

    def __init__(self, by_key: bool, window_ms: int | None) -> None:
        if not by_key and window_ms is None:
            raise ValueError("nothing to count per message: neither by key nor by window")
        self.by_key = by_key
        self.window_ms = window_ms
        self._columns = (["key"] if by_key else []) + (["window"] if window_ms is not None else [])
        self._groups: list[pa.Table] = []
        self._rows = 0

    def add(self, messages: Sequence[Message]) -> bool:
        """Count one batch; False (nothing counted) if it must be counted message by message."""
        arrays: list[pa.Array] = []
        if self.by_key:
            arrays.append(pa.array(list(map(_key, messages)), pa.binary()))
        if self.window_ms is not None:
            starts = _window_starts(messages, self.window_ms)
            if starts is None:
                return False
            arrays.append(starts)
        table = pa.Table.from_arrays(arrays, self._columns)
        grouped = table.group_by(self._columns, use_threads=False).aggregate([([], "count_all")])
        self._groups.append(grouped.rename_columns([*self._columns, _COUNT]))
        self._rows += grouped.num_rows
        if self._rows > COMPACT_ROWS and len(self._groups) > 1:
            self._compact()
        return True

    def _compact(self) -> None:
        table = pa.concat_tables(self._groups)
        summed = table.group_by(self._columns, use_threads=False).aggregate([(_COUNT, "sum")])
        self._groups = [summed.rename_columns([*self._columns, _COUNT])]
        self._rows = summed.num_rows

    def counts(self) -> dict[Hashable, int]:
        """Raw key -> count, window start -> count, or (key, window start) -> count: as the
        per-message path counts them."""
        if not self._groups:
            return {}
        if len(self._groups) > 1:
            self._compact()
        table = self._groups[0]
        n: list[int] = table.column(_COUNT).to_pylist()
        columns: list[list[Any]] = [table.column(c).to_pylist() for c in self._columns]
        if len(columns) == 1:
            return dict(zip(columns[0], n, strict=True))
        return dict(zip(zip(columns[0], columns[1], strict=True), n, strict=True))


@dataclass(frozen=True)
class ArrowCounts:
    """Count keys and windows with :class:`ArrowCounter`, decode like ``CountMessages``."""

    by_key: bool = False
    window_ms: int | None = None

    def __call__(self, offset_range: OffsetRange, batches: Iterable[list[Message]]) -> dict[ResultKey, int]:
        total = 0
        grouped = ArrowCounter(self.by_key, self.window_ms)
        for batch in batches:
            total += len(batch)
            if not grouped.add(batch):
                raise ValueError("a timestamp outside what int64 window arithmetic holds exactly")
        decode = CountMessages(self.by_key, self.window_ms)
        return decode._deltas(total, grouped.counts())


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, keys: int) -> None:
    producer = Producer(
        {
            **client_config(bootstrap),
            "linger.ms": 100,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    names = [b"user-%05d" % k for k in range(keys)]
    for p in range(partitions):
        for i in range(per_partition):
            ts = BASE_MS + (i * HOUR_MS) // per_partition
            while True:
                try:
                    producer.produce(topic, b"v" * 10, names[(i * 7919) % keys], partition=p, timestamp=ts)
                    break
                except BufferError:
                    producer.poll(0.05)
    if producer.flush(600):
        raise RuntimeError("messages were not delivered")


Aggregate = Callable[[OffsetRange, Iterable[list[Message]]], Mapping[ResultKey, Number]]
AGGREGATES: dict[str, Callable[..., Aggregate]] = {
    "before": PerMessageCounts,
    "now": CountMessages,
    "Arrow": ArrowCounts,
}


def _timed(run: Callable[[], dict[ResultKey, Number]], messages: int) -> tuple[float, float, Any]:
    """Messages per CPU second and per wall-clock second, and the result."""
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    result = run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return messages / cpu, messages / wall, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.aggregate_counts", description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--keys", type=int, default=1_000, help="distinct keys (default 1000)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    per_partition = args.messages // args.partitions
    total = per_partition * args.partitions
    groupings: dict[str, dict[str, Any]] = {
        "key": {"by_key": True},
        "window 1m": {"window_ms": 60_000},
        "key + window 1m": {"by_key": True, "window_ms": 60_000},
    }
    with BrokerProcess() as broker:
        topic = "aggregate-counts"
        broker.create_topic(topic, args.partitions)
        produce(broker.bootstrap_servers, topic, args.partitions, per_partition, args.keys)
        conf = client_config(broker.bootstrap_servers)
        ranges = [OffsetRange(topic, p, 0, per_partition) for p in range(args.partitions)]
        read: list[tuple[OffsetRange, list[list[Message]]]] = [
            (r, list(RangeReader(conf, r, pause_gc=False))) for r in ranges
        ]
        if sum(len(b) for _, batches in read for b in batches) != total:
            raise RuntimeError("did not read every message")

        def in_memory(aggregate: Aggregate) -> Callable[[], dict[ResultKey, Number]]:
            def run() -> dict[ResultKey, Number]:
                out: dict[ResultKey, Number] = {}
                with gc_paused():  # as in a task
                    for r, batches in read:
                        for k, v in aggregate(r, batches).items():
                            out[k] = add_metrics(out.get(k, 0), v)
                return out

            return run

        def with_read(aggregate: Aggregate) -> Callable[[], dict[ResultKey, Number]]:
            def run() -> dict[ResultKey, Number]:
                out: dict[ResultKey, Number] = {}
                for r in ranges:
                    for k, v in aggregate(r, RangeReader(conf, r)).items():
                        out[k] = add_metrics(out.get(k, 0), v)
                return out

            return run

        print(f"{total:,} messages, {args.partitions} partitions, {args.keys:,} distinct keys, 60 windows")
        print("messages per CPU second (per wall-clock second), median of", args.rounds, "rounds")
        for where, make in (("counting only", in_memory), ("read + count", with_read)):
            for name, options in groupings.items():
                cpu: dict[str, list[float]] = {a: [] for a in AGGREGATES}
                wall: dict[str, list[float]] = {a: [] for a in AGGREGATES}
                results: dict[str, Any] = {}
                for _ in range(args.rounds):
                    for label, kind in AGGREGATES.items():
                        c, w, results[label] = _timed(make(kind(**options)), total)
                        cpu[label].append(c)
                        wall[label].append(w)
                if any(r != results["before"] for r in results.values()):
                    raise RuntimeError(f"{name}: the aggregates counted differently")
                before = statistics.median(cpu["before"])
                cells = [
                    f"{label} {statistics.median(cpu[label]):>10,.0f} ({statistics.median(wall[label]):>9,.0f})"
                    + ("" if label == "before" else f" {statistics.median(cpu[label]) / before:4.2f}x")
                    for label in AGGREGATES
                ]
                print(f"{where:14s} {name:16s} " + "   ".join(cells))
        read.clear()
        close_idle_consumers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
