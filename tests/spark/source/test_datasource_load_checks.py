"""``spark.read.format("txstore")``: explicit offsets outside the log fail at ``load()``, in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import produce
from txstore.spark.ranges.tasks import spark_failure_reason
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark


def test_a_starting_offset_beyond_the_log_end_fails_at_load_with_its_one_line(
    txstore_spark: Any, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 5, 1: 5})
    reader = (
        txstore_spark.read.format("txstore")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {"0": 9}}))
    )
    with pytest.raises(Exception) as caught:
        reader.load()  # not at the first action
    assert spark_failure_reason(caught.value) == (
        f"OffsetOutOfLog: option startingOffsets: topic {topic!r} partition 0 offset 9 is beyond the "
        "log-end offset 5; use an offset from 0 to 5, or -1 (latest)"
    )
    # Offsets inside the log still load, and read from there.
    inside = reader.option("startingOffsets", json.dumps({topic: {"0": 3}})).load()
    assert sorted((r.partition, r.offset) for r in inside.select("partition", "offset").collect()) == [
        (0, 3),
        (0, 4),
        *((1, o) for o in range(5)),
    ]
