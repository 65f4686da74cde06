"""Messages an aggregate cannot process: find them, then stop with one line or skip them.

A message whose timestamp no calendar can hold, a value that is not JSON, a
user's aggregate raising: such a failure is deterministic, so retrying the
Spark task or the batch only repeats it, forever. This module finds the very
message instead, on the failure path only (the normal path is one call of the
aggregate over the range, as before).

An aggregate is ``(offset_range, batches) -> deltas`` and additive by
contract: a range's deltas are the sum of its pieces' deltas (per-batch
commits cut ranges into pieces too). So when it raises an ordinary exception
(:func:`is_message_failure`) over a range:

1. read the range again from Kafka (a read is deterministic: same offsets,
   same messages), batch by batch, never more than one batch in memory;
2. run the aggregate over each batch alone, as the piece
   ``[first offset, last offset + 1)``;
3. cut a batch that fails in two halves and run each alone, and so on down
   to single messages: a single message that fails is a bad message
   (:class:`BadOffset`); the lowest comes first;
4. the deltas of the pieces that succeeded add up to exactly the deltas of
   the good messages.

``fail`` (the default) stops at the first bad message: the range is refused
with :class:`~txstore.core.errors.BadMessage` and nothing is committed for it.
``skip`` goes through the whole range; the caller commits the good messages'
deltas and records the bad ones in ``txn_bad_messages`` in the same
transaction (:class:`~txstore.postgres.sink.TransactionalSink`). If no piece fails
on its own, the failure was not one message's (a passing fault, or one that
needs several messages together) and the original error is raised as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from confluent_kafka import KafkaException, Message

from txstore.core.errors import TxstoreError, first_line
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange
from txstore.core.results import Number, ResultKey, add_metrics
from txstore.kafka.reader import RangeReader

if TYPE_CHECKING:
    from txstore.kafka.together import BufferedRange

FAIL = "fail"
SKIP = "skip"
ON_BAD_MESSAGE = (FAIL, SKIP)
REASON_CHARS = 500

_Aggregate = Callable[[OffsetRange, Iterable[list[Message]]], Mapping[ResultKey, Number]]

# Failures that are never a message's fault: ours (data loss, a read error), the servers',
# or the machine's. They keep their own handling (refusal, or a retry by Spark).
_NOT_THE_MESSAGE = (TxstoreError, psycopg.Error, KafkaException, MemoryError, ConnectionError, TimeoutError)


@dataclass(frozen=True, order=True)
class BadOffset:
    """One message the aggregate (or transform) fails on, and why: ``"OverflowError: ..."``."""

    topic: str
    partition: int
    offset: int
    reason: str


def is_message_failure(error: BaseException) -> bool:
    """An ordinary exception from the user's code, which one message may cause."""
    return isinstance(error, Exception) and not isinstance(error, _NOT_THE_MESSAGE)


def reason_of(error: BaseException) -> str:
    """The error's type and first line, as recorded in ``txn_bad_messages.reason``."""
    return f"{type(error).__name__}: {first_line(error)}"[:REASON_CHARS]


def describe_skipped(bad: Iterable[BadOffset], total: int, shown: int = 5) -> str:
    """``offset 3 (OverflowError: ...), offset 9 (...)``: the first ``shown`` of ``total``, then
    ``and N more``."""
    text = ", ".join(f"offset {b.offset} ({b.reason})" for b in list(bad)[:shown])
    more = total - min(shown, total)
    return text + (f", and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class Aggregated:
    """A range's deltas, how many messages were read, and the bad messages found (if any)."""

    deltas: Mapping[ResultKey, Number]
    messages: int
    bad: tuple[BadOffset, ...] = ()
    last: Fingerprint | None = None  # the range's last message, stored beside its offset


def aggregate_range(aggregate: _Aggregate, reader: RangeReader | BufferedRange, skip: bool) -> Aggregated:
    """Run ``aggregate`` over ``reader``'s range; on a message's failure, find the message(s).

    With ``skip`` False the result holds the first bad message only, and its
    deltas are incomplete (the caller refuses the range). Errors that are not
    a message's, and failures no single message reproduces, are raised.
    """
    try:
        return Aggregated(aggregate(reader.range, reader), reader.messages, last=reader.last)
    except Exception as e:
        if not is_message_failure(e):
            raise
        failure = e
    again = RangeReader(reader.conf, reader.range, reader.batch_size, reader.idle_timeout, job=reader.job)
    found = isolate(aggregate, reader.range, again, first_only=not skip)
    if not found.bad:
        raise failure
    # The re-read went through the whole range (with ``skip``): its last message is the range's.
    return dataclasses.replace(found, last=again.last)


def isolate(
    aggregate: _Aggregate, offset_range: OffsetRange, batches: Iterable[list[Message]], first_only: bool
) -> Aggregated:
    """Steps 2-4 over ``offset_range``'s messages read again: every batch alone, bisected where it fails.

    ``first_only``: stop at the first bad message (its deltas are then incomplete).
    """
    deltas: dict[ResultKey, Number] = {}
    bad: list[BadOffset] = []
    messages = 0
    for batch in batches:
        if not batch:
            continue
        messages += len(batch)
        _bisect(aggregate, offset_range, batch, deltas, bad, first_only)
        if bad and first_only:
            break
    return Aggregated(deltas, messages, tuple(bad))


def _bisect(
    aggregate: _Aggregate,
    whole: OffsetRange,
    messages: list[Message],
    deltas: dict[ResultKey, Number],
    bad: list[BadOffset],
    first_only: bool,
) -> None:
    first, last = messages[0].offset(), messages[-1].offset()
    assert first is not None and last is not None
    piece = OffsetRange(whole.topic, whole.partition, first, last + 1)
    try:
        found = list(aggregate(piece, [messages]).items())
    except Exception as e:
        if not is_message_failure(e):
            raise
        reason = reason_of(e)
    else:
        for key, value in found:
            deltas[key] = add_metrics(deltas.get(key, 0), value)
        return
    if len(messages) == 1:
        bad.append(BadOffset(whole.topic, whole.partition, first, reason))
        return
    half = len(messages) // 2
    _bisect(aggregate, whole, messages[:half], deltas, bad, first_only)
    if not (first_only and bad):
        _bisect(aggregate, whole, messages[half:], deltas, bad, first_only)
