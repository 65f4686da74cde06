"""Result rows: what an aggregate returns and ``txn_data`` stores.

A row is addressed by its *grain* (what it aggregates over) plus an optional
group key and event-time window start. The grain keeps rows of different
shapes apart: the topic total and the count of messages with a null Kafka
key both have a NULL key and window, but not the same grain.

Metrics are exact decimals (``NUMERIC``): ints, ``Decimal`` and finite floats
(as the decimal of their ``repr``) are accepted; deltas add up in the database,
never in Spark's retry path, and where Python adds them (a task's ranges, a
per-batch driver-side sum) :func:`add_metrics` adds them without rounding.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

Number = int | float | Decimal

GRAIN_TOPIC = "topic"
GRAIN_KEY = "key"
GRAIN_WINDOW = "window"
GRAIN_KEY_WINDOW = "key+window"


class ResultKey(NamedTuple):
    """Where a delta goes in ``txn_data``: ``(grain, key, window_start)`` within the job and topic."""

    grain: str
    key: str | None = None
    window_start: datetime | None = None


TOPIC_TOTAL = ResultKey(GRAIN_TOPIC)
"""The topic's total: one row per job and topic."""


def by_key(key: str | None) -> ResultKey:
    """A per-key row (``key`` None: the messages without a key)."""
    return ResultKey(GRAIN_KEY, key)


def by_window(window_start: datetime | None) -> ResultKey:
    """A per-event-time-window row (``window_start`` None: messages without a timestamp)."""
    return ResultKey(GRAIN_WINDOW, None, window_start)


def by_key_and_window(key: str | None, window_start: datetime | None) -> ResultKey:
    return ResultKey(GRAIN_KEY_WINDOW, key, window_start)


Deltas = Mapping[ResultKey, Number]
"""What an aggregate returns for a range: how much to add to each result row."""


def metric_text(value: Number) -> str:
    """A delta as exact decimal text for PostgreSQL ``NUMERIC``; refuses NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise TypeError(f"a result delta must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"a result delta must be finite, got {value!r}")
    if isinstance(value, Decimal) and not value.is_finite():
        raise ValueError(f"a result delta must be finite, got {value!r}")
    return repr(value) if isinstance(value, float) else str(value)


# Addition in this context is exact: as many digits as the sum needs, never rounded.
_EXACT = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Overflow, decimal.DivisionByZero],
)


def exact_decimal(value: Number) -> Decimal:
    """``value`` as a Decimal without rounding; a float becomes the decimal of its ``repr``."""
    if isinstance(value, float):
        return Decimal(repr(value))
    return value if isinstance(value, Decimal) else Decimal(value)


def add_metrics(a: Number, b: Number) -> Number:
    """``a + b`` exactly, for any two deltas: ints stay ints; anything else is an exact Decimal.

    Python's own ``+`` is not exact here: floats add in binary floating point, and
    Decimals round to the current context's 28 significant digits (even ``0 + x``).
    Aggregates should add their deltas with this function too.
    """
    if type(a) is int and type(b) is int:
        return a + b
    return _EXACT.add(exact_decimal(a), exact_decimal(b))


def row_order(row: tuple[str, ResultKey]) -> tuple[str, str, bool, str, bool, datetime]:
    """A total order over ``(topic, ResultKey)`` with NULLs first.

    Every writer upserts rows in this order, so concurrent transactions lock
    shared rows (every partition adds to the topic total) in the same order
    and cannot deadlock.
    """
    topic, (grain, key, window) = row
    return (topic, grain, key is not None, key or "", window is not None, window or datetime.min)


def decode_key(raw: bytes | None) -> str | None:
    """A Kafka key as ``txn_data.key`` text, one text per key and back (:func:`encode_key`).

    UTF-8 keys are stored as they are, except that a backslash is stored as
    two (``\\\\``). Bytes that are not UTF-8, and NUL (which PostgreSQL text
    cannot hold), are stored as ``\\xNN`` escapes. Because a literal
    backslash is always doubled, the key ``b"\\xff"`` (four characters) and the
    byte ``0xff`` are stored apart: every key is counted under its own text,
    never dropped or merged with another key or the null key.
    """
    if raw is None:
        return None
    if b"\\" in raw:
        raw = raw.replace(b"\\", b"\\\\")  # 0x5C is never part of a multi-byte UTF-8 character
    text = raw.decode("utf-8", "backslashreplace")
    return text.replace("\x00", "\\x00") if "\x00" in text else text


_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2})")


def encode_key(text: str) -> bytes:
    """The Kafka key bytes a :func:`decode_key` text stands for."""
    if "\\" not in text:
        return text.encode()
    out = bytearray()
    position = 0
    for match in _ESCAPE.finditer(text):
        out += text[position : match.start()].encode()
        escape = match.group(1)
        out += b"\\" if escape == "\\" else bytes([int(escape[1:], 16)])
        position = match.end()
    out += text[position:].encode()
    return bytes(out)


def plain_number(value: Decimal | int) -> int | float:
    """A stored metric for display and JSON: an int when whole, else a float."""
    return int(value) if value == int(value) else float(value)
