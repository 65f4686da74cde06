"""Read a task's many small ranges on one consumer at once (a warm batch over many partitions).

A :class:`~txstore.kafka.reader.RangeReader` reads one range: it assigns the
partition, fetches, and then fetches the range's first message again to prove
the log did not change under the read. For a range of a few messages those two
round trips to the broker are nearly all of its cost, and a task of a running
job on 1,000 partitions holds hundreds of such ranges (measured on Apache Kafka:
5-11 ms a range one at a time, 0.2-0.4 ms with all partitions on one consumer).

:func:`read_together` keeps every rule of the one-range reader and only changes
how many partitions a fetch covers:

1. The ranges that qualify (:func:`together_candidates`: some messages, at most
   :data:`TOGETHER_MAX_OFFSETS` offsets, no ``expect_last``) are assigned at once,
   each at its start (the message to verify, else ``from``).
2. Messages are kept per range, ``from <= offset < until``, in order; a range is
   whole at its last offset, at a message past it, or at the log's end at or
   past ``until`` (holes: transaction markers). The first message at a verified
   offset is compared with the one the job counted.
3. Anything unusual leaves that range to the one-range reader, which reads it
   again and classifies it exactly as before: an error for its partition
   (out of range: aged out, or a recreated topic), a verified message that
   differs, a log that ends below ``until``, buffers past :data:`TOGETHER_MAX_BYTES`
   (memory is bounded in bytes), or too many messages past the ranges' ends. No data
   at all for ``idle_timeout`` raises :class:`~txstore.core.errors.KafkaReadError`
   naming a range still open, as the one-range reader does.
4. Once read, every range's anchor (its verified message, or its first) is
   fetched again, all on one assignment: another message there means the topic
   was recreated during the read, and that range raises
   :class:`~txstore.core.errors.TopicRecreated` when it is aggregated, as the
   one-range reader does at the end of its iteration.

Nothing is committed here: the caller aggregates each :class:`BufferedRange`
like a reader and commits as before (one conditional offset update a range).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from txstore.core.errors import KafkaReadError, TxstoreError
from txstore.core.fingerprint import Fingerprint, fingerprint
from txstore.core.ranges import OffsetRange
from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS
from txstore.kafka.client_settings import reader_config, servers_of
from txstore.kafka.reader import (
    IDLE_TIMEOUT_SECONDS,
    POLL_SECONDS,
    READ_BATCH,
    _close_quietly,
    _consumers,
    _offset,
    _out_of_range,
    gc_paused,
    log_changed_during_read,
)

TOGETHER_MAX_OFFSETS = 10_000
"""The largest range read together: beyond it one range alone fills a fetch anyway."""

TOGETHER_MAX_BYTES = 64 * 1024 * 1024
"""Bytes of messages kept across the ranges read together (keys, values and
:data:`MESSAGE_OVERHEAD_BYTES` each); past it the ranges not yet whole are read one at a time."""

MESSAGE_OVERHEAD_BYTES = 200
"""What a kept message costs beside its key and value, counted against :data:`TOGETHER_MAX_BYTES`
(the ``Message`` object and its ``bytes`` and topic objects: tiny messages are mostly this)."""

DISCARD_ALLOWANCE = 20_000
"""Messages past the ranges' ends (partitions whose logs go on) dropped before the ranges
still open are left to the one-range reader, on top of the offsets still due."""


def _consumer_failed(m: Message) -> bool:
    """An event for no partition that ends the consumer (not librdkafka's passing ones)."""
    error = m.error()
    return error is not None and m.topic() is None and (error.fatal() or not error.retriable())


class _ConsumerFailed(Exception):
    """The consumer itself failed while reading together: every range is read alone, which
    raises the error where it stays."""


def together_candidates(ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
    """The ranges worth reading together: some offsets to read, at most :data:`TOGETHER_MAX_OFFSETS`,
    one per partition (a partition twice in one task is read range by range)."""
    small = [r for r in ranges if 0 < r.size <= TOGETHER_MAX_OFFSETS]
    keys = [r.key for r in small]
    return [r for r in small if keys.count(r.key) == 1] if len(set(keys)) != len(keys) else small


@dataclass
class BufferedRange:
    """A range read by :func:`read_together`, iterated like a :class:`~txstore.kafka.reader.RangeReader`
    (its batches, then its same-log check's error if any): ``messages`` and ``last`` as there."""

    range: OffsetRange
    conf: Mapping[str, Any]
    job: str
    batches: list[list[Message]] = field(default_factory=list)
    messages: int = 0
    anchor: Fingerprint | None = None
    error: TxstoreError | None = None
    batch_size: int = READ_BATCH
    idle_timeout: float = IDLE_TIMEOUT_SECONDS
    _last: Message | None = None

    @property
    def last(self) -> Fingerprint | None:
        return fingerprint(self._last) if self._last is not None else None

    def __iter__(self) -> Iterator[list[Message]]:
        with gc_paused():
            yield from self.batches
        if self.error is not None:
            raise self.error


@dataclass
class _Open:
    """A range being read: where its partition's next message should be, what it kept."""

    range: OffsetRange
    buffered: BufferedRange
    next_offset: int
    verifying: bool
    done: bool = False


def read_together(
    conf: Mapping[str, Any],
    ranges: Sequence[OffsetRange],
    job: str = "",
    idle_timeout: float = IDLE_TIMEOUT_SECONDS,
    max_bytes: int = TOGETHER_MAX_BYTES,
    keep: bool = True,
) -> dict[tuple[str, int], BufferedRange]:
    """``ranges`` (:func:`together_candidates`) read on one consumer; the ranges read whole, by
    key. The others are left to the one-range reader (see the module docstring). ``keep``
    False: count the messages and keep each range's last one only (a counting stream's tasks)."""
    settings = reader_config(conf)
    if len(ranges) < 2:
        return {}
    consumer, topics = _consumers.take(settings)
    finished = False
    try:
        for topic in sorted({r.topic for r in ranges} - topics):
            try:
                consumer.list_topics(topic, timeout=min(METADATA_TIMEOUT_SECONDS, idle_timeout))
            except KafkaException:
                return {}  # the one-range reader waits and names the broker
            topics.add(topic)
        opened = {
            r.key: _Open(
                r,
                BufferedRange(r, settings, job, idle_timeout=idle_timeout),
                r.verify.offset if r.verify is not None else r.from_offset,
                r.verify is not None,
            )
            for r in ranges
        }
        with gc_paused():
            try:
                read, clean = _read(consumer, opened, settings, idle_timeout, max_bytes, keep)
            except _ConsumerFailed:
                return {}
            whole = {k: o.buffered for k, o in read.items()}
            _check_anchors(consumer, whole, settings, job, idle_timeout)
        # As the one-range reader's pool rule: a consumer that saw an error is closed, not kept.
        finished = clean
        return whole
    finally:
        if finished:
            _consumers.give_back(settings, consumer, topics)
        else:
            _close_quietly(consumer)


def _read(
    consumer: Consumer,
    opened: dict[tuple[str, int], _Open],
    conf: Mapping[str, Any],
    idle: float,
    max_bytes: int,
    keep: bool,
) -> tuple[dict[tuple[str, int], _Open], bool]:
    """Steps 1-3: the ranges read whole, by key (the rest dropped, for the one-range reader),
    and whether no partition's error was seen."""
    consumer.assign(
        [TopicPartition(o.range.topic, o.range.partition, o.next_offset) for o in opened.values()]
    )
    active = dict(opened)
    dropped: set[tuple[str, int]] = set()
    clean = True
    kept_bytes = 0
    discarded = 0
    allowance = DISCARD_ALLOWANCE + sum(o.range.until_offset - o.next_offset for o in opened.values())
    last_progress = time.monotonic()

    def drop(key: tuple[str, int]) -> None:
        active.pop(key, None)
        dropped.add(key)

    while active:
        due = sum(o.range.until_offset - o.next_offset for o in active.values())
        batch = consumer.consume(min(READ_BATCH, max(due, 1)), POLL_SECONDS)
        if not batch:
            if time.monotonic() - last_progress > idle:
                waiting = next(iter(active.values()))
                r = waiting.range
                raise KafkaReadError(
                    f"no data from Kafka at {servers_of(conf)} for {idle:g}s while reading {r.topic!r} "
                    f"partition {r.partition} at offset {waiting.next_offset} (range {r.from_offset} -> "
                    f"{r.until_offset}, and {len(active) - 1} more ranges read together); is the "
                    "broker up, or was the partition truncated?"
                )
            continue
        last_progress = time.monotonic()
        for m in batch:
            key = (m.topic(), m.partition())
            o = active.get(key)  # type: ignore[arg-type]
            error = m.error()
            if o is None:
                if _consumer_failed(m):
                    raise _ConsumerFailed
                discarded += 1
                continue
            r = o.range
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if _offset(m) >= r.until_offset:
                        o.done = True  # everything below the log end came: the rest are holes
                        del active[r.key]
                    elif _offset(m) >= o.next_offset:
                        drop(r.key)  # the log ends below `until` (planned there): the one-range reader's case
                    continue
                drop(r.key)  # out of range, or another error: classified by the one-range reader
                clean = False
                continue
            offset = _offset(m)
            if offset < o.next_offset:
                continue  # a fetch that began before an earlier position (never expected)
            if o.verifying:
                o.verifying = False
                if r.verify is not None and offset == r.verify.offset:
                    found = fingerprint(m)
                    if found != r.verify:
                        drop(r.key)  # the one-range reader reads it again and raises TopicRecreated
                        continue
                    o.buffered.anchor = found
            if offset < r.from_offset:
                o.next_offset = offset + 1
                continue
            if offset >= r.until_offset:
                o.done = True
                del active[r.key]
                continue
            if o.buffered.anchor is None:
                o.buffered.anchor = fingerprint(m)
            if keep:
                kept_bytes += len(m.value() or b"") + len(m.key() or b"") + MESSAGE_OVERHEAD_BYTES
                if not o.buffered.batches or len(o.buffered.batches[-1]) >= READ_BATCH:
                    o.buffered.batches.append([])
                o.buffered.batches[-1].append(m)
            o.buffered.messages += 1
            o.buffered._last = m
            o.next_offset = offset + 1
            if o.next_offset >= r.until_offset:
                o.done = True
                del active[r.key]
            if kept_bytes > max_bytes:
                break
        if kept_bytes > max_bytes or discarded > allowance:
            break  # the ranges not yet whole are read one at a time
    return {k: o for k, o in opened.items() if o.done and k not in dropped}, clean


def check_same_logs(
    conf: Mapping[str, Any],
    buffered: Mapping[tuple[str, int], BufferedRange],
    job: str = "",
    idle_timeout: float = IDLE_TIMEOUT_SECONDS,
) -> None:
    """Step 4 on a consumer of its own (for a check apart from the read): see :func:`_check_anchors`."""
    settings = reader_config(conf)
    consumer, topics = _consumers.take(settings)
    try:
        _check_anchors(consumer, buffered, settings, job, idle_timeout)
    except BaseException:
        _close_quietly(consumer)
        raise
    _consumers.give_back(settings, consumer, topics)


def _check_anchors(
    consumer: Consumer,
    buffered: Mapping[tuple[str, int], BufferedRange],
    conf: Mapping[str, Any],
    job: str,
    idle: float,
) -> None:
    """Step 4: each range's anchor fetched again, all partitions at once; another message there
    is a recreated topic, kept as that range's error (gone, or past the log end: nothing to
    compare, as in :meth:`~txstore.kafka.reader.RangeReader._check_same_log`)."""
    pending = {k: b for k, b in buffered.items() if b.anchor is not None}
    if not pending:
        return
    consumer.assign([TopicPartition(k[0], k[1], b.anchor.offset) for k, b in pending.items()])  # type: ignore[union-attr]
    deadline = time.monotonic() + idle
    while pending:
        for m in consumer.consume(len(pending), POLL_SECONDS):
            b = pending.get((m.topic(), m.partition()))  # type: ignore[arg-type]
            error = m.error()
            if b is None:
                if error is not None and _consumer_failed(m):
                    raise KafkaReadError(
                        f"checking {len(pending)} ranges read together failed: {error.str()}"
                    )
                continue
            r, anchor = b.range, b.anchor
            assert anchor is not None
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF or _out_of_range(error):
                    del pending[r.key]  # the log now ends below it, or it aged out: nothing to compare
                elif error.fatal() or not error.retriable():
                    raise KafkaReadError(
                        f"checking {r.topic!r} partition {r.partition} at offset {anchor.offset} failed: {error.str()}"
                    )
                continue
            del pending[r.key]
            if _offset(m) != anchor.offset:
                continue  # removed since the read began (compaction): nothing to compare
            found = fingerprint(m)
            if found != anchor:
                b.error = log_changed_during_read(job, r, anchor, found)
        if pending and time.monotonic() > deadline:
            topic, partition = next(iter(pending))
            raise KafkaReadError(
                f"no data from Kafka at {servers_of(conf)} for {idle:g}s while checking {topic!r} partition "
                f"{partition} (and {len(pending) - 1} more ranges read together) after reading them; "
                "is the broker up?"
            )
