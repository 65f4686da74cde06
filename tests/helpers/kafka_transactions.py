"""Transactional producers for the tests: messages in open, committed and aborted transactions.

:func:`transactional` makes a producer with its ``transactional.id`` and its transactions
initialised, on the mock broker or real Kafka; :func:`in_transaction` produces into its open
transaction, flushed to the log, before the test commits or aborts it (``TX_TIMEOUT`` bounds
each call). Only real Kafka keeps the last stable offset below an open transaction
(tests/kafka/test_real_kafka.py); the mock answers with the high watermark
(tests/kafka/test_offset_lifecycle.py). :func:`first_transaction` opens a producer's first
transaction on the mock, whose producer IDs are drawn at random and sometimes drawn twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import RealKafkaCluster

TX_TIMEOUT = 30.0
REDRAWS = 3  # producers tried for one first transaction (see first_transaction)
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


def first_transaction(
    broker: MockKafkaCluster | RealKafkaCluster | str, name: str, fill: Callable[[Producer], None]
) -> Producer:
    """A producer from :func:`transactional` whose first transaction is begun and handed to
    ``fill`` (which may commit it).

    librdkafka's mock broker draws every producer ID at random, 1,000 times a number from 1 to
    900,000 (``rd_kafka_mock_pid_new``), idempotent producers included, so a test session's
    thousand-odd producers sometimes draw one twice. The mock then refuses the later producer's
    first partition added to a transaction (INVALID_PRODUCER_ID_MAPPING: its lookup finds the
    earlier holder of the ID) before anything is written, and its messages are purged. Such a
    producer is dropped and another draws again, at most ``REDRAWS`` producers in all; any other
    failure is raised as it is. Real Kafka hands out producer IDs in order and never refuses so.
    """
    for attempt in range(1, REDRAWS + 1):
        producer = transactional(broker, name)
        producer.begin_transaction()
        try:
            fill(producer)
            return producer
        except KafkaException as e:
            why = _why_it_ended(producer, e.args[0])
            if attempt == REDRAWS or why.code() != KafkaError.INVALID_PRODUCER_ID_MAPPING:
                raise KafkaException(why) from e
    raise AssertionError("unreachable")


def _why_it_ended(producer: Producer, error: KafkaError) -> KafkaError:
    """What ended the producer's transaction with ``error``: a purged message's error names only
    the purge, and the commit, which cannot succeed then, raises the cause."""
    if error.code() != KafkaError._PURGE_QUEUE:
        return error
    try:
        producer.commit_transaction(TX_TIMEOUT)
    except KafkaException as e:
        return e.args[0]  # type: ignore[no-any-return]
    return error


def in_transaction(producer: Producer, topic: str, counts: dict[int, int], value: bytes = b"tx") -> None:
    """Produce ``counts[partition]`` messages in the producer's open transaction, flushed to the
    log; a message not written raises its error."""
    failed: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    for partition, n in counts.items():
        for _ in range(n):
            producer.produce(topic, value=value, key=b"k", partition=partition, on_delivery=on_delivery)
    assert producer.flush(TX_TIMEOUT) == 0
    if failed:
        raise KafkaException(failed[0])
