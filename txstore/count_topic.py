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
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Message

from txstore.errors import ConfigError
from txstore.ranges import OffsetRange
from txstore.results import (
    GRAIN_KEY,
    GRAIN_KEY_WINDOW,
    GRAIN_WINDOW,
    TOPIC_TOTAL,
    ResultKey,
    decode_key,
)
from txstore.runner import run_job_main
from txstore.task import Aggregate
from txstore.windows import parse_duration_ms, window_start, window_start_ms


def _bucket(timestamp: tuple[int, int], window_ms: int) -> int | None:
    ts_type, ts = timestamp
    return window_start_ms(ts, window_ms) if ts_type else None  # type 0: no timestamp


@dataclass(frozen=True)
class CountMessages:
    """The count deltas of one range: the topic total, plus per key and/or window if asked."""

    by_key: bool = False
    window_ms: int | None = None

    def __call__(self, offset_range: OffsetRange, batches: Iterable[list[Message]]) -> dict[ResultKey, int]:
        total = 0
        if not self.by_key and self.window_ms is None:
            for batch in batches:
                total += len(batch)
            return {TOPIC_TOTAL: total}
        # Count raw keys and window starts first; decode each distinct one once.
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
            deltas[address] = deltas.get(address, 0) + n  # distinct raw keys may decode alike
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
