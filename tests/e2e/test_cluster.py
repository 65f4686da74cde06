"""count_topic on a real Spark standalone cluster, whose executor is killed mid-batch.

A master and a worker from the pip-installed Spark run on 127.0.0.1;
`spark-submit --master spark://...` runs jobs/count_topic.py with txstore
shipped by `--py-files` to an interpreter that does not have it installed.
Everything started here is stopped by process id, also when the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyspark
import pytest

from tests.conftest import REPO, produce
from tests.e2e.test_count_topic import log_ends, offsets, totals
from tests.helpers.job_processes import (
    children,
    command_line,
    count_topic_args,
    job_env,
    kill_group,
    python_without_txstore,
)
from tests.helpers.private_postgres import free_port
from txstore.spark.runtime.pyfiles import build_py_files
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class Standalone:
    master_url: str
    worker_pid: int
    env: dict[str, str]


def _wait_for_worker(webui_port: int, processes: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            break
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=5) as answer:
                if json.load(answer).get("aliveworkers", 0) >= 1:
                    return
        except (OSError, ValueError):  # not listening yet, or a page still being set up
            pass
        time.sleep(0.5)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
    raise RuntimeError(f"the standalone worker did not register with the master in time\n{tails}")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    """A standalone master and one worker (2 cores) on 127.0.0.1, killed by process group at the end."""
    work = tmp_path / "spark-work"
    work.mkdir()
    env = job_env(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        SPARK_WORKER_DIR=str(work),
        SPARK_LOCAL_DIRS=str(work),
    )
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    commands = {
        "master": [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(master_ui),
        ],
        "worker": [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            f"spark://127.0.0.1:{port}",
            "--host",
            "127.0.0.1",
            "--webui-port",
            str(worker_ui),
            "--cores",
            "2",
            "--memory",
            "1g",
            "--work-dir",
            str(work),
        ],
    }
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for name, command in commands.items():
            log = tmp_path / f"{name}.log"
            logs.append(log)
            with log.open("wb") as out:
                # spark-class execs the JVM, so each pid is its JVM, leading its own process group.
                processes.append(
                    subprocess.Popen(
                        command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        _wait_for_worker(master_ui, processes, logs)
        yield Standalone(f"spark://127.0.0.1:{port}", processes[1].pid, env)
    finally:
        for p in reversed(processes):  # the worker's group holds its executors
            kill_group(p)


def blocked_commits(db: psycopg.Connection) -> int:
    """txstore sessions waiting for a lock: tasks that read their range and are committing."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = 'txstore' AND wait_event_type = 'Lock' AND datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def test_killing_the_executor_mid_batch_on_a_standalone_cluster_still_counts_exactly_once(
    standalone: Standalone,
    kafka: MockKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = new_topic(4)
    produce(kafka.bootstrap_servers, topic, {0: 3000, 1: 2000, 2: 1000, 3: 500})
    python = python_without_txstore(tmp_path)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "count_topic.py").write_bytes((REPO / "jobs" / "count_topic.py").read_bytes())
    zip_path = build_py_files(tmp_path / "txstore-pyfiles.zip")

    # Hold the results table so every task blocks in its commit transaction, after reading
    # its range and writing nothing yet: the batch is then certainly in flight when the
    # executor dies. (Planning does not touch txn_data, so the driver is not held.)
    with psycopg.connect(database_url) as holder:
        holder.execute("LOCK TABLE txn_data IN SHARE ROW EXCLUSIVE MODE")
        out = tmp_path / "job.log"
        with out.open("w") as log:
            job = subprocess.Popen(
                [
                    str(SPARK_HOME / "bin" / "spark-submit"),
                    "--master",
                    standalone.master_url,
                    "--conf",
                    "spark.ui.enabled=false",
                    "--conf",
                    "spark.driver.host=127.0.0.1",
                    "--conf",
                    "spark.driver.bindAddress=127.0.0.1",
                    "--conf",
                    "spark.executor.memory=512m",
                    "--py-files",
                    str(zip_path),
                    str(job_dir / "count_topic.py"),
                    # --verbose: Spark's WARN lines (the lost task's ExecutorLostFailure) are the
                    # evidence that the batch was in flight; quiet runs print Spark's errors only.
                    *count_topic_args(kafka, database_url, topic, "--once", "--verbose"),
                ],
                env={**standalone.env, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while blocked_commits(db) < 2 and job.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert blocked_commits(db) == 2, f"tasks never reached their commit\n{out.read_text()[-3000:]}"
            executors = [
                pid
                for pid in children(standalone.worker_pid)
                if "CoarseGrainedExecutorBackend" in command_line(pid)
            ]
            assert len(executors) == 1, executors
            os.kill(executors[0], signal.SIGKILL)
            time.sleep(1)  # let the driver notice before the commits could go on
            holder.rollback()  # release the table: the dead tasks' sessions abort, retries commit

            assert job.wait(timeout=180) == 0, out.read_text()[-5000:]
        finally:
            kill_group(job)

    log_text = out.read_text()
    assert "Lost executor" in log_text, log_text[-5000:]
    assert "ExecutorLostFailure" in log_text
    assert "batch 1: 4 ranges, 6500 messages" in log_text
    assert totals(db, topic) == {topic: 6500}
    assert offsets(db, topic) == log_ends(kafka, topic)
