"""The Kafka-protocol test broker as a process: `python -m txstore.testing.mock_kafka`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from tests.conftest import produce, produce_in_transactions, send
from tests.helpers.counting import log_ends
from tests.helpers.kafka_transactions import REDRAWS, TX_TIMEOUT, first_transaction, in_transaction
from txstore.core.ranges import OffsetRange
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader
from txstore.testing.mock_kafka import MockKafkaCluster


def test_the_broker_process_prints_its_address_serves_clients_and_stops_on_sigterm() -> None:
    broker = subprocess.Popen(
        [sys.executable, "-m", "txstore.testing.mock_kafka", "--topic", "orders:3", "--topic", "audit"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert broker.stdout is not None
        bootstrap = broker.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:")
        produce(bootstrap, "orders", {0: 3, 2: 5})
        marks = fetch_watermarks(client_config(bootstrap), ["orders", "audit"])
        assert [(m.topic, m.partition, m.high) for m in marks] == [
            ("orders", 0, 3),
            ("orders", 1, 0),
            ("orders", 2, 5),
            ("audit", 0, 0),
            ("audit", 1, 0),
            ("audit", 2, 0),
            ("audit", 3, 0),
        ]
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=30) == 0
    finally:
        if broker.poll() is None:
            os.killpg(broker.pid, signal.SIGKILL)
            broker.wait(timeout=30)


def test_a_downed_brokers_port_is_kept_from_outgoing_connections_until_it_is_up() -> None:
    # Otherwise the kernel may give the port to a client in the moment between librdkafka
    # closing the listener and binding a new one; that bind fails and librdkafka aborts the
    # process that owns the broker. (The long chaos run's abort was a fork holding the old
    # listener: the test at the end of this file.)
    reserved = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
    if not os.access(reserved, os.W_OK):
        pytest.skip(f"{reserved} is not writable here")

    def reserved_ports() -> set[str]:
        return set(filter(None, reserved.read_text().strip().split(",")))

    with MockKafkaCluster() as kafka:
        port = kafka.bootstrap_servers.rsplit(":", 1)[1]
        kafka.set_broker_down(1)
        assert port in reserved_ports()
        kafka.set_broker_up(1)
        assert port not in reserved_ports()
        produce(kafka.bootstrap_servers, "after-up", {0: 2})
        marks = fetch_watermarks(client_config(kafka.bootstrap_servers), ["after-up"])
        assert {m.partition: m.high for m in marks}[0] == 2


@pytest.mark.slow
def test_a_broker_with_a_round_trip_time_answers_that_late_and_then_at_once_again() -> None:
    with MockKafkaCluster() as kafka:
        produce(kafka.bootstrap_servers, "rtt", {0: 2})
        conf = client_config(kafka.bootstrap_servers)
        kafka.set_broker_rtt(1, 1500)
        started = time.monotonic()
        marks = fetch_watermarks(conf, ["rtt"])
        late = time.monotonic() - started
        kafka.set_broker_rtt(1, 0)
        started = time.monotonic()
        assert fetch_watermarks(conf, ["rtt"]) == marks
        assert {m.partition: m.high for m in marks}[0] == 2
        assert late >= 1.5 > time.monotonic() - started


# Run in a process of its own: on failure librdkafka aborts the process that owns the broker.
_DOWN_WHILE_SPAWNING = """
import subprocess, sys, threading, time
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.testing.mock_kafka import {cls}
from tests.conftest import produce, produce_in_transactions, send

with {cls}() as kafka:
    stop, spawned = threading.Event(), [0]

    def spawn():
        while not stop.is_set():
            subprocess.run(["true"], check=True, timeout=30)
            spawned[0] += 1  # a race between the two threads may lose one: only > 0 counts

    spawners = [threading.Thread(target=spawn) for _ in range(2)]
    for spawner in spawners:
        spawner.start()
    flips, deadline = 0, time.monotonic() + 20
    try:
        while flips < 1500 and time.monotonic() < deadline:
            kafka.set_broker_down(1)
            kafka.set_broker_up(1)
            flips += 1
    finally:
        stop.set()
        for spawner in spawners:
            spawner.join(timeout=30)
    produce(kafka.bootstrap_servers, "after-flips", {{0: 2}})
    marks = fetch_watermarks(client_config(kafka.bootstrap_servers), ["after-flips"])
    print(flips, spawned[0], {{m.partition: m.high for m in marks}}[0])
