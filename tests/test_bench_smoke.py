"""The benchmark harness keeps working: a tiny run writes every measurement and the chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.run import main

pytestmark = pytest.mark.spark


def test_a_small_benchmark_run_writes_every_measurement_and_a_chart(
    spark: Any, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "--messages=2000",
            "--partitions=3",
            "--repeats=1",
            "--idle-batches=2",
            "--trickle-partitions=2,4",
            "--trickle-messages=8",
            "--trickle-rounds=2",
            "--sweep-partitions=1,2",
            "--sweep-messages=400,800",
            "--name=smoke",
            f"--output-dir={tmp_path}",
            f"--database-url={database_url}",
        ],
        spark=spark,
    )
    assert status == 0
    doc = json.loads((tmp_path / "smoke.json").read_text())

    assert doc["startup"]["session_seconds"] >= 0
    assert doc["main"]["workload"]["messages"] == 2000
    assert doc["main"]["workload"]["partition_fill"] < 1
    [pair] = doc["main"]["pairs"]
    assert pair["limit"]["messages"] == 2000
    assert pair["limit"]["readers"] == 2  # one per Spark core
    assert pair["job"]["messages"] == 2000
    assert pair["limit"]["messages_per_second"] > 0
    assert pair["job"]["messages_per_second"] > 0
    assert set(pair["job"]["breakdown_ms"]) == {"plan", "read_aggregate", "commit", "spark_and_other"}
    assert 0 <= pair["job"]["commit_share"] < 1
    assert pair["job"]["memory"]["python_workers"] >= 1
    assert pair["job"]["memory"]["python_worker_max_mib"] > 0
    assert pair["job"]["memory"]["jvm_mib"] > 0

    idle = doc["main"]["idle"]
    assert idle["batches"] == 2
    assert idle["spark_jobs_launched"] == 0

    assert set(doc["trickle"]) == {"2", "4"}
    assert doc["trickle"]["4"]["messages_per_batch"] == 8
    assert len(doc["trickle"]["4"]["wall_ms"]) == 2

    cells = {(c["workload"]["partitions"], c["workload"]["messages"]) for c in doc["sweep"]["cells"]}
    assert cells == {(1, 400), (1, 800), (2, 400), (2, 800)}
    assert doc["commit_latency_ms"]["ranges"] > 0
    assert doc["commit_latency_ms"]["p99"] >= doc["commit_latency_ms"]["p50"] > 0

    targets = {t["target"] for t in doc["targets"]}
    assert "throughput / raw parallel read rate" in targets
    assert "commit share of batch time" in targets
    assert "idle batch (ms)" in targets
    assert any(t.startswith("trickle --interval batch") for t in targets)
    assert any(t.startswith("time per message at") for t in targets)
    assert any(t.startswith("peak memory python_worker_max") for t in targets)

    png = (tmp_path / "smoke.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "throughput / raw parallel read rate" in capsys.readouterr().out
