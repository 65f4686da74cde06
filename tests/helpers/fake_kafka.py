"""In-process fakes of confluent-kafka's Consumer and Producer, for tests that must run in
milliseconds (the fast core tests, and the mutation run: ``./dev mutate``).

They are fakes of the client library, not of txstore: the reader and the outbox publisher
run unchanged against them. Messages and events are real ``confluent_kafka.Message``
objects (which can be built in Python), so ``Message.error`` and friends behave as with a
broker.

:class:`FakeLog` is one partition: messages at offsets (holes where a transaction marker or
a compacted message is), a log start and a log end, and optionally the log end a consumer
sees on each successive ``consume`` call (``visible_ends``: a follower or a fetch that has
not caught up yet), so that an end-of-partition event below the range's end can be staged.
:class:`FakeConsumer` behaves like an assigned librdkafka consumer with
``enable.partition.eof`` on and ``auto.offset.reset=error``: ``consume(n)`` returns up to
``n`` messages and events from its position, an EOF event once it reaches the visible end,
and an ``_AUTO_OFFSET_RESET`` error for a position outside the log. :class:`FakeAdminClient`
answers the planner's metadata and ListOffsets requests (the stream source's watermarks) from
the same logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

TIMESTAMP_TYPE_CREATE_TIME = 1


def message(
    topic: str,
    partition: int,
    offset: int,
    value: bytes | None = b"v",
    key: bytes | None = b"k",
    timestamp: int | None = None,
) -> Message:
    """A consumed message; ``timestamp`` None: no timestamp (type 0)."""
    ts = (0, -1) if timestamp is None else (TIMESTAMP_TYPE_CREATE_TIME, timestamp)
    return Message(topic=topic, partition=partition, offset=offset, key=key, value=value, timestamp=ts)


def event(topic: str, partition: int, offset: int, error: int | KafkaError) -> Message:
    """A consumer event (error) at ``offset``, e.g. ``KafkaError._PARTITION_EOF``."""
    if not isinstance(error, KafkaError):
        error = KafkaError(error)
    return Message(topic=topic, partition=partition, offset=offset, error=error)


@dataclass
class FakeLog:
    """One partition's log: ``messages`` by offset (missing offsets are holes), ``[low, high)``."""

    topic: str
    partition: int
    messages: dict[int, Message]
    low: int
    high: int
    visible_ends: list[int] = field(default_factory=list)  # per consume call; then ``high``
    # After that many consume calls, the log holds these messages instead (deleted and
    # recreated while a consumer reads it).
    replaced_after: tuple[int, dict[int, Message]] | None = None
    calls: int = 0
    errors: list[int | KafkaError | None] = field(default_factory=list)  # per consume call: an event, or None
    eof_never: bool = False  # no end-of-partition events (a broker that stopped answering)

    @classmethod
    def of(
        cls,
        topic: str,
        partition: int,
        offsets: Iterable[int],
        high: int | None = None,
        low: int = 0,
        value: Callable[[int], bytes] = lambda o: b"v%d" % o,
        visible_ends: Sequence[int] = (),
    ) -> FakeLog:
        found = sorted(offsets)
        end = high if high is not None else (found[-1] + 1 if found else low)
        return cls(
            topic,
            partition,
            {o: message(topic, partition, o, value(o), b"k", 1_000 + o) for o in found if o >= low},
            low,
            end,
            list(visible_ends),
        )

    def next_call(self) -> int | KafkaError | None:
        """Count a consume call; the error it returns, if one is staged (``errors``)."""
        self.calls += 1
        if self.replaced_after is not None and self.calls > self.replaced_after[0]:
            self.messages = self.replaced_after[1]
            self.replaced_after = None
        return self.errors.pop(0) if self.errors else None

    def visible_end(self) -> int:
        return self.visible_ends.pop(0) if self.visible_ends else self.high


