"""The benchmark harness keeps working: a tiny run writes every measurement and the chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.partitions import RunningQuery
from bench.partitions import main as partitions_main
from bench.run import main
from bench.stream import PATHS, PER_RANGE
from bench.stream import main as stream_main
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.spark.source_format import register
from txstore.testing.real_kafka import RealKafkaCluster

pytestmark = pytest.mark.spark


def run_bench(spark: Any, database_url: str, output_dir: Path, name: str, *flags: str) -> Any:
    """``python -m bench.run FLAGS`` as ``name`` into ``output_dir`` (this session's Spark and
    database): what it wrote in ``NAME.json``, once it exited 0."""
    status = main(
        [*flags, f"--name={name}", f"--output-dir={output_dir}", f"--database-url={database_url}"],
        spark=spark,
    )
    assert status == 0
    return json.loads((output_dir / f"{name}.json").read_text())


def run_stream_bench(
    spark: Any, kafka: RealKafkaCluster, database_url: str, output: Path, *flags: str
) -> Any:
    """``python -m bench.stream --kafka=real FLAGS`` on ``kafka`` into ``output``: what it wrote,
    once it exited 0."""
    status = stream_main(
        ["--kafka=real", *flags, f"--output={output}", f"--database-url={database_url}"],
        spark=spark,
        kafka=kafka,
    )
    assert status == 0
    return json.loads(output.read_text())


def test_a_small_benchmark_run_writes_every_measurement_and_a_chart(
    spark: Any, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_bench(
        spark,
        database_url,
        tmp_path,
        "smoke",
        "--messages=2000",
        "--partitions=3",
        "--repeats=1",
        "--idle-batches=2",
        "--trickle-partitions=2,4",
        "--trickle-messages=8",
        "--trickle-rounds=2",
        "--sweep-partitions=1,2",
        "--sweep-messages=400,800",
        "--path-rounds=1",
        "--no-connect",
    )

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

    paths = doc["paths"]
    assert [r["messages"] for r in paths["runs"]["classic DataFrame"]] == [2000]
    assert [r["messages"] for r in paths["runs"]["classic DataFrame, all columns"]] == [2000]
    assert [r["messages"] for r in paths["runs"]["classic DataFrame, counted by Spark"]] == [2000]
    assert set(paths["messages_per_second_median"]) == {
        "classic per-range",
        "classic DataFrame",
        "classic DataFrame, counted by Spark",
        "classic DataFrame, all columns",
    }
    assert paths["ratios"]["classic DataFrame / classic per-range"]["median"] > 0
    assert paths["ratios"]["classic DataFrame, all columns / classic per-range"]["median"] > 0
    assert doc["connect_startup"] is None

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
    assert "DataFrame aggregate path / per-range count path" in targets
    assert "DataFrame aggregate path, all columns declared / per-range count path" in targets
    assert "DataFrame aggregate path, push_down_counts=False / per-range count path" in targets
    assert any(t.startswith("steady-state per-range count path / raw parallel read") for t in targets)

    png = (tmp_path / "smoke.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "throughput / raw parallel read rate" in capsys.readouterr().out


@pytest.mark.connect
def test_a_small_benchmark_run_puts_connect_beside_classic(
    spark: Any,
    spark_connect_server: Any,
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = run_bench(
        spark,
        database_url,
        tmp_path,
        "smoke-connect",
        "--messages=2000",
        "--partitions=3",
        "--repeats=1",
        "--idle-batches=1",
        "--trickle-partitions=",
        "--sweep-partitions=",
        "--path-rounds=2",
        f"--connect-url={spark_connect_server.url}",
        "--no-chart",
    )
    paths = doc["paths"]
    assert set(paths["runs"]) == {
        "classic per-range",
        "classic DataFrame",
        "classic DataFrame, counted by Spark",
        "classic DataFrame, all columns",
        "Connect per-range",
        "Connect DataFrame",
        "Connect DataFrame, counted by Spark",
        "Connect DataFrame, all columns",
    }
    assert all(len(runs) == 2 for runs in paths["runs"].values())
    assert all(
        r["messages"] == 2000 and r["messages_per_second"] > 0 for rs in paths["runs"].values() for r in rs
    )
    assert doc["connect_startup"]["server_seconds"] == 0  # the fixture's server, already up
    assert doc["connect_startup"]["python_workers_seconds"] > 0
    targets = {t["target"]: t for t in doc["targets"]}
    for name in (
        "DataFrame aggregate path / per-range count path",
        "Connect / classic, per-range count path",
        "Connect / classic, DataFrame aggregate path",
    ):
        assert targets[name]["measured"] > 0 and targets[name]["limit"] == 0.8
    assert "Connect / classic, per-range count path" in capsys.readouterr().out


def test_a_tiny_stream_benchmark_on_real_kafka_checks_and_times_every_path(
    spark: Any,
    real_kafka: RealKafkaCluster,
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m bench.stream --kafka real`` on the session's Apache Kafka: every path's total
    checked against the messages produced, a warm-up round and one measured round (about 30 s)."""
    doc = run_stream_bench(
        spark,
        real_kafka,
        database_url,
        tmp_path / "stream-real.json",
        "--messages=3000",
        "--partitions=2",
        "--rounds=1",
    )
    assert doc["kafka"] == f"Apache Kafka {real_kafka.version}"
    assert doc["workload"]["messages"] == 3000 and doc["workload"]["partitions"] == 2
    assert len(doc["machine"]["load_average_at_start"]) == 3
    [measured] = doc["rounds"]
    assert set(measured) == set(PATHS)
    assert all(run["messages"] == 3000 and run["batch_ms"] > 0 for run in measured.values())
    for path in PATHS:
        line = doc["summary"][path]
        assert line["messages_per_second"] > 0
        assert line["memory_peak_mib"]["jvm_mib"] > 0
        if path == PER_RANGE:
            assert line["profile_median"]["ranges"] == 2
        else:
            assert line["throughput_vs_per_range"] > 0
            assert line["durations_ms_median"]["triggerExecution"] == line["batch_ms"]
    assert "per-range's throughput" in capsys.readouterr().out


