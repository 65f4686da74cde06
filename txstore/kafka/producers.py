"""The process's Kafka producers for publishing, and what Kafka's refusals of a message mean.

The outbox publisher (:mod:`txstore.postgres.outbox`) sends each job's committed results with
these:

- :func:`producer_config`: reliable settings (idempotence, ``acks=all``, a delivery timeout)
  that a user's ``--kafka-option`` cannot weaken, and :func:`single_message_config` for a
  message sent again in a record batch of its own;
- :func:`shared_producer`: one producer per process and configuration, reused across batches,
  with the errors librdkafka reported to it (:func:`errors_of`); dropped after a fatal error or a
  topic's refusal (:func:`drop_producer`) and flushed and closed at shutdown
  (:func:`close_producers`);
- :func:`record_batch_bytes`: a message's record batch as Kafka counts it against a topic's
  ``max.message.bytes``;
- :func:`set_aside_reason`: which refusals no retry can change (the row is set aside, with the
  reason and what to run), and the lines for a message too large (:func:`too_large_reason`,
  :func:`too_large_for_producer_reason`).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, Producer

_ProducerKey = tuple[tuple[str, str], ...]
_producers: dict[_ProducerKey, Producer] = {}
_producer_errors: dict[_ProducerKey, list[KafkaError]] = {}  # what each one's error_cb was given
_producers_lock = threading.Lock()


def producer_config(
    base: Mapping[str, Any], timeout: float, batch_bytes: int | None = None
) -> dict[str, Any]:
    """Reliable producer settings; a user's ``--kafka-option`` may not weaken them.

    A topic missing from the cluster fails its messages after half the timeout
    (``topic.metadata.propagation.max.ms``), before they time out, so they are
    set aside as "topic does not exist" rather than retried forever.
    ``batch_bytes`` (a job's ``--publish-max-bytes``): the producer's ``batch.size``, so that
    messages sized for a topic are not packed into record batches bigger than it takes.
    """
    return {
        "linger.ms": 5,
        "topic.metadata.propagation.max.ms": int(timeout * 500),
        **({"batch.size": batch_bytes} if batch_bytes is not None else {}),
        **base,
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": int(timeout * 1000),
    }


def single_message_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with every message in a record batch of its own: how rows refused as too large
    in a batch are sent again, so that each meets the topic's limit on its own size."""
    return {**conf, "batch.num.messages": 1, "linger.ms": 0}


# Kafka's record batch (magic 2) without records: base offset, length, leader epoch, magic, CRC,
# attributes, last offset delta, first and max timestamps, producer id and epoch, base sequence,
# record count (DefaultRecordBatch.RECORD_BATCH_OVERHEAD).
_BATCH_OVERHEAD = 61


def _varint_bytes(value: int) -> int:
    """The length of ``value`` as Kafka's zigzag varint."""
    unsigned = (value << 1) ^ (value >> 63)
    length = 1
    while unsigned >= 0x80:
        unsigned >>= 7
        length += 1
    return length


def _sized(data: str | bytes | None) -> int:
    """A varint length (-1: null) and the bytes (a ``str`` as UTF-8)."""
    if data is None:
        return _varint_bytes(-1)
    raw = data.encode() if isinstance(data, str) else data
    return _varint_bytes(len(raw)) + len(raw)


def record_batch_bytes(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, str | bytes | None]]
) -> int:
    """The size of a record batch holding this one message, uncompressed, as Kafka counts it
    against a topic's ``max.message.bytes`` (DefaultRecordBatch.sizeInBytes): the batch header,
    then one record (attributes, timestamp and offset deltas of 0, key, value, headers)."""
    body = (
        1
        + _varint_bytes(0)
        + _varint_bytes(0)
        + _sized(key)
        + _sized(value)
        + _varint_bytes(len(headers))
        + sum(_sized(name) + _sized(data) for name, data in headers)
    )
    return _BATCH_OVERHEAD + _varint_bytes(body) + body


def shared_producer(conf: Mapping[str, Any]) -> Producer:
    """The process's producer for ``conf``, created on first use."""
    key = _producer_key(conf)
    with _producers_lock:
        producer = _producers.get(key)
        if producer is None:
            errors = _producer_errors[key] = []
            producer = _producers[key] = Producer({**conf, "error_cb": errors.append})
        return producer


