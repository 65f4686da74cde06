"""Event-time windows: durations like ``1m`` or ``1h30m``, and the window a timestamp falls in.

Windows are tumbling and aligned to the Unix epoch (like Spark's
``window()``), and a message's window comes from its Kafka timestamp, never
from the clock when it is processed. So a message lands in the same window
whether it is counted live, after a restart, in a backlog or in a replay.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from fractions import Fraction

from txstore.core.errors import ConfigError

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def parse_duration_ms(text: str) -> int:
    """``"1m"``, ``"90s"``, ``"1h30m"``, ``"500ms"``, ``"1.5h"`` -> milliseconds (at least 1)."""
    compact = text.strip().lower().replace(" ", "")
    parts = _PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(
            f"cannot read the duration {text!r}: use a number and a unit (ms, s, m, h, d, w), "
            "e.g. 30s, 1m, 1h30m"
        )
    ms = sum(Fraction(n) * _UNIT_MS[u] for n, u in parts)  # exact: 1.001s is 1001 ms
    if ms < 1 or ms != int(ms):
        raise ConfigError(f"the duration {text!r} must be a whole number of milliseconds, at least 1ms")
    return int(ms)


def window_start_ms(timestamp_ms: int, window_ms: int) -> int:
    """The start of the epoch-aligned window holding ``timestamp_ms`` (also before 1970)."""
    return timestamp_ms - timestamp_ms % window_ms


def window_start(timestamp_ms: int, window_ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=window_start_ms(timestamp_ms, window_ms))


def format_duration(ms: int) -> str:
    for unit in ("w", "d", "h", "m", "s"):
        if ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"