class FakeConsumer:
    """An assigned consumer over :class:`FakeLog` partitions (one assignment at a time)."""

    def __init__(
        self, logs: Mapping[tuple[str, int], FakeLog], conf: Mapping[str, Any] | None = None
    ) -> None:
        self.logs = logs
        self.conf = dict(conf or {})
        self.position: dict[tuple[str, int], int] = {}
        self.eof_at: dict[tuple[str, int], int] = {}  # the log end each EOF event was sent at
        self.assigned_at: list[tuple[str, int, int]] = []  # every assign(), in order
        self.listed: list[str | None] = []  # every list_topics()
        self.list_timeouts: list[float] = []
        self.watermark_timeouts: list[float] = []
        self.watermarks_cached: list[bool] = []
        self.consumed: list[int] = []  # num_messages of every consume()
        self.paused: list[tuple[str, int]] = []  # every partition pause()d
        self.closed = False

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.listed.append(topic)
        self.list_timeouts.append(timeout)
        return None

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.position = {(tp.topic, tp.partition): tp.offset for tp in partitions}
        self.eof_at = {}
        self.assigned_at += [(tp.topic, tp.partition, tp.offset) for tp in partitions]

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p, o) for (t, p), o in self.position.items()]

    def unassign(self) -> None:
        self.position = {}

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Nothing more from these partitions (until the next assign)."""
        self.paused += [(tp.topic, tp.partition) for tp in partitions]
        for tp in partitions:
            self.position.pop((tp.topic, tp.partition), None)

    def close(self) -> None:
        self.closed = True

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self.watermark_timeouts.append(timeout)
        self.watermarks_cached.append(cached)
        log = self.logs[(partition.topic, partition.partition)]
        return log.low, log.high

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        """The log start (timestamp -2) or end (-1) of each partition, as Kafka's ListOffsets
        reads those two timestamps (the planner's kept consumer asks nothing else)."""
        out = []
        for tp in partitions:
            log = self.logs.get((tp.topic, tp.partition))
            if log is None:  # a topic deleted: librdkafka fails the whole lookup on its partition
                raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
            if tp.offset not in (-2, -1):
                raise NotImplementedError(f"offsets_for_times at a time ({tp.offset}) in the fake")
            out.append(TopicPartition(tp.topic, tp.partition, log.low if tp.offset == -2 else log.high))
        return out

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self.consumed.append(num_messages)
        out: list[Message] = []
        for key, position in list(self.position.items()):
            log = self.logs[key]
            code = log.next_call()
            if code is not None:
                out.append(event(log.topic, log.partition, position, code))
                continue
            if position < log.low or position > log.high:
                out.append(event(log.topic, log.partition, position, KafkaError._AUTO_OFFSET_RESET))
                continue
            end = log.visible_end()
            offset = position
            while offset < end and len(out) < num_messages:
                if offset in log.messages:
                    out.append(log.messages[offset])
                offset += 1  # holes (markers, compacted messages) are passed over
            self.position[key] = offset
            if (
                offset >= end
                and len(out) < num_messages
                and self.eof_at.get(key) != end
                and not log.eof_never
            ):
                out.append(event(log.topic, log.partition, end, KafkaError._PARTITION_EOF))
                self.eof_at[key] = end
        if not out:
            time.sleep(min(max(timeout, 0), 0.005))  # the real one waits up to the timeout
        return out


@dataclass
class FakeKafka:
    """The logs a test's consumers read, and every consumer made (``txstore.kafka.reader.Consumer``)."""

    logs: dict[tuple[str, int], FakeLog] = field(default_factory=dict)
    consumers: list[FakeConsumer] = field(default_factory=list)
    topic_ids: dict[str, str] = field(default_factory=dict)  # empty: a broker without topic IDs

    def add(self, log: FakeLog) -> FakeLog:
        self.logs[(log.topic, log.partition)] = log
        return log

    def consumer(self, conf: Mapping[str, Any]) -> FakeConsumer:
        made = FakeConsumer(self.logs, conf)
        self.consumers.append(made)
        return made


class FakeProducer:
    """Produces into a list; ``flush``/``poll`` report each message's delivery as ``outcome``
    says: None (delivered) or a ``KafkaError`` code for the message's index (0, 1, ...);
    ``refuse_at_produce`` raises that code from ``produce`` itself; ``unconfirmed`` leaves
    messages at those indexes without a report (``flush`` then returns how many)."""

    def __init__(
        self,
        outcome: Callable[[int], int | None] = lambda i: None,
        refuse_at_produce: Callable[[int], int | None] = lambda i: None,
        unconfirmed: Callable[[int], bool] = lambda i: False,
    ) -> None:
        self.outcome = outcome
        self.refuse_at_produce = refuse_at_produce
        self.unconfirmed = unconfirmed
        self.produced: list[tuple[str, bytes, bytes, list[tuple[str, Any]]]] = []
        self._pending: list[tuple[int, Callable[[KafkaError | None, Message], None], Message]] = []
        self._waiting = 0

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes,
        headers: list[tuple[str, Any]] | None = None,
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
    ) -> None:
        index = len(self.produced)
        refused = self.refuse_at_produce(index)
        if refused is not None:
            self.produced.append((topic, value, key, list(headers or [])))
            raise KafkaException(KafkaError(refused))
        self.produced.append((topic, value, key, list(headers or [])))
        assert on_delivery is not None
        self._pending.append((index, on_delivery, Message(topic=topic, value=value, key=key)))

    def poll(self, timeout: float = 0) -> int:
        return self._report()

    def flush(self, timeout: float = -1) -> int:
        self._report()
        return self._waiting

    def _report(self) -> int:
        reported = 0
        pending, self._pending = self._pending, []
        for index, on_delivery, msg in pending:
            if self.unconfirmed(index):
                self._waiting += 1
                continue
            code = self.outcome(index)
            on_delivery(None if code is None else KafkaError(code), msg)
            reported += 1
        return reported

    def close(self) -> None:
        pass