"""


@pytest.mark.slow
def test_taking_the_broker_down_while_its_owner_starts_processes_does_not_abort_the_owner() -> None:
    # A child forked at that moment holds the old listener: librdkafka's rebind of the port
    # failed and it aborted the owner (exit 134; the CI chaos subset, a driver started while
    # the broker went down). The broker now lives in a child process that never forks.
    result = subprocess.run(
        [sys.executable, "-c", _DOWN_WHILE_SPAWNING.format(cls="MockKafkaCluster")],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    flips, spawned, high = map(int, result.stdout.split())
    assert flips >= 100 and spawned > 0 and high == 2


@pytest.mark.slow
def test_a_call_the_broker_process_does_not_answer_fails_within_its_timeout_and_stops_it() -> None:
    with MockKafkaCluster(timeout=3) as kafka:
        assert kafka.pid is not None
        os.kill(kafka.pid, signal.SIGSTOP)  # alive, answering nothing
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"no answer to create_topic within 3 s; stopped it"):
            kafka.create_topic("never")
        assert time.monotonic() - started < 10
        with pytest.raises(RuntimeError, match=r"exited \(-9\) (before|during) create_topic"):
            kafka.create_topic("never")


PRODUCE_API = 0
ADD_PARTITIONS_TO_TXN_API = 24


@contextlib.contextmanager
def refusing(kafka: MockKafkaCluster, api: int, *errors: int) -> Iterator[None]:
    """The mock answers the next ``api`` requests with ``errors``, one each (as it answers a
    producer ID drawn twice, for INVALID_PRODUCER_ID_MAPPING)."""
    kafka.push_request_errors(api, *errors)
    try:
        yield
    finally:
        kafka.clear_request_errors(api)


def offsets_in(kafka: MockKafkaCluster, r: OffsetRange) -> list[int]:
    reader = RangeReader(client_config(kafka.bootstrap_servers), r)
    return [m.offset() for batch in reader for m in batch]


def test_transactions_refused_for_a_producer_id_drawn_twice_are_written_once_by_another_producer(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """The mock draws producer IDs at random and refuses a transaction whose ID an earlier producer
    drew (a CI run met it after a thousand producers): the refusal is injected here, as the mock
    answers it, and the messages are written once, by another producer."""
    topic = new_topic(1)
    with refusing(kafka, ADD_PARTITIONS_TO_TXN_API, KafkaError.INVALID_PRODUCER_ID_MAPPING):
        produce_in_transactions(
            kafka.bootstrap_servers, topic, transactions=2, per_transaction=3, partitions=1
        )
    assert log_ends(kafka, topic) == {0: 8}  # 0-2, marker, 4-6, marker
    assert offsets_in(kafka, OffsetRange(topic, 0, 0, 8)) == [0, 1, 2, 4, 5, 6]


def test_messages_refused_for_an_idempotent_producer_id_drawn_twice_are_sent_once_by_another_producer(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """An idempotent producer that drew an earlier transactional producer's ID has every message
    refused by the mock, unwritten (injected here as the mock answers it)."""
    topic = new_topic(1)
    with refusing(kafka, PRODUCE_API, KafkaError.INVALID_PRODUCER_ID_MAPPING):
        assert send(kafka.bootstrap_servers, topic, [(0, b"k", b"v", None)] * 3) == 3
    assert offsets_in(kafka, OffsetRange(topic, 0, 0, 3)) == [0, 1, 2]
    assert log_ends(kafka, topic) == {0: 3}


def test_an_open_first_transaction_refused_for_a_producer_id_drawn_twice_is_opened_by_another_producer(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    with refusing(kafka, ADD_PARTITIONS_TO_TXN_API, KafkaError.INVALID_PRODUCER_ID_MAPPING):
        producer = first_transaction(kafka, f"twice-{topic}", lambda p: in_transaction(p, topic, {0: 3}))
    producer.commit_transaction(TX_TIMEOUT)
    assert offsets_in(kafka, OffsetRange(topic, 0, 0, 4)) == [0, 1, 2]


@pytest.mark.parametrize(
    ("refusals", "raised"),
    [
        ([KafkaError.TOPIC_AUTHORIZATION_FAILED], KafkaError.TOPIC_AUTHORIZATION_FAILED),
        ([KafkaError.INVALID_PRODUCER_ID_MAPPING] * REDRAWS, KafkaError.INVALID_PRODUCER_ID_MAPPING),
    ],
    ids=["another-reason", "drawn-twice-every-try"],
)
def test_a_first_transaction_refused_for_another_reason_or_in_every_try_raises_the_refusal(
    kafka: MockKafkaCluster, new_topic: Callable[..., str], refusals: list[int], raised: int
) -> None:
    topic = new_topic(1)
    with refusing(kafka, ADD_PARTITIONS_TO_TXN_API, *refusals), pytest.raises(KafkaException) as caught:
        first_transaction(kafka, f"refused-{topic}", lambda p: in_transaction(p, topic, {0: 1}))
    assert caught.value.args[0].code() == raised
    assert log_ends(kafka, topic) == {0: 0}
