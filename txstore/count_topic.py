"""count_topic: exactly-once message counts per topic, and optionally per key and event-time window.

Every run keeps the topic total (grain ``topic``). ``--by key`` adds a row
per message key (grain ``key``), ``--window 1m`` a row per one-minute
window of Kafka message timestamps (grain ``window``), and both together a
row per key and window (grain ``key+window``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import Message

from txstore.core.errors import ConfigError
from txstore.core.ranges import OffsetRange
from txstore.core.results import (
    GRAIN_KEY,
    GRAIN_KEY_WINDOW,
    GRAIN_WINDOW,
    TOPIC_TOTAL,
    ResultKey,
    decode_key,
)
from txstore.core.windows import parse_duration_ms, window_start
from txstore.runner import run_job_main
from txstore.spark.ranges.range_task import Aggregate

_key = Message.key  # unbound: map() calls it without an attribute lookup per message
_timestamp = Message.timestamp
_result_key = tuple.__new__  # ResultKey from a tuple, without NamedTuple's Python-level __new__


@dataclass(frozen=True)
class CountMessages:
    """The count deltas of one range: the topic total, plus per key and/or window if asked.

    Per batch, raw keys and window starts (epoch milliseconds; None for a
    message without a timestamp) are counted in a ``Counter`` fed by
    ``map`` over the batch's C methods; then each distinct key is decoded
    (:func:`~txstore.core.results.decode_key`) and each distinct window start
    made a datetime (:func:`~txstore.core.windows.window_start`) once, however
    many ``(key, window)`` pairs share it. A timestamp no calendar can hold
    raises there, so :mod:`txstore.kafka.bad_messages` finds its message. Counting
    on Arrow arrays (``group_by``) was measured and is slower here
    (``python -m bench.aggregate_counts``; README, Benchmark).
    """

    by_key: bool = False
    window_ms: int | None = None

    def __call__(self, offset_range: OffsetRange, batches: Iterable[list[Message]]) -> dict[ResultKey, int]:
        total = 0
        if not self.by_key and self.window_ms is None:
            for batch in batches:
                total += len(batch)
            return {TOPIC_TOTAL: total}
        counts: Counter[Any] = Counter()
        w = self.window_ms
        for batch in batches:
            total += len(batch)
            if w is None:
                counts.update(map(_key, batch))
                continue
            # window_start_ms(ts, w), inline; librdkafka's timestamp type 0: no timestamp.
            starts = [ts - ts % w if kind else None for kind, ts in map(_timestamp, batch)]
            counts.update(zip(map(_key, batch), starts, strict=True) if self.by_key else starts)
        return self._deltas(total, counts)

    def _deltas(self, total: int, counts: Mapping[Any, int]) -> dict[ResultKey, int]:
        deltas: dict[ResultKey, int] = {TOPIC_TOTAL: total}
        w = self.window_ms
        raw_pairs: list[tuple[bytes | None, int | None]]
        if w is None:
            grain, raw_pairs = GRAIN_KEY, [(k, None) for k in counts]
        elif not self.by_key:
            grain, raw_pairs = GRAIN_WINDOW, [(None, s) for s in counts]
        else:
            grain, raw_pairs = GRAIN_KEY_WINDOW, list(counts)
        texts = {k: decode_key(k) for k in {k for k, _ in raw_pairs}}
        starts: dict[int | None, datetime | None] = {None: None}
        if w is not None:
            distinct = {s for _, s in raw_pairs if s is not None}
            starts.update({s: window_start(s, w) for s in distinct})
        for (k, s), n in zip(raw_pairs, counts.values(), strict=True):
            address = _result_key(ResultKey, (grain, texts[k], starts[s]))
            deltas[address] = deltas.get(address, 0) + n  # distinct raw keys may decode alike
        return deltas


count_messages = CountMessages()
"""Topic totals only: the default ``count_topic`` aggregate."""


def add_count_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--by",
        choices=["key"],
        help="also count per message key (rows with grain 'key'; null keys count under a NULL key)",
    )
    parser.add_argument(
        "--window",
        metavar="DURATION",
        help="also count per event-time window of the Kafka message timestamps, e.g. 30s, 1m, 1h "
        "(rows with grain 'window', or 'key+window' with --by key)",
    )


def count_aggregate(args: argparse.Namespace) -> Aggregate:
    window_ms = parse_duration_ms(args.window) if args.window is not None else None
    if (args.by or window_ms) and getattr(args, "sink", None) == "idempotent":
        raise ConfigError(
            "--sink idempotent stores messages one by one; it cannot be combined with --by or --window"
        )
    return CountMessages(by_key=args.by == "key", window_ms=window_ms)


def main(argv: list[str] | None = None) -> int:
    return run_job_main(
        argv,
        prog="count_topic",
        description="Count Kafka messages per topic (and per key or event-time window) into PostgreSQL, "
        "exactly once.",
        default_job="count_topic",
        add_options=add_count_options,
        make_aggregate=count_aggregate,
    )


if __name__ == "__main__":
    sys.exit(main())
