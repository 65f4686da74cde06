"""count_topic on a real Spark standalone cluster, whose executor is killed mid-batch.

A master and a worker from the pip-installed Spark run on 127.0.0.1;
`spark-submit --master spark://...` runs jobs/count_topic.py with txstore
shipped by `--py-files` to an interpreter that does not have it installed.
Everything started here is stopped by process id, also when the test fails.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from tests.conftest import REPO
from tests.helpers.counting import BrokerDb
from tests.helpers.job_processes import (
    children,
    command_line,
    count_topic_args,
    kill_group,
    python_without_txstore,
)
from tests.helpers.standalone import Standalone
from txstore.spark.runtime.pyfiles import build_py_files

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

START_TIMEOUT = 120.0


def blocked_commits(db: psycopg.Connection) -> int:
    """txstore sessions waiting for a lock: tasks that read their range and are committing."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = 'txstore' AND wait_event_type = 'Lock' AND datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def test_killing_the_executor_mid_batch_on_a_standalone_cluster_still_counts_exactly_once(
    standalone: Standalone, broker_db: BrokerDb, tmp_path: Path
) -> None:
    topic = broker_db.new_topic(4)
    broker_db.produce(topic, {0: 3000, 1: 2000, 2: 1000, 3: 500})
    python = python_without_txstore(tmp_path)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "count_topic.py").write_bytes((REPO / "jobs" / "count_topic.py").read_bytes())
    zip_path = build_py_files(tmp_path / "txstore-pyfiles.zip")

    # Hold the results table so every task blocks in its commit transaction, after reading
    # its range and writing nothing yet: the batch is then certainly in flight when the
    # executor dies. (Planning does not touch txn_data, so the driver is not held.)
    with psycopg.connect(broker_db.database_url) as holder:
        holder.execute("LOCK TABLE txn_data IN SHARE ROW EXCLUSIVE MODE")
        out = tmp_path / "job.log"
        with out.open("w") as log:
            job = standalone.submit(
                "--py-files",
                str(zip_path),
                str(job_dir / "count_topic.py"),
                # --verbose: Spark's WARN lines (the lost task's ExecutorLostFailure) are the
                # evidence that the batch was in flight; quiet runs print Spark's errors only.
                *count_topic_args(broker_db.kafka, broker_db.database_url, topic, "--once", "--verbose"),
                env={"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
                cwd=tmp_path,
                log=log,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while blocked_commits(broker_db.db) < 2 and job.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert blocked_commits(broker_db.db) == 2, (
                f"tasks never reached their commit\n{out.read_text()[-3000:]}"
            )
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
    broker_db.assert_counted_exactly(topic, 6500)
