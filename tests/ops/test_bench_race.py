"""``python -m bench race`` keeps working: a tiny race on the real broker checks and times every side.

It runs in its own process: Spark's Kafka connector must be on ``spark.jars`` when the JVM
starts, which a shared test session cannot give (about a minute: Kafka, a SparkSession, 8 small
runs). Skips in one line when Kafka's or the connector's jars cannot be fetched; under
``CI=true`` it fails instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.race_sides import GRAIN_SIDES, GRAINS, SIDES, SPARK_STREAM, TX_PER_RANGE, TX_STREAM
from bench.spark_kafka_jars import spark_kafka_jars
from tests.helpers.real_kafka_fixture import jars_or_skip
from txstore.testing.real_kafka import kafka_jars

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def test_a_tiny_race_checks_and_times_every_side(database_url: str, tmp_path: Path) -> None:
    jars_or_skip(lambda: (kafka_jars(), spark_kafka_jars()), "bench race", "bench race: jars not available")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "race",
            "--messages=3000",
            "--partitions=3",
            "--keys=7",
            "--rounds=1",
            "--warm-up-messages=0",
            "--name=race-smoke",
            f"--output-dir={tmp_path}",
            f"--database-url={database_url}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "race-smoke.json").read_text())
    assert doc["spark_kafka_connector"]["jars"]
    for grain in GRAINS:
        assert set(doc["runs"][grain]) == set(GRAIN_SIDES[grain])
        for side in GRAIN_SIDES[grain]:
            [run] = doc["runs"][grain][side]
            assert run["messages_per_second"] > 0
            assert run["load_1min"] >= 0
            low, high = doc["messages_per_second_spread"][grain][side]
            assert low == high == run["messages_per_second"]  # one round: its own spread
        txstore_sides = [s for s in GRAIN_SIDES[grain] if s.startswith("txstore")]
        wanted = {f"{ours} / {theirs}" for ours in txstore_sides for theirs in SIDES[:2]}
        if TX_STREAM in GRAIN_SIDES[grain]:
            wanted.add(f"{TX_STREAM} / {TX_PER_RANGE}")
        assert set(doc["ratios"][grain]) == wanted
        for ratio in doc["ratios"][grain].values():
            assert ratio["lowest"] == ratio["median"] == ratio["highest"] > 0
    # The stream is checked exact like every side (a wrong total voids the race), and says
    # where its time went: Spark's phases of its micro-batches.
    [stream] = doc["runs"]["total"][TX_STREAM]
    assert stream["micro_batches"] >= 1 and stream["addBatch_ms"] > 0
    # Both streams also say how long they took to start, and the parts add up to no more than
    # the side's own time (which also reads the counts back and deletes the checkpoint).
    for side in (TX_STREAM, SPARK_STREAM):
        [run] = doc["runs"]["total"][side]
        parts = ("start_ms", "to_first_trigger_ms", "triggerExecution_ms", "after_last_trigger_ms")
        assert run["start_ms"] > 0 and run["triggerExecution_ms"] > 0, run
        assert 0 < sum(run[p] for p in parts) <= run["wall_ms"] + 5, run
    assert set(doc["guarantees"]) == set(SIDES)
    assert "txstore stream / txstore per-range" in done.stdout
