"""Kafka adapter: client settings, watermarks, and reading one offset range.

Reading is deterministic: an assigned consumer (no subscribe, no group
offsets, no auto commit) starts exactly at ``from_offset`` and stops at
``until_offset`` by offset, never by counting messages, because offsets can
have holes (compaction, transaction markers). ``auto.offset.reset=error``
makes an aged-out offset fail loudly instead of silently jumping to the end.
Every call has a timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from txstore.errors import ConfigError, DataLoss, KafkaReadError, KafkaUnavailable
from txstore.ranges import OffsetRange, PartitionWatermarks

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
METADATA_TIMEOUT_SECONDS = 15.0
READ_BATCH = 10_000
IDLE_TIMEOUT_SECONDS = 60.0

# Settings a user's --kafka-option must not change: they are what makes reads exact.
_READER_FIXED = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "enable.partition.eof": True,
}


def client_config(bootstrap_servers: str, options: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Base settings shared by every Kafka client txstore creates (TLS/SASL go in ``options``)."""
    if not bootstrap_servers:
        raise ConfigError(f"no Kafka given: pass --bootstrap-servers or set {BOOTSTRAP_ENV}")
    conf: dict[str, Any] = {
        "socket.timeout.ms": 10_000,
        "socket.connection.setup.timeout.ms": 10_000,
        "log_level": 3,
    }
    conf.update(options or {})
    conf["bootstrap.servers"] = bootstrap_servers
    return conf


def reader_config(base: Mapping[str, Any]) -> dict[str, Any]:
    conf = {
        "group.id": "txstore-reader",  # required by librdkafka; never joined or committed to
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 100,
        **base,
        **_READER_FIXED,
    }
    return conf


def _servers(conf: Mapping[str, Any]) -> str:
    return str(conf.get("bootstrap.servers"))


def fetch_watermarks(
    conf: Mapping[str, Any], topics: Sequence[str], timeout: float = METADATA_TIMEOUT_SECONDS
) -> list[PartitionWatermarks]:
    """Every partition of ``topics`` with its log-start and log-end offsets.

    One metadata request and two batched ListOffsets requests, whatever the
    partition count. Raises :class:`KafkaUnavailable` (with the broker
    address) on timeout or unknown topics.
    """
    admin = AdminClient(dict(conf))
    servers = _servers(conf)
    partitions: list[TopicPartition] = []
    try:
        for topic in topics:
            metadata = admin.list_topics(topic, timeout=timeout)
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                reason = found.error.str() if found is not None and found.error else "not found"
                raise KafkaUnavailable(
                    f"topic {topic!r} is not available on Kafka at {servers}: {reason}; "
                    "check --topic and that the topic exists"
                )
            partitions.extend(TopicPartition(topic, p) for p in sorted(found.partitions))
        low = _list_offsets(admin, partitions, _EARLIEST, timeout)
        # Read-committed end (the last stable offset): reading never waits on open transactions.
        high = _list_offsets(admin, partitions, _LATEST, timeout, committed=True)
    except KafkaException as e:
        raise KafkaUnavailable(
            f"Kafka at {servers} did not answer within {timeout:g}s ({e.args[0]}); "
            f"check --bootstrap-servers / {BOOTSTRAP_ENV} and the network"
        ) from None
    return [
        PartitionWatermarks(
            tp.topic, tp.partition, low[(tp.topic, tp.partition)], high[(tp.topic, tp.partition)]
        )
        for tp in partitions
    ]