class FakeAdminClient:
    """confluent-kafka's AdminClient over :class:`FakeLog` partitions: a topic's metadata (an
    unknown topic as the broker reports it) and each partition's log start or end."""

    def __init__(
        self,
        logs: Mapping[tuple[str, int], FakeLog],
        conf: Mapping[str, Any],
        topic_ids: Mapping[str, str] | None = None,
    ) -> None:
        self.logs = logs
        self.conf = dict(conf)
        self.topic_ids = topic_ids if topic_ids is not None else {}

    def poll(self, timeout: float = 0) -> int:
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """One topic's metadata (an unknown one with the broker's error), or with ``topic`` None
        every topic's (what a topic pattern is resolved against)."""
        names = sorted({t for t, _ in self.logs}) if topic is None else [topic]
        topics: dict[str, Any] = {}
        for name in names:
            parts = {p: object() for (t, p) in self.logs if t == name}
            error = None if parts else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            topics[name] = type("TopicMetadata", (), {"error": error, "partitions": parts})()
        if self.topic_ids:  # a controller among its brokers: DescribeTopics answers topic IDs
            return type(
                "ClusterMetadata",
                (),
                {"topics": topics, "controller_id": 1, "brokers": {1: object()}},
            )()
        # No controller among its brokers: a broker that cannot answer DescribeTopics (no topic IDs).
        return type("ClusterMetadata", (), {"topics": topics, "controller_id": -1, "brokers": {}})()

    def describe_topics(self, topics: Any, request_timeout: float = -1) -> dict[str, Future[Any]]:
        out: dict[str, Future[Any]] = {}
        for name in topics.topic_names:
            answer: Future[Any] = Future()
            answer.set_result(type("TopicDescription", (), {"topic_id": self.topic_ids.get(name, "")})())
            out[name] = answer
        return out

    def list_offsets(
        self, requests: Mapping[TopicPartition, Any], isolation_level: Any = None, request_timeout: float = -1
    ) -> dict[TopicPartition, Future[Any]]:
        out: dict[TopicPartition, Future[Any]] = {}
        for tp, spec in requests.items():
            log = self.logs[(tp.topic, tp.partition)]
            answer: Future[Any] = Future()
            offset = log.low if type(spec).__name__ == "EarliestSpec" else log.high
            answer.set_result(type("ListOffsetsResultInfo", (), {"offset": offset})())
            out[tp] = answer
        return out


def install_admin(monkeypatch: pytest.MonkeyPatch, fake: FakeKafka) -> None:
    """The planner's admin clients (``txstore.kafka.admin``) and kept consumer
    (``txstore.kafka.client``) answer from ``fake``'s logs."""
    from txstore.kafka import admin, client

    monkeypatch.setattr(admin, "AdminClient", lambda conf: FakeAdminClient(fake.logs, conf, fake.topic_ids))
    # A running planner's kept consumer (Watermarks) asks the log offsets; not one of the readers
    # that FakeKafka.consumers counts.
    monkeypatch.setattr(client, "Consumer", lambda conf: FakeConsumer(fake.logs, conf))


def install(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    """The reader's consumers read :class:`FakeLog` partitions, from a pool of their own."""
    from txstore.kafka import reader

    fake = FakeKafka()
    monkeypatch.setattr(reader, "Consumer", fake.consumer)
    monkeypatch.setattr(reader, "_consumers", reader._ConsumerPool())
    return fake


def install_with_admin(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    """:func:`install` and :func:`install_admin`: the readers' consumers and the planner's admin
    clients answer from one fake's logs."""
    fake = install(monkeypatch)
    install_admin(monkeypatch, fake)
    return fake
