"""Messages a DataFrame query or a results table cannot take: found by bisection over offsets.

A results table's batch fails as a whole: Spark's query fails on one value
(an ANSI cast of ``'thirty-one'`` to a number), or PostgreSQL refuses a row
made from one message (a key with a NUL byte, bytes that are not UTF-8, a
value too large for its column, a NULL key). Such a failure is
deterministic, so retrying the batch only repeats it, and the error names no
message. On the failure path only (the normal path runs the query once), the
batch's ranges are tried again piece by piece, as :mod:`txstore.kafka.bad_messages`
does for Python aggregates:

1. each range alone (reads are deterministic: the same offsets are the same
   messages);
2. a range that fails is cut in two halves by offset, each tried alone, and
   so on down to one offset: a one-offset piece that fails is a bad message
   (:class:`~txstore.kafka.bad_messages.BadOffset`), lowest first;
3. ``first_only`` (``--on-bad-message fail``, the default) stops at the first
   one: the job stops naming it. Otherwise every one is found, and the batch
   is committed without them (:func:`without`), recording them in
   ``txn_bad_messages`` in the same transaction. The search is bounded: past
   :data:`MAX_BAD_MESSAGES` in one batch it stops (each try is a Spark job, and
   a table that refuses every row is not one message's fault), and the job stops
   with :class:`~txstore.core.errors.TooManyBadMessages`.

If no piece fails on its own, the failure was not one message's (a passing
fault, or one that needs several messages together, such as a sum too large
for its column) and the caller raises the original error.

Pure: the caller gives the test (:data:`Fails`) that runs a piece.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence

import psycopg

from txstore.core.errors import TxstoreError
from txstore.core.ranges import OffsetRange
from txstore.kafka.bad_messages import REASON_CHARS, BadOffset, reason_of

Fails = Callable[[OffsetRange], "str | None"]
"""Run the query over one piece's messages and store its rows, then undo: why it failed, or None."""

SPARK_FAILURES = ("Py4JJavaError", "PythonException", "SparkException")

MAX_BAD_MESSAGES = 100
"""The most bad messages one batch's search finds before it stops (:func:`find_bad_offsets`)."""


def _txstore_errors() -> set[str]:
    found: set[str] = set()
    todo: list[type] = [TxstoreError]
    while todo:
        kind = todo.pop()
        found.add(kind.__name__)
        todo.extend(kind.__subclasses__())
    return found


def is_row_failure(error: BaseException) -> bool:
    """Whether one message may have caused ``error``: PostgreSQL refusing a value (a data
    exception or a constraint), or Spark's query failing at run time, unless the failure is
    one of txstore's own (a recreated topic, lost data) raised inside a task."""
    if isinstance(error, (psycopg.errors.DataError, psycopg.errors.IntegrityError)):
        return True
    try:
        from pyspark.errors import AnalysisException, PySparkException
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return False
    if isinstance(error, AnalysisException):
        return False  # the query itself is wrong, whatever the messages
    if not isinstance(error, PySparkException) and type(error).__name__ not in SPARK_FAILURES:
        return False
    from txstore.spark.ranges.tasks import spark_failure_reason

    return spark_failure_reason(error).split(":", 1)[0] not in _txstore_errors()


_SPARK_ERROR_CLASS = re.compile(r"(\w+(?:Exception|Error)): (\[[A-Z0-9_.]+\][^\n]*)")
"""A Spark error with its error class, e.g. ``SparkNumberFormatException: [CAST_INVALID_INPUT] ...``."""


def failure_reason(error: BaseException) -> str:
    """What ``txn_bad_messages.reason`` and the error line say: the error's type and first line
    (for a Spark job, Spark's error with its error class, or the error raised in the task)."""
    if isinstance(error, psycopg.Error):
        return reason_of(error)
    from txstore.spark.ranges.tasks import spark_failure_reason

    classified = _SPARK_ERROR_CLASS.search(str(error))
    if classified:
        return f"{classified.group(1)}: {classified.group(2)}"[:REASON_CHARS]
    reason = spark_failure_reason(error)
    if reason.startswith(SPARK_FAILURES) or ": " not in reason:
        reason = f"{type(error).__name__}: {reason}"
    return reason[:REASON_CHARS]


def find_bad_offsets(
    ranges: Sequence[OffsetRange], fails: Fails, first_only: bool, limit: int = MAX_BAD_MESSAGES
) -> tuple[BadOffset, ...]:
    """Steps 1-3 of the module over ``ranges``: the bad messages, lowest first per range; the
    search stops at the first (``first_only``) or once more than ``limit`` are found."""
    bad: list[BadOffset] = []
    enough = 1 if first_only else limit + 1
    for whole in ranges:
        piece = dataclasses.replace(whole, verify=None)
        reason = fails(piece)
        if reason is not None:
            _bisect(piece, reason, fails, bad, enough)
        if len(bad) >= enough:
            break
    return tuple(bad)


def _bisect(piece: OffsetRange, reason: str, fails: Fails, bad: list[BadOffset], enough: int) -> None:
    if piece.size == 1:
        bad.append(BadOffset(piece.topic, piece.partition, piece.from_offset, reason))
        return
    middle = piece.from_offset + piece.size // 2
    for half in (
        dataclasses.replace(piece, until_offset=middle),
        dataclasses.replace(piece, from_offset=middle),
    ):
        why = fails(half)
        if why is not None:
            _bisect(half, why, fails, bad, enough)
            if len(bad) >= enough:
                return


def without(pieces: Iterable[OffsetRange], bad: Iterable[BadOffset]) -> list[OffsetRange]:
    """``pieces`` cut around the bad messages' offsets, so that reading them skips exactly those.

    A cut piece that starts after a bad message verifies nothing (its ``verify`` named the
    message before the original start): the range's first piece still does.
    """
    skipped: dict[tuple[str, int], list[int]] = {}
    for b in bad:
        skipped.setdefault((b.topic, b.partition), []).append(b.offset)
    out: list[OffsetRange] = []
    for piece in pieces:
        start = piece.from_offset
        first = True
        for offset in sorted(
            o for o in skipped.get(piece.key, ()) if piece.from_offset <= o < piece.until_offset
        ):
            if offset > start:
                out.append(
                    dataclasses.replace(
                        piece, from_offset=start, until_offset=offset, verify=piece.verify if first else None
                    )
                )
            first = False
            start = offset + 1
        if start < piece.until_offset:
            out.append(dataclasses.replace(piece, from_offset=start, verify=piece.verify if first else None))
    return out
