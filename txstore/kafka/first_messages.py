"""The first message at or after an offset in many partitions, read with one consumer.

What ``txstore status --check`` and ``txstore reset`` look at in every partition of a job (the
message at the last counted offset, the first one not counted): one read per partition cost about
45 ms, so 46 s at 1,024 partitions; one assignment of them all costs about one read.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Message, TopicPartition

from txstore.kafka.client_settings import reader_config
from txstore.kafka.reader import own_consumer

Key = tuple[str, int]
"""A partition: topic, partition."""


def first_messages(conf: Mapping[str, Any], starts: Mapping[Key, int], timeout: float) -> dict[Key, Message]:
    """What each partition in ``starts`` gives first from its offset, read committed: its first
    message, its end (an error message, ``_PARTITION_EOF``), or another error (out of range, ...),
    for the caller to judge. A partition missing from the answer gave nothing while no partition
    answered for ``timeout`` seconds.

    Steps: assign every partition at its offset to one consumer of its own (not the pool's:
    paused partitions stay with it); consume until each has given something, asking for as many
    events as partitions are pending (each gives at least one, so a call returns once they have,
    not after its whole second: a caught-up partition gives one message and its end); pause a
    partition once it has answered; close the consumer."""
    answers: dict[Key, Message] = {}
    if not starts:
        return answers
    consumer = own_consumer(reader_config(conf))
    try:
        consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in starts.items()])
        pending = set(starts)
        progress = time.monotonic()
        while pending and time.monotonic() - progress <= timeout:
            answered = []
            for m in consumer.consume(min(len(pending), 10_000), min(1.0, timeout)):
                key = (str(m.topic()), int(m.partition() or 0))
                if key in pending:
                    answers[key] = m
                    pending.discard(key)
                    answered.append(TopicPartition(*key))
            if answered:
                progress = time.monotonic()
                consumer.pause(answered)
    finally:
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.close()
    return answers
