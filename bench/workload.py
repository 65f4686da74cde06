"""The workload: N keyed messages over P partitions, sized to fit the test broker.

The test broker keeps at most 5 MiB (and 100,000 message sets) per
partition and drops older data, so a workload that did not fit would lose
its oldest messages before they were read. :func:`plan_workload` picks the
largest value size (up to the one asked for) that keeps every partition
under ``fill`` of that limit, or says the workload cannot fit at all;
:func:`produce` then checks that every message is still there.

Messages are produced partition by partition from several processes, in
batches of up to 10,000 records, like a busy producer would send them. The
test broker answers a fetch with one producer batch per partition, so the
batch size sets how much one fetch returns, for the job and for the limit
alike.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import Producer

from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config

BROKER_PARTITION_BYTES = 5 * 1024 * 1024  # what the test broker keeps per partition
KEY_BYTES = 10  # b"user-12345"
RECORD_OVERHEAD_BYTES = 12  # a record's varints, attributes and header count beyond key and value
BATCH_RECORDS = 10_000  # librdkafka's batch.num.messages
BATCH_OVERHEAD_BYTES = 61  # record batch header
MIN_VALUE_BYTES = 1
PRODUCE_TIMEOUT_SECONDS = 600.0

_FIELDS = ("view", "click", "cart", "buy", "search", "login", "logout", "share")


@dataclass(frozen=True)
class Workload:
    topic: str
    messages: int
    partitions: int
    value_bytes: int

    def counts(self) -> list[int]:
        """Messages per partition: as even as possible."""
        base, extra = divmod(self.messages, self.partitions)
        return [base + (1 if p < extra else 0) for p in range(self.partitions)]

    @property
    def record_bytes(self) -> int:
        return KEY_BYTES + self.value_bytes + RECORD_OVERHEAD_BYTES

    @property
    def partition_bytes(self) -> int:
        """Estimated bytes the fullest partition holds on the broker."""
        most = max(self.counts())
        return most * self.record_bytes + -(-most // BATCH_RECORDS) * BATCH_OVERHEAD_BYTES

    def describe(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "messages": self.messages,
            "partitions": self.partitions,
            "key_bytes": KEY_BYTES,
            "value_bytes": self.value_bytes,
            "partition_bytes": self.partition_bytes,
            "partition_fill": round(self.partition_bytes / BROKER_PARTITION_BYTES, 3),
        }


def fit_value_bytes(messages: int, partitions: int, wanted: int, fill: float) -> int | None:
    """The largest value size up to ``wanted`` that keeps each partition under ``fill`` × 5 MiB."""
    most = -(-messages // partitions)
    budget = fill * BROKER_PARTITION_BYTES - -(-most // BATCH_RECORDS) * BATCH_OVERHEAD_BYTES
    size = min(wanted, int(budget // most) - KEY_BYTES - RECORD_OVERHEAD_BYTES)
    return size if size >= MIN_VALUE_BYTES else None


def plan_workload(topic: str, messages: int, partitions: int, wanted: int, fill: float) -> Workload:
    size = fit_value_bytes(messages, partitions, wanted, fill)
    if size is None:
        raise ValueError(
            f"{messages} messages over {partitions} partitions cannot fit the test broker's "
            f"5 MiB per partition (even with {MIN_VALUE_BYTES}-byte values); use more partitions"
        )
    return Workload(topic, messages, partitions, size)


def event_values(size: int, count: int = 1024) -> list[bytes]:
    """``count`` distinct JSON-like event payloads cut or padded to ``size`` bytes."""
    values = []
    for i in range(count):
        text = (
            f'{{"user":"user-{(i * 7919) % 100_000:05d}","event":"{_FIELDS[i % len(_FIELDS)]}",'
            f'"ts":{1_700_000_000_000 + i * 37},"page":"/item/{(i * 104_729) % 10_000}",'
            f'"session":"{(i * 2_654_435_761) % 2**32:08x}","amount":{(i * 31) % 1000}.{i % 100:02d}}}'
        )
        values.append(text.encode().ljust(size, b" ")[:size])
    return values


def _produce_share(bootstrap: str, topic: str, share: Sequence[tuple[int, int]], value_bytes: int) -> int:
    """Produce ``count`` messages to each ``(partition, count)``; returns messages not delivered."""
    producer = Producer(
        {
            **client_config(bootstrap),
            "linger.ms": 100,
            "batch.num.messages": BATCH_RECORDS,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "enable.idempotence": True,
        }
    )
    values = event_values(value_bytes)
    keys = [b"user-%05d" % k for k in range(100_000)]
    produce = producer.produce
    for partition, count in share:
        for i in range(count):
            value, key = values[i & 1023], keys[(i * 7919) % 100_000]
            while True:
                try:
                    produce(topic, value, key, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
    return int(producer.flush(PRODUCE_TIMEOUT_SECONDS))


def produce(bootstrap: str, workload: Workload, processes: int = 2) -> float:
    """Produce the workload from ``processes`` processes; returns seconds taken.

    Raises if any message is missing afterwards (undelivered, or aged out of
    the test broker because the workload was too big for it).
    """
    counts = workload.counts()
    shares = [[(p, counts[p]) for p in range(i, workload.partitions, processes)] for i in range(processes)]
    shares = [s for s in shares if s]
    started = time.monotonic()
    from bench.limit import processes_context

    context = processes_context()
    with context.Pool(len(shares)) as pool:
        undelivered = pool.starmap(
            _produce_share,
            [(bootstrap, workload.topic, share, workload.value_bytes) for share in shares],
        )
    elapsed = time.monotonic() - started
    if any(undelivered):
        raise RuntimeError(f"{sum(undelivered)} messages to {workload.topic!r} were not delivered")
    check_all_there(bootstrap, workload.topic, counts)
    return elapsed


def check_all_there(bootstrap: str, topic: str, counts: Sequence[int]) -> None:
    """Every partition holds exactly ``counts[p]`` messages from offset 0: nothing aged out."""
    marks = fetch_watermarks(client_config(bootstrap), [topic])
    found = {m.partition: (m.low, m.high) for m in marks}
    wrong = {p: found.get(p) for p, n in enumerate(counts) if found.get(p) != (0, n)}
    if wrong:
        raise RuntimeError(
            f"topic {topic!r}: partitions do not hold the messages produced (partition: (low, high)): "
            f"{dict(list(wrong.items())[:5])}; messages aged out of the test broker or were lost"
        )
