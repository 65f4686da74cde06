"""The Kafka-protocol test broker as a process: `python -m txstore.testing.mock_kafka`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.conftest import produce
from txstore.kafka import client_config, fetch_watermarks


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