def test_a_tiny_partitions_benchmark_times_the_job_and_a_running_query_with_exact_counts(
    spark: Any, real_kafka: RealKafkaCluster, database_url: str, tmp_path: Path
) -> None:
    """``python -m bench.partitions`` on the session's Apache Kafka: idle batches and idle plans of
    the stream source called as Spark calls them, a warm batch, a running query's micro-batch and
    ``txstore status`` for both jobs, each batch's and micro-batch's count checked exactly (a
    count off, or a plan the source refuses, fails the run). Its jobs are its own, like its topics:
    a kept ``--database-url`` holding an earlier run's rows under the names a run used before
    shows none of them in this run's ``txstore status``."""
    output = tmp_path / "partitions.json"
    earlier = ("bench-partitions-2", "bench-partitions-stream-2", "bench-partitions-query-2")
    with connect(database_url) as conn:
        for job in earlier:
            conn.execute(
                "INSERT INTO txn_offsets (job, topic, part, off) VALUES (%s, 'an-earlier-run', 0, 7)",
                (job,),
            )
    status = partitions_main(
        [
            "--partitions=2,3",
            "--rounds=2",
            "--idle-batches=2",
            "--messages-per-partition=3",
            "--trigger-seconds=1",
            f"--output={output}",
            f"--database-url={database_url}",
        ],
        spark=spark,
        kafka=real_kafka,
    )
    assert status == 0
    doc = json.loads(output.read_text())
    assert len(doc["rounds"]) == 2
    for measured in doc["rounds"]:
        for n in ("2", "3"):
            at = measured[n]
            assert at["stream_micro_batches"] >= 1 and at["stream_steps_ms"]["triggerExecution"] > 0
            assert at["stream_warm_ms_per_range"] > 0 and at["stream_status_seconds"] > 0
            assert at["warm_ms_per_range"] > 0 and at["idle_ms"] > 0 and at["stream_idle_ms"] > 0
    assert "warm stream micro-batch at 3 partitions <= 1 ms a range" in doc["summary"]["targets"]
    with connect(database_url) as conn:
        for n in ("2", "3"):
            jobs = doc["jobs"][n]
            assert not set(jobs.values()) & set(earlier)
            assert store.job_topics(conn, jobs["job"]) == [jobs["job"]]  # the job's topic: its name
            assert store.job_topics(conn, jobs["stream_plan"]) == [jobs["job"]]
            assert store.job_topics(conn, jobs["query"]) == [jobs["query"]]
    assert not spark.streams.active, "the benchmark's query was left running"


def test_a_running_query_that_cannot_start_closes_the_producer_it_opened(
    spark: Any,
    real_kafka: RealKafkaCluster,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The benchmark's query whose ``start()`` raises (its checkpoint would lie under a file)
    leaves no producer open, reconnecting for the rest of the process."""
    import confluent_kafka

    opened: list[Any] = []

    class Kept(confluent_kafka.Producer):  # type: ignore[misc]
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__(config)
            opened.append(self)

    monkeypatch.setattr(confluent_kafka, "Producer", Kept)
    register(spark)
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    with pytest.raises(Exception, match="a-file"):
        RunningQuery(spark, real_kafka, database_url, 2, 1, not_a_folder, 1, "cannot-start")
    [producer] = opened
    with pytest.raises(RuntimeError, match="closed"):
        producer.flush(0)
    assert not spark.streams.active


def test_the_stream_benchmark_refuses_a_workload_the_test_broker_cannot_hold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The mock keeps about 5 MiB per partition: 4,000,000 messages over 8 are refused before
    anything starts, pointing at ``--kafka real``."""
    with pytest.raises(SystemExit) as refused:
        stream_main(["--messages=4000000", "--partitions=8"])
    assert refused.value.code == 2
    assert "use --kafka real" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        stream_main(["--kafka=other"])


def test_the_running_stream_benchmark_counts_the_topic_in_batches_and_leaves_the_first_out(
    spark: Any,
    real_kafka: RealKafkaCluster,
    database_url: str,
    tmp_path: Path,
) -> None:
    """``--batch-messages``: each path one job or query over the topic in batches of that many
    messages (3 here); the first batch is reported apart, the others are measured; every stored
    total is still checked against the messages produced."""
    doc = run_stream_bench(
        spark,
        real_kafka,
        database_url,
        tmp_path / "stream-running.json",
        "--messages=3000",
        "--partitions=2",
        "--batch-messages=1000",
        "--rounds=1",
        "--paths=per-range,stream-counted-by-source",
    )
    [measured] = doc["rounds"]
    for path in (PER_RANGE, "stream-counted-by-source"):
        run = measured[path]
        assert run["messages"] == 3000 and run["batches"] == 3
        assert run["first_batch"] > 0 and run["batch_ms"] > 0
    assert measured[PER_RANGE]["profile"]["ranges"] == 2
    assert doc["summary"]["stream-counted-by-source"]["throughput_vs_per_range"] > 0


def test_the_running_stream_benchmark_needs_two_batches_at_least(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as refused:
        stream_main(["--messages=1000", "--batch-messages=600"])
    assert refused.value.code == 2
    assert "at least two batches" in capsys.readouterr().err
