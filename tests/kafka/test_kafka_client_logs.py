"""librdkafka's own log lines go through Python logging, at DEBUG, for every client txstore makes."""

from __future__ import annotations

import logging
import pickle
import time

import pytest
from confluent_kafka import Consumer, Producer

from txstore.core.errors import KafkaUnavailable
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import CLIENT_LOG, client_config, reader_config

DOWN = "127.0.0.1:1"  # nothing listens: every connection attempt is refused


def _serve(client: Consumer | Producer, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        client.poll(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["consumer", "producer"])
def test_a_client_made_from_client_config_logs_connection_failures_at_debug_not_on_stderr(
    kind: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOG.name)
    conf = client_config(DOWN)
    if kind == "consumer":
        client: Consumer | Producer = Consumer(reader_config(conf))
    else:
        client = Producer(dict(conf))
    _serve(client, 2.0)
    if kind == "consumer":
        client.close()  # type: ignore[union-attr]
    else:
        client.flush(0)  # type: ignore[union-attr]
    ours = [r for r in caplog.records if r.name == CLIENT_LOG.name]
    assert any("Connection refused" in r.getMessage() for r in ours)
    assert {r.levelno for r in ours} == {logging.DEBUG}
    assert "Connection refused" not in capfd.readouterr().err


def test_an_admin_call_to_kafka_down_raises_one_line_and_logs_nothing_above_debug(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOG.name)
    with pytest.raises(KafkaUnavailable, match=r"^Kafka at 127\.0\.0\.1:1 did not answer a metadata request"):
        fetch_watermarks(client_config(DOWN), ["t"], timeout=1.0)
    ours = [r for r in caplog.records if r.name == CLIENT_LOG.name]
    assert ours and {r.levelno for r in ours} == {logging.DEBUG}
    assert "Connection refused" not in capfd.readouterr().err


def test_the_client_setting_survives_pickling_to_a_spark_task_and_keys_pools_the_same() -> None:
    conf = client_config(DOWN)
    again = pickle.loads(pickle.dumps(conf))
    assert again == conf
    assert repr(again["logger"]) == repr(conf["logger"]) == "<ClientLog txstore.kafka.client>"
    assert again["logger"].logger is CLIENT_LOG