def _producer_key(conf: Mapping[str, Any]) -> _ProducerKey:
    return tuple(sorted((k, str(v)) for k, v in conf.items()))


def errors_of(conf: Mapping[str, Any]) -> list[KafkaError]:
    """The errors librdkafka reported to the shared producer for ``conf``, oldest first."""
    with _producers_lock:
        return _producer_errors.setdefault(_producer_key(conf), [])


def drop_producer(producer: Producer) -> None:
    with _producers_lock:
        for key, p in list(_producers.items()):
            if p is producer:
                del _producers[key]
                _producer_errors.pop(key, None)


def close_producers(timeout: float = 10.0) -> None:
    """Flush and close every shared producer (at shutdown)."""
    with _producers_lock:
        producers = list(_producers.values())
        _producers.clear()
        _producer_errors.clear()
    for producer in producers:
        try:
            producer.flush(timeout)
        finally:
            producer.close()


atexit.register(close_producers)


_TOO_LARGE = "the message is too large for Kafka (raise the topic's max.message.bytes)"
SIZE_REFUSALS = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
_LATER_COMMITS = "a lower --publish-max-bytes splits only later commits"


def too_large_reason(topic: str, batch_bytes: int) -> str:
    """Why a message Kafka refused in a record batch of its own is set aside, and what sends it."""
    return (
        f"the message is too large for Kafka topic {topic!r}: on its own it is a record batch of "
        f"{batch_bytes} bytes, more than the topic's max.message.bytes; raise that to at least "
        f"{batch_bytes} ({_LATER_COMMITS})"
    )


def too_large_for_producer_reason(batch_bytes: int, conf: Mapping[str, Any]) -> str:
    """Why a message this producer refused before sending it (its ``message.max.bytes``) is set aside."""
    return (
        f"the message is too large for Kafka: it is a record batch of {batch_bytes} bytes, more than "
        f"this producer's message.max.bytes ({conf.get('message.max.bytes', 1_000_000)}); raise "
        f"--kafka-option message.max.bytes, and the topic's max.message.bytes if lower, to at least "
        f"{batch_bytes} ({_LATER_COMMITS})"
    )


_NO_TOPIC = "the topic does not exist (create it)"
_NOT_AUTHORIZED = "not authorized to write to the topic (grant the producer's principal WRITE on it)"
_SET_ASIDE: dict[int, str] = {
    KafkaError.MSG_SIZE_TOO_LARGE: _TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE: _TOO_LARGE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: _NOT_AUTHORIZED,
    KafkaError._UNKNOWN_TOPIC: _NO_TOPIC,
    KafkaError._UNKNOWN_PARTITION: _NO_TOPIC,
    # librdkafka retries it while the topic may still be propagating, and reports it
    # only once the topic stays missing (topic.metadata.propagation.max.ms).
    KafkaError.UNKNOWN_TOPIC_OR_PART: _NO_TOPIC,
    KafkaError.TOPIC_EXCEPTION: "the topic name is invalid",
    KafkaError.INVALID_RECORD: "Kafka refused the record as invalid",
    KafkaError.POLICY_VIOLATION: "the topic's policy refused the record",
    KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT: "the topic's message format cannot hold the record",
}
# Refusals by the topic, not the message: the producer is dropped so that the next
# attempt sees fresh metadata (librdkafka caches a topic's error until its next refresh).
TOPIC_REFUSALS = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_EXCEPTION,
    }
)


def set_aside_reason(code: int) -> str | None:
    """Why a message Kafka refused with librdkafka error ``code`` must be set aside, or None.

    Set aside: refusals of this message or its topic that no retry can
    change (too large, topic missing or invalid, not authorized, refused by
    policy); an operator fixes the cause and runs ``--retry-failed``. None
    (retry later, keep the row pending): everything else, such as timeouts,
    brokers down, leader elections, a full queue, and errors of the producer
    as a whole (fatal idempotence errors, cluster authorization), which
    would refuse every row alike.
    """
    return _SET_ASIDE.get(code)
