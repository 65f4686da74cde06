"""Reading one planned offset range from Kafka, exactly, with consumers reused per process.

Reading is deterministic: an assigned consumer (no subscribe, no group
offsets, no auto commit) starts exactly at ``from_offset`` and stops at
``until_offset`` by offset, never by counting messages, because offsets can
have holes (compaction, transaction markers). ``auto.offset.reset=error``
makes an aged-out offset fail loudly instead of silently jumping to the end.
Every call has a timeout. The log read is checked to be the one planned:
before (the last counted message) and after (the message the read began
from, read again), so a topic deleted and recreated is never counted as the
old one (:class:`~txstore.core.errors.TopicRecreated`).

Reading is cheap per range and per message: a process keeps one idle
consumer per configuration and reuses it for the next range (a Spark Python
worker runs many tasks), messages come in batches of up to ``READ_BATCH``,
errors are looked for without Python code per message, and Python's cyclic
garbage collector is paused while a range is read (:func:`gc_paused`).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from txstore.core.errors import DataLoss, KafkaReadError, TopicRecreated
from txstore.core.fingerprint import Fingerprint, fingerprint, recreated_error
from txstore.core.ranges import OffsetRange, reset_command
from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS
from txstore.kafka.client_settings import reader_config, servers_of

READ_BATCH = 10_000
IDLE_TIMEOUT_SECONDS = 30.0
"""A read with no progress this long fails (and Spark retries the task). librdkafka gives up on a
request after socket.timeout.ms (10 s) and on a connection attempt after 10 s, so this is one
failed request plus one failed reconnect: a broker that froze or went away fails a task in 30 s
(a job's batch, with Spark's 4 attempts, in about 2 minutes), while a read always has data to
fetch (its range is below the last stable offset), so a live broker never idles it this long."""
POLL_SECONDS = 1.0
CONSUMER_MAX_IDLE_SECONDS = 300.0  # a pooled consumer unused for longer is replaced
CONSUMERS_KEPT = 4  # idle consumers kept per configuration (_ConsumerPool)
LAST_MESSAGE_THREADS = CONSUMERS_KEPT  # tails read at once by last_messages, one consumer each


def _offset(message: Message) -> int:
    offset = message.offset()
    assert offset is not None  # consumed messages and EOF events always carry one
    return offset


class _ConsumerPool:
    """Up to :data:`CONSUMERS_KEPT` idle consumers per configuration, kept for the next ranges
    this process reads.

    A Spark Python worker runs many tasks; starting a consumer (threads,
    connections, metadata) for each range would cost more than reading a
    small range. A worker reads one range at a time and so keeps one; the
    driver reads the tails of a batch's ranges on a few threads at once
    (:func:`last_messages`) and keeps one per thread. A consumer goes back
    into the pool only after a read that ended normally, unassigned; one
    that saw an error is closed instead. A pooled consumer is checked before
    reuse (it must answer with an empty assignment) and replaced if it sat
    unused for too long. The pool also remembers which topics each consumer
    has read, because a consumer assigned a topic it has no metadata for
    waits up to a second for librdkafka's periodic refresh unless the reader
    asks for it first.
    """

    def __init__(self) -> None:
        self._idle: dict[str, list[tuple[Consumer, float, set[str]]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(conf: Mapping[str, Any]) -> str:
        return repr(sorted((str(k), repr(v)) for k, v in conf.items()))

    def take(self, conf: Mapping[str, Any]) -> tuple[Consumer, set[str]]:
        """A consumer for ``conf`` (the one given back last) and the topics it has read before."""
        with self._lock:
            kept = self._idle.get(self._key(conf))
            idle = kept.pop() if kept else None
        if idle is not None:
            consumer, since, topics = idle
            try:
                if time.monotonic() - since < CONSUMER_MAX_IDLE_SECONDS and not consumer.assignment():
                    return consumer, topics
            except Exception:
                pass
            _close_quietly(consumer)
        return Consumer(dict(conf)), set()

    def give_back(self, conf: Mapping[str, Any], consumer: Consumer, topics: set[str]) -> None:
        try:
            consumer.unassign()
        except Exception:
            _close_quietly(consumer)
            return
        with self._lock:
            kept = self._idle.setdefault(self._key(conf), [])
            kept.append((consumer, time.monotonic(), topics))
            surplus = kept[:-CONSUMERS_KEPT]
            del kept[:-CONSUMERS_KEPT]
        for oldest, _, _ in surplus:
            _close_quietly(oldest)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = [c for kept in self._idle.values() for c in kept], {}
        for consumer, _, _ in idle:
            _close_quietly(consumer)


def own_consumer(settings: Mapping[str, Any]) -> Consumer:
    """A consumer not taken from the pool, for a read that changes its state beyond an
    assignment (pauses): closed by its caller."""
    return Consumer(dict(settings))


def _close_quietly(consumer: Consumer) -> None:
    with contextlib.suppress(Exception):
        consumer.close()


_consumers = _ConsumerPool()

_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside, as it was after.

    Every consumed message is a Python object the cyclic collector tracks,
    and they arrive ten thousand at a time: with collection on, Python walks
    them (and every other live object) over and over, which costs as much
    as the reading itself. Messages hold no reference cycles, and neither
    does a plain aggregate, so reference counting frees everything as usual;
    any cycle made meanwhile is collected after the range. Nesting and
    threads are fine: the collector comes back when the last pause ends.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def close_idle_consumers() -> None:
    """Close the consumers this process keeps for reuse (they are reopened on demand)."""
    _consumers.close()


_message_error = Message.error


def _out_of_range(error: KafkaError) -> bool:
    return error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)


class RangeReader:
    """Iterates a range as batches of messages, all with ``from <= offset < until``.

    After iteration, ``messages`` says how many were delivered and ``last`` is
    the :class:`~txstore.core.fingerprint.Fingerprint` of the last one (None if
    none was; only that message is hashed). A range that Kafka no longer
    fully holds raises :class:`DataLoss`; no progress for ``idle_timeout``
    seconds raises :class:`KafkaReadError`.

    A range with ``verify`` (the last message the job counted, planned by
    :func:`~txstore.core.ranges.plan_ranges`) is read from that message's offset:
    if a message is there and its fingerprint differs, the topic was deleted
    and recreated, and :class:`~txstore.core.errors.TopicRecreated` is raised
    before anything is delivered (``job`` names the job in that line). If the
    message is gone (compacted, aged out), there is nothing to compare and
    the range is read as usual.

    ``pause_gc``: pause the cyclic garbage collector while iterating
    (:func:`gc_paused`). Meant for code that reads the range to its end or
    fails (an aggregate); a caller that may leave the iteration suspended
    for good (a DataFrame with a ``limit``) passes False.
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        offset_range: OffsetRange,
        batch_size: int = READ_BATCH,
        idle_timeout: float = IDLE_TIMEOUT_SECONDS,
        pause_gc: bool = True,
        job: str = "",
        expect_last: Fingerprint | None = None,
    ) -> None:
        self.conf = reader_config(conf)
        self.expect_last = expect_last
        self.range = offset_range
        self.batch_size = batch_size
        self.idle_timeout = idle_timeout
        self.pause_gc = pause_gc
        self.job = job
        self.messages = 0
        self._last: Message | None = None
        self._anchor: Fingerprint | None = None  # the message the read started from, as first seen

    @property
    def last(self) -> Fingerprint | None:
        """The fingerprint of the last message delivered (hashed once asked, after the read)."""
        return fingerprint(self._last) if self._last is not None else None

    def __iter__(self) -> Iterator[list[Message]]:
        r = self.range
        if r.size == 0:
            return
        consumer, topics = _consumers.take(self.conf)
        finished = False
        try:
            if r.topic not in topics:
                with contextlib.suppress(KafkaException):  # the read itself then waits and times out
                    consumer.list_topics(r.topic, timeout=min(METADATA_TIMEOUT_SECONDS, self.idle_timeout))
                topics.add(r.topic)
            start = r.verify.offset if r.verify is not None else r.from_offset
            consumer.assign([TopicPartition(r.topic, r.partition, start)])
            with gc_paused() if self.pause_gc else contextlib.nullcontext():
                yield from self._batches(consumer)
            finished = True
        finally:
            if finished:
                _consumers.give_back(self.conf, consumer, topics)
            else:  # an error, or the caller stopped early: start the next read afresh
                _close_quietly(consumer)

    def _batches(self, consumer: Consumer) -> Iterator[list[Message]]:
        r = self.range
        verifying = r.verify is not None
        next_offset = r.verify.offset if r.verify is not None else r.from_offset
        last_progress = time.monotonic()
        while next_offset < r.until_offset:
            # Exactly the rest of the range: consume() returns as soon as the last
            # message arrives. With holes (transaction markers) fewer messages exist,
            # and the EOF event or the first message past `until` completes the batch.
            wanted = min(self.batch_size, r.until_offset - next_offset)
            batch = consumer.consume(wanted, POLL_SECONDS)
            if not batch:
                if time.monotonic() - last_progress > self.idle_timeout:
                    raise KafkaReadError(
                        f"no data from Kafka at {servers_of(self.conf)} for {self.idle_timeout:g}s while "
                        f"reading {r.topic!r} partition {r.partition} at offset {next_offset} "
                        f"(range {r.from_offset} -> {r.until_offset}); is the broker up, "
                        "or was the partition truncated?"
                    )
                continue
            last_progress = time.monotonic()
            reached_end = False
            if any(map(_message_error, batch)):  # no Python per message unless there are events
                good = []
                for m in batch:
                    error = m.error()
                    if error is None:
                        good.append(m)
                    elif error.code() == KafkaError._PARTITION_EOF:
                        # Everything below the log end was delivered, so offsets up to
                        # `until` that never came are holes (e.g. a transaction marker).
                        # An EOF below `until` only means "not yet": keep reading.
                        reached_end = reached_end or _offset(m) >= r.until_offset
                    elif verifying and _out_of_range(error):
                        # The message to verify aged out after planning: nothing to compare.
                        verifying = False
                        next_offset = r.from_offset
                        consumer.assign([TopicPartition(r.topic, r.partition, next_offset)])
                        good = []
                        break
                    else:
                        self._raise_for(consumer, error, next_offset)
                batch = good
            if verifying and batch:
                verifying = False
                batch = self._verified(batch)
            if batch:
                if _offset(batch[-1]) >= r.until_offset:
                    batch = [m for m in batch if _offset(m) < r.until_offset]
                    reached_end = True
                if batch:
                    if self._anchor is None:
                        self._anchor = fingerprint(batch[0])
                    next_offset = _offset(batch[-1]) + 1
                    self.messages += len(batch)
                    self._last = batch[-1]
                    yield batch
            if reached_end:
                break
        self._check_expected_last()
        self._check_same_log(consumer)

    def _check_expected_last(self) -> None:
        """With ``expect_last`` (the range's last message as the driver read it before the Spark
        job, :func:`last_messages`), the read must end on that same message: another one there,
        or a message past it, is another log."""
        expected, r = self.expect_last, self.range
        if expected is None:
            return
        last = self.last
        if last is None or last.offset < expected.offset:
            return  # removed since the driver looked (compaction): nothing to compare
        if last != expected:
            raise recreated_error(
                self.job,
                r.topic,
                r.partition,
                f"last message {expected.describe()} when the batch was planned",
                last.describe(),
                reset_command(self.job, r.topic, r.partition, "--to-earliest --new-generation"),
                during=f" while offsets {r.from_offset} -> {r.until_offset} were read",
                stored_label="",
            )

    def _check_same_log(self, consumer: Consumer) -> None:
        """Read the message the range started from again: another one there means the topic was
        deleted and recreated during the read, and the consumer went on in the new log.

        The check before the read only proves the start was the old log. Without
        topic IDs the consumer follows the topic's name, so a recreation while
        the range is read continues at the next offset in the new log and one
        range would hold both logs' messages. Kafka keeps a log's messages in
        place, so the first one read (or the verified one before ``from``) is
        still there unless the log changed; gone (aged out, compacted) or past
        the log end leaves nothing to compare, as before the read. Costs one
        fetch of one message per range.
        """
        r = self.range
        anchor = self._anchor
        if anchor is None:
            return
        consumer.assign([TopicPartition(r.topic, r.partition, anchor.offset)])
        deadline = time.monotonic() + self.idle_timeout
        while True:
            for m in consumer.consume(1, POLL_SECONDS):
                error = m.error()
                if error is None:
                    if _offset(m) != anchor.offset:
                        return  # removed since the read began (compaction): nothing to compare
                    found = fingerprint(m)
                    if found != anchor:
                        raise log_changed_during_read(self.job, r, anchor, found)
                    return
                if error.code() == KafkaError._PARTITION_EOF or _out_of_range(error):
                    return  # the log now ends below it, or it aged out: nothing to compare
                self._raise_for(consumer, error, anchor.offset)
            if time.monotonic() > deadline:
                raise KafkaReadError(
                    f"no data from Kafka at {servers_of(self.conf)} for {self.idle_timeout:g}s while "
                    f"checking {r.topic!r} partition {r.partition} at offset {anchor.offset} after "
                    f"reading {r.from_offset} -> {r.until_offset}; is the broker up?"
                )

    def _verified(self, batch: list[Message]) -> list[Message]:
        """The first batch read from the verified offset: compare, then keep ``offset >= from``.

        Only the few messages below ``from`` are looked at one by one.
        """
        r = self.range
        expected = r.verify
        assert expected is not None
        first = batch[0]
        if _offset(first) == expected.offset:
            found = fingerprint(first)
            self._anchor = found
            if found != expected:
                raise recreated_error(
                    self.job,
                    r.topic,
                    r.partition,
                    f"last counted message {expected.describe()}",
                    f"{found.describe()}",
                    reset_command(self.job, r.topic, r.partition, "--to-earliest"),
                )
        skip = 0
        while skip < len(batch) and _offset(batch[skip]) < r.from_offset:
            skip += 1
        return batch[skip:] if skip else batch

    def _raise_for(self, consumer: Consumer, error: KafkaError, next_offset: int) -> None:
        r = self.range
        if _out_of_range(error):
            # Kafka says "out of range" both below the log start (aged out) and at or past the
            # log end: a log that now ends below a planned offset is another log.
            try:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(r.topic, r.partition),
                    timeout=min(METADATA_TIMEOUT_SECONDS, self.idle_timeout),
                    cached=False,
                )
            except KafkaException:
                high = None
            if high is not None and 0 <= high <= next_offset:
                raise TopicRecreated(
                    f"job {self.job!r} topic {r.topic!r} partition {r.partition}: the log now ends at "
                    f"offset {high}, below offset {next_offset} that the range {r.from_offset} -> "
                    f"{r.until_offset} was planned to read: the topic was deleted and recreated (or an "
                    "unclean leader election); nothing was counted. To count the new topic from its "
                    "start as a new generation: "
                    + reset_command(self.job, r.topic, r.partition, "--to-earliest --new-generation")
                )
            raise DataLoss(
                f"{r.topic!r} partition {r.partition}: offset {next_offset} is no longer in Kafka "
                f"(range {r.from_offset} -> {r.until_offset}); messages aged out before they "
                f"were counted ({error.str()})"
            )
        if error.fatal() or not error.retriable():
            raise KafkaReadError(
                f"reading {r.topic!r} partition {r.partition} at offset {next_offset} failed: {error.str()}"
            )


