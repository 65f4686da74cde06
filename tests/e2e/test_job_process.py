"""count_topic as users run it: `python jobs/count_topic.py` and `spark-submit`, in their own processes."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import REPO, produce
from tests.helpers.counting import BrokerDb, assert_counted_exactly, totals
from tests.helpers.job_processes import (
    JOB,
    StderrLines,
    command_line,
    count_topic_args,
    descendants,
    gone_within,
    job_env,
    kill_group,
    operator_cli,
    python_without_txstore,
    run_job,
    spark_submit,
    wait_for,
)
from tests.helpers.job_processes import start_job as start_job_process
from txstore.spark.runtime.pyfiles import build_py_files
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark


def job_args(broker_db: BrokerDb, topic: str, *more: str) -> list[str]:
    """count_topic's flags for ``topic`` on ``broker_db``'s broker and database, then ``more``."""
    return count_topic_args(broker_db.kafka, broker_db.database_url, topic, *more)


@pytest.fixture
def start_job() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start `python jobs/count_topic.py ARGS` in its own process group; whatever is
    still running at the end of the test is killed by pid, with its children."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        process = start_job_process(*args)
        started.append(process)
        return process

    yield start
    for p in started:
        kill_group(p)


def test_a_restart_reads_its_offsets_from_the_database_only(
    kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    produce(kafka.bootstrap_servers, topic, {0: 100, 1: 50, 2: 25})
    first = run_job(*count_topic_args(kafka, database_url, topic, "--once"))
    assert first.returncode == 0, first.stderr
    assert totals(db, topic) == {topic: 175}
    produce(kafka.bootstrap_servers, topic, {0: 1, 2: 2})
    second = run_job(*count_topic_args(kafka, database_url, topic, "--once"))
    assert second.returncode == 0, second.stderr
    assert f"range {topic}/0 100 -> 101: 1 messages" in second.stderr
    assert f"range {topic}/2 25 -> 27: 2 messages" in second.stderr
    assert "batch 1: 2 ranges, 3 messages" in second.stderr
    assert_counted_exactly(db, kafka, topic, 178)
    assert not list(REPO.glob("**/checkpoint*")), "no Spark checkpoints are involved"


def test_two_once_runs_started_at_the_same_moment_end_with_exact_counts(
    broker_db: BrokerDb, start_job: Callable[..., subprocess.Popen[str]]
) -> None:
    topic = broker_db.new_topic(4)
    broker_db.produce(topic, {0: 500, 1: 400, 2: 300, 3: 200})
    processes = [start_job(*job_args(broker_db, topic, "--once")) for _ in range(2)]
    outputs = [p.communicate(timeout=240) for p in processes]
    # Either both succeed (one committed, the other found it already committed), or the
    # later one is refused as an overlap; never is anything counted twice.
    for p, (_, err) in zip(processes, outputs, strict=True):
        assert p.returncode == 0 or "overlap" in err, err
    assert any(p.returncode == 0 for p in processes)
    broker_db.assert_counted_exactly(topic, 1400)


def test_interval_mode_keeps_counting_and_stops_cleanly_on_sigterm(
    broker_db: BrokerDb, start_job: Callable[..., subprocess.Popen[str]]
) -> None:
    topic = broker_db.new_topic(2)
    broker_db.produce(topic, {0: 10})
    job = start_job(*job_args(broker_db, topic, "--interval", "0.5"))
    produced = 10
    deadline = time.monotonic() + 120
    for more in ({0: 5, 1: 5}, {1: 30}, {}):
        if more:
            broker_db.produce(topic, more)
        produced += sum(more.values())
        while (
            broker_db.totals(topic)[topic] != produced and time.monotonic() < deadline and job.poll() is None
        ):
            time.sleep(0.3)
        assert broker_db.totals(topic) == {topic: produced}
    # The running job holds its lock: status says so, and reset refuses.
    status = operator_cli("status", "--json", "--database-url", broker_db.database_url)
    assert {row["running"] for row in json.loads(status.stdout)} == {True}
    reset = operator_cli(
        "reset",
        "--database-url",
        broker_db.database_url,
        "--bootstrap-servers",
        broker_db.kafka.bootstrap_servers,
        "--job",
        "count_topic",
        "--topic",
        topic,
        "--to-earliest",
        "--execute",
    )
    assert reset.returncode == 1 and "job 'count_topic' is running" in reset.stderr
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    status = operator_cli("status", "--json", "--database-url", broker_db.database_url)
    assert {row["running"] for row in json.loads(status.stdout)} == {False}
    assert "received SIGTERM: finishing the current batch, then stopping" in err
    assert "stopped after" in err
    assert broker_db.offsets(topic) == broker_db.log_ends(topic)


def test_a_sigterm_while_spark_starts_stops_the_job_with_status_0_before_any_batch(
    broker_db: BrokerDb, start_job: Callable[..., subprocess.Popen[str]]
) -> None:
    topic = broker_db.new_topic(1)
    broker_db.produce(topic, {0: 5})
    job = start_job(*job_args(broker_db, topic, "--interval", "0.5"))
    # The job handles signals before it starts Spark's JVM: signal it as soon as that child exists.
    # Spark starts lazily, inside the first batch that has data, so that batch may finish first.
    children = Path(f"/proc/{job.pid}/task/{job.pid}/children")
    deadline = time.monotonic() + 60
    while job.poll() is None and time.monotonic() < deadline and not children.read_text().strip():
        time.sleep(0.02)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=180)
    assert job.returncode == 0, err
    assert "received SIGTERM" in err
    assert "Traceback" not in err
    batches = int(re.search(r"stopped after (\d+) batches", err).group(1))  # type: ignore[union-attr]
    assert batches <= 1
    assert broker_db.totals(topic) == {topic: 5 * batches}  # exact either way


def test_spark_submit_with_txstore_installed(broker_db: BrokerDb, tmp_path: Path) -> None:
    topic = broker_db.new_topic(2)
    broker_db.produce(topic, {0: 20, 1: 22})
    env = job_env(
        TXSTORE_DATABASE_URL=broker_db.database_url, KAFKA_BOOTSTRAP_SERVERS=broker_db.kafka.bootstrap_servers
    )
    result = spark_submit(JOB, "--topic", topic, "--once", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert broker_db.totals(topic) == {topic: 42}


def test_spark_submit_ships_txstore_with_py_files_where_it_is_not_installed(
    broker_db: BrokerDb, tmp_path: Path
) -> None:
    python = python_without_txstore(tmp_path)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    shutil.copy(JOB, job_dir / "count_topic.py")
    zip_path = build_py_files(tmp_path / "txstore-pyfiles.zip")
    topic = broker_db.new_topic(2)
    broker_db.produce(topic, {0: 7, 1: 8})
    env = job_env(PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python)
    result = spark_submit(
        "--py-files",
        str(zip_path),
        str(job_dir / "count_topic.py"),
        *job_args(broker_db, topic, "--once"),
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert broker_db.totals(topic) == {topic: 15}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "count_topic: error: --interval must be a number of seconds above 0, got 0"),
        (["--starting-offsets", "{oops"], "count_topic: error: --starting-offsets is not valid JSON"),
    ],
)
def test_bad_flags_exit_non_zero_with_one_line(
    kafka: MockKafkaCluster, database_url: str, args: list[str], message: str
) -> None:
    result = run_job(*count_topic_args(kafka, database_url, "some-topic", *args), timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in result.stderr


def test_an_unreachable_database_is_one_line_without_the_password(kafka: MockKafkaCluster) -> None:
    url = "postgresql://txstore:hunter2-secret@127.0.0.1:1/txstore"
    result = run_job(*count_topic_args(kafka, url, "some-topic", "--once"), timeout=120)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "count_topic: error: cannot connect to PostgreSQL at postgresql://txstore:***@127.0.0.1:1/txstore"
    )
    assert "hunter2" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def assert_stopped_now(job: subprocess.Popen[str], spark: set[int]) -> None:
    """Exit 130, one line on stderr saying so (no Python or Java traceback), and none of the
    JVM's or its workers' processes left running."""
    _, err = job.communicate(timeout=60)
    assert job.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "Exception" not in err and "py4j" not in err.lower(), err[-3000:]
    lines = [line for line in err.splitlines() if "interrupt" in line.lower()]
    assert lines == ["count_topic: interrupted (second Ctrl-C): Spark stopped"], err[-3000:]
    assert err.rstrip("\n").splitlines()[-1] == lines[0]
    assert gone_within(spark, 30) == set(), [command_line(p) for p in spark]


def test_a_second_ctrl_c_while_spark_starts_stops_the_jvm_and_exits_130(
    broker_db: BrokerDb, start_job: Callable[..., subprocess.Popen[str]]
) -> None:
    topic = broker_db.new_topic(1)
    broker_db.produce(topic, {0: 5})
    job = start_job(*job_args(broker_db, topic, "--interval", "0.5"))
    # Spark starts lazily, in the first batch with data: signal as soon as its JVM exists.
    assert wait_for(
        lambda: job.poll() is not None or any("java" in command_line(p) for p in descendants(job.pid)), 60
    )
    job.send_signal(signal.SIGINT)
    time.sleep(0.3)
    spark = descendants(job.pid)
    assert any("java" in command_line(p) for p in spark), "the JVM was not starting any more"
    job.send_signal(signal.SIGINT)
    assert_stopped_now(job, spark)
    assert broker_db.totals(topic)[topic] in (0, 5)  # nothing or the whole batch, never part or twice
    again = run_job(*job_args(broker_db, topic, "--once"))
    assert again.returncode == 0, again.stderr
    assert broker_db.totals(topic) == {topic: 5}


def test_a_second_ctrl_c_during_a_batch_stops_spark_and_exits_130_with_exact_counts(
    broker_db: BrokerDb, start_job: Callable[..., subprocess.Popen[str]]
) -> None:
    topic = broker_db.new_topic(2)
    broker_db.produce(topic, {0: 30, 1: 20})
    # The tasks stall before COMMIT, their transactions open, while the driver waits in Spark.
    env_job = job_env(TXSTORE_FAILPOINTS="before-commit:sleep=60")
    job = start_job_process(*job_args(broker_db, topic, "--interval", "0.5"), env=env_job)
    try:
        workers = lambda: [p for p in descendants(job.pid) if "pyspark" in command_line(p)]  # noqa: E731

        def stalled() -> bool:
            # A task's commit, stalled after its conditional offset update: not any transaction
            # (the driver's planning is briefly idle in one too, before a task has started).
            with psycopg.connect(broker_db.database_url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                    " AND datname = current_database() AND query LIKE '%UPDATE txn_offsets o SET off%'"
                ).fetchone()
            return job.poll() is not None or bool(row and row[0] and workers())

        assert wait_for(stalled, 120), "no task got to its commit"
        assert job.poll() is None
        job.send_signal(signal.SIGINT)
        time.sleep(0.5)
        spark = descendants(job.pid)
        assert workers(), [command_line(p) for p in spark]
        job.send_signal(signal.SIGINT)
        assert_stopped_now(job, spark)
    finally:
        kill_group(job)
    assert broker_db.totals(topic)[topic] in (0, 20, 30, 50)  # whole ranges or nothing
    again = run_job(*job_args(broker_db, topic, "--once"))
    assert again.returncode == 0, again.stderr
    broker_db.assert_counted_exactly(topic, 50)


def test_one_ctrl_c_just_after_spark_started_lets_the_batch_finish_without_a_traceback(
    broker_db: BrokerDb,
) -> None:
    # The moment PySpark's own SIGINT handler used to hold: the session made, the job's handlers
    # not yet back (a fail point stalls there). One Ctrl-C is the documented one: the batch
    # finishes, exit 0, one line saying so; no Py4J traceback, no JVM left.
    topic = broker_db.new_topic(1)
    broker_db.produce(topic, {0: 5})
    env = job_env(TXSTORE_FAILPOINTS="spark-started:sleep=3", PYTHONPATH=str(REPO))  # this checkout's txstore
    job = start_job_process(*job_args(broker_db, topic, "--once"), env=env)
    try:
        err = StderrLines(job)
        assert err.wait_for("txstore fail point spark-started", 180), err.text(1)[-3000:]
        spark = descendants(job.pid)
        job.send_signal(signal.SIGINT)
        job.wait(timeout=180)
        text = err.text()
    finally:
        kill_group(job)
    assert job.returncode == 0, text[-3000:]
    assert "received SIGINT: finishing the current batch, then stopping" in text
    assert "Traceback" not in text and "py4j" not in text.lower() and "interrupted" not in text, text[-3000:]
    assert gone_within(spark, 30) == set(), [command_line(p) for p in spark]
    assert broker_db.totals(topic) == {topic: 5}
