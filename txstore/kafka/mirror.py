"""Mirror committed offsets to a Kafka consumer group, for Kafka tooling.

With ``--commit-to-kafka-group GROUP``, after each batch's database commits
the job also commits the same offsets to GROUP, so ``kafka-consumer-groups
--describe`` and lag monitors (Burrow and the like) see its progress. The
database stays the source of truth: the job never reads these offsets, and a
failure here is logged, never fatal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from txstore.core.ranges import TopicPartition as PartitionKey

log = logging.getLogger("txstore")
COMMIT_TIMEOUT_SECONDS = 10.0


class GroupOffsetMirror:
    """One consumer per job (never subscribed, so it never joins the group's rebalances)."""

    def __init__(self, conf: Mapping[str, Any], group: str, timeout: float = COMMIT_TIMEOUT_SECONDS) -> None:
        self.group = group
        self.timeout = timeout
        self._outcome: list[KafkaError | None] = []
        self._consumer = Consumer(
            {**conf, "group.id": group, "enable.auto.commit": False, "on_commit": self._on_commit}
        )

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        failed = [p for p in partitions if p.error is not None]
        self._outcome.append(error or (failed[0].error if failed else None))

    def publish(self, offsets: Mapping[PartitionKey, int]) -> bool:
        """Commit ``offsets`` to the group; log and return False on any failure or timeout."""
        if not offsets:
            return True
        self._outcome.clear()
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())], asynchronous=True
            )
            deadline = time.monotonic() + self.timeout
            while not self._outcome and time.monotonic() < deadline:
                self._consumer.poll(0.1)
        except Exception as e:  # never fatal: the database already has the truth
            log.warning(
                "could not mirror offsets to Kafka group %r: %s (the database stays correct)", self.group, e
            )
            return False
        error = self._outcome[0] if self._outcome else f"no answer within {self.timeout:g}s"
        if error is not None:
            log.warning(
                "could not mirror offsets to Kafka group %r: %s (the database stays correct)",
                self.group,
                error,
            )
            return False
        return True

    def close(self) -> None:
        self._consumer.close()