def log_changed_during_read(
    job: str, r: OffsetRange, anchor: Fingerprint, found: Fingerprint
) -> TopicRecreated:
    """The same-log check's error: the message a range's read started from (``anchor``) is now
    another one (``found``), so the topic was recreated while the range was read."""
    seen = "last counted" if r.verify is not None and anchor == r.verify else "first read"
    return recreated_error(
        job,
        r.topic,
        r.partition,
        f"{seen} message {anchor.describe()}",
        found.describe(),
        reset_command(job, r.topic, r.partition, "--to-earliest --new-generation"),
        during=f" while offsets {r.from_offset} -> {r.until_offset} were read",
        stored_label="",
    )


LAST_MESSAGE_LOOKBACK = 64
"""How far below a range's end :func:`last_messages` looks for its last message (offsets below
the end can be holes: transaction markers, compacted messages)."""


def last_messages(
    conf: Mapping[str, Any], ranges: Sequence[OffsetRange], job: str = ""
) -> dict[tuple[str, int], Fingerprint]:
    """The fingerprint of each range's last message, read before the Spark job that reads it.

    For modes where Spark, not txstore, consumes the messages (a DataFrame
    aggregate, a results table): the readers check that their range ends on
    this very message (``expect_last``), and the commit stores it beside the
    offset, so the next batch can tell a recreated topic from the one counted.
    One short read per range, of at most :data:`LAST_MESSAGE_LOOKBACK` offsets,
    each a :class:`RangeReader` of its own; up to :data:`LAST_MESSAGE_THREADS`
    at once, since each read is mostly a wait for the broker (measured: 32
    tails in 27 ms, against 83 ms one after another). A range with no message
    there records nothing (as before). A read that fails raises its error, the
    first range's in ``ranges`` order, once the others have ended.
    """
    tails = [
        OffsetRange(
            r.topic,
            r.partition,
            max(r.from_offset, r.until_offset - LAST_MESSAGE_LOOKBACK),
            r.until_offset,
            generation=r.generation,
        )
        for r in ranges
        if r.size > 0
    ]

    def read(tail: OffsetRange) -> Fingerprint | None:
        reader = RangeReader(conf, tail, pause_gc=False, job=job)
        for _ in reader:
            pass
        return reader.last

    if len(tails) <= 1:
        found = [read(t) for t in tails]
    else:
        with ThreadPoolExecutor(min(LAST_MESSAGE_THREADS, len(tails)), "txstore-last-message") as pool:
            found = list(pool.map(read, tails))
    return {t.key: last for t, last in zip(tails, found, strict=True) if last is not None}