def offsets_for_timestamp(
    conf: Mapping[str, Any],
    partitions: Sequence[tuple[str, int]],
    timestamp_ms: int,
    timeout: float = METADATA_TIMEOUT_SECONDS,
) -> dict[tuple[str, int], int]:
    """Per partition, the first offset whose timestamp is at or after ``timestamp_ms``.

    Kafka's offsets-for-times lookup; a partition with no such message gets -1
    (the caller then uses its log end).
    """
    if not partitions:
        return {}
    admin = AdminClient(dict(conf))
    spec = OffsetSpec.for_timestamp(timestamp_ms)  # type: ignore[no-untyped-call]
    try:
        return _list_offsets(admin, [TopicPartition(t, p) for t, p in partitions], spec, timeout)
    except KafkaException as e:
        raise KafkaUnavailable(
            f"Kafka at {_servers(conf)} did not answer the offsets-for-times lookup within {timeout:g}s "
            f"({e.args[0]}); check --bootstrap-servers / {BOOTSTRAP_ENV}"
        ) from None


def _list_offsets(
    admin: AdminClient,
    partitions: list[TopicPartition],
    spec: Any,
    timeout: float,
    committed: bool = False,
) -> dict[tuple[str, int], int]:
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets(
        {tp: spec for tp in partitions}, isolation_level=level, request_timeout=timeout
    )
    return {(tp.topic, tp.partition): int(f.result(timeout=timeout).offset) for tp, f in futures.items()}


_EARLIEST = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]


def _offset(message: Message) -> int:
    offset = message.offset()
    assert offset is not None  # consumed messages and EOF events always carry one
    return offset


class RangeReader:
    """Iterates a range as batches of messages, all with ``from <= offset < until``.

    After iteration, ``messages`` says how many were delivered. A range that
    Kafka no longer fully holds raises :class:`DataLoss`; no progress for
    ``idle_timeout`` seconds raises :class:`KafkaReadError`.
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        offset_range: OffsetRange,
        batch_size: int = READ_BATCH,
        idle_timeout: float = IDLE_TIMEOUT_SECONDS,
    ) -> None:
        self.conf = reader_config(conf)
        self.range = offset_range
        self.batch_size = batch_size
        self.idle_timeout = idle_timeout
        self.messages = 0

    def __iter__(self) -> Iterator[list[Message]]:
        r = self.range
        if r.size == 0:
            return
        consumer = Consumer(self.conf)
        try:
            consumer.assign([TopicPartition(r.topic, r.partition, r.from_offset)])
            yield from self._batches(consumer)
        finally:
            consumer.close()

    def _batches(self, consumer: Consumer) -> Iterator[list[Message]]:
        r = self.range
        next_offset = r.from_offset
        last_progress = time.monotonic()
        while next_offset < r.until_offset:
            # One more than the rest of the range: then consume() returns at once
            # whether the partition ends at `until` (EOF event) or goes on.
            wanted = min(self.batch_size, r.until_offset - next_offset + 1)
            batch = consumer.consume(wanted, 1.0)
            if not batch:
                if time.monotonic() - last_progress > self.idle_timeout:
                    raise KafkaReadError(
                        f"no data from Kafka at {_servers(self.conf)} for {self.idle_timeout:g}s while "
                        f"reading {r.topic!r} partition {r.partition} at offset {next_offset} "
                        f"(range {r.from_offset} -> {r.until_offset}); is the broker up, "
                        "or was the partition truncated?"
                    )
                continue
            last_progress = time.monotonic()
            reached_end = False
            if any(m.error() is not None for m in batch):
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
                    else:
                        self._raise_for(error, next_offset)
                batch = good
            if batch:
                if _offset(batch[-1]) >= r.until_offset:
                    batch = [m for m in batch if _offset(m) < r.until_offset]
                    reached_end = True
                if batch:
                    next_offset = _offset(batch[-1]) + 1
                    self.messages += len(batch)
                    yield batch
            if reached_end:
                return

    def _raise_for(self, error: KafkaError, next_offset: int) -> None:
        r = self.range
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            raise DataLoss(
                f"{r.topic!r} partition {r.partition}: offset {next_offset} is no longer in Kafka "
                f"(range {r.from_offset} -> {r.until_offset}); messages aged out before they "
                f"were counted ({error.str()})"
            )
        if error.fatal() or not error.retriable():
            raise KafkaReadError(
                f"reading {r.topic!r} partition {r.partition} at offset {next_offset} failed: {error.str()}"
            )
