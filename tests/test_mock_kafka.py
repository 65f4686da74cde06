"""The Kafka-protocol test broker as a process: `python -m txstore.testing.mock_kafka`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import produce
from txstore.kafka import client_config, fetch_watermarks
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
    # Otherwise the kernel may give the free port to a client, librdkafka cannot listen on it
    # again, and it aborts the process that owns the broker (seen in a long chaos run).
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
