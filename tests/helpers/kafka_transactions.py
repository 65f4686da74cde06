"""Transactional producers for the tests: messages in open, committed and aborted transactions.

:func:`transactional` makes a producer with its ``transactional.id`` and its transactions
initialised, on the mock broker or real Kafka; :func:`in_transaction` produces into its open
transaction, flushed to the log, before the test commits or aborts it (``TX_TIMEOUT`` bounds
each call). Only real Kafka keeps the last stable offset below an open transaction
(tests/kafka/test_real_kafka.py); the mock answers with the high watermark
(tests/kafka/test_offset_lifecycle.py).
"""

from __future__ import annotations

import logging

from confluent_kafka import Producer

from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import RealKafkaCluster

TX_TIMEOUT = 30.0
CLIENT_LOG = logging.getLogger("tests.real_kafka.client")


def transactional(broker: MockKafkaCluster | RealKafkaCluster | str, name: str) -> Producer:
    """A producer with ``transactional.id`` ``name`` on ``broker`` (a cluster or its bootstrap
    servers), its transactions initialised."""
    bootstrap = broker if isinstance(broker, str) else broker.bootstrap_servers
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": name,
            "linger.ms": 5,
            # Its log lines go through logging (pytest captures them): one kept alive past the
            # session's broker (by a traceback) would otherwise print refused connections at the end.
            "logger": CLIENT_LOG,
        }
    )
    producer.init_transactions(TX_TIMEOUT)
    return producer


def in_transaction(producer: Producer, topic: str, counts: dict[int, int], value: bytes = b"tx") -> None:
    """Produce ``counts[partition]`` messages in the producer's open transaction, flushed to the log."""
    for partition, n in counts.items():
        for _ in range(n):
            producer.produce(topic, value=value, key=b"k", partition=partition)
    assert producer.flush(TX_TIMEOUT) == 0
