"""What real Apache Kafka showed (tests/test_real_kafka.py), pinned down on the mock broker.

Right after a broker restarts, its metadata already names each partition's new
leader epoch while the partition has not taken it up: ListOffsets answers
UNKNOWN_LEADER_EPOCH for a moment (about half of the real restarts tried, for
under a second). librdkafka's admin client fails the partition at once where
Kafka's own retries, so planning failed a ``--once`` job saying Kafka "did not
answer within 15s". The mock answers the same errors on demand, every time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError

from tests.conftest import produce
from txstore.core.errors import KafkaUnavailable
from txstore.kafka.client import client_config, fetch_watermarks, offsets_for_timestamp
from txstore.testing.mock_kafka import MockKafkaCluster

LIST_OFFSETS_API = 2


def test_list_offsets_during_a_leadership_move_is_asked_again_within_the_timeout(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 2})
    moving = [
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
    ]
    conf = client_config(kafka.bootstrap_servers)
    kafka.push_request_errors(LIST_OFFSETS_API, *moving)
    try:
        marks = fetch_watermarks(conf, [topic])
        kafka.push_request_errors(LIST_OFFSETS_API, KafkaError.UNKNOWN_LEADER_EPOCH)
        found = offsets_for_timestamp(conf, [(topic, 0)], 0)
    finally:
        kafka.clear_request_errors(LIST_OFFSETS_API)
    assert {m.partition: (m.low, m.high) for m in marks} == {0: (0, 3), 1: (0, 2)}
    assert found == {(topic, 0): -1}  # answered (the mock answers -1 to every time lookup)


def test_other_list_offsets_errors_still_fail_at_once(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    kafka.push_request_errors(LIST_OFFSETS_API, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailable, match="Topic authorization failed"):
            fetch_watermarks(client_config(kafka.bootstrap_servers), [topic])
    finally:
        kafka.clear_request_errors(LIST_OFFSETS_API)
    assert time.monotonic() - started < 5


def test_a_leadership_that_never_settles_fails_once_the_timeout_is_spent(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    kafka.push_request_errors(LIST_OFFSETS_API, *[KafkaError.UNKNOWN_LEADER_EPOCH] * 500)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailable, match="Leader epoch is newer than broker epoch"):
            fetch_watermarks(client_config(kafka.bootstrap_servers), [topic], timeout=1.0)
    finally:
        kafka.clear_request_errors(LIST_OFFSETS_API)
    assert 0.8 < time.monotonic() - started < 6
