"""A job whose Spark does not start, or is stopped while it starts, in a process of its own.

A Spark Connect server that cannot be reached (a closed port, an unknown host, a port that
accepts and never answers) ends the job in bounded time with one line naming the address, and
SIGTERM or Ctrl-C end the wait at once; a standalone master that cannot be reached is named with
its cause, not Py4J's "An error occurred while calling None...SparkSession".
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError

from tests.conftest import REPO, produce
from tests.helpers.counting import BrokerDb
from tests.helpers.job_processes import StderrLines, count_topic_args, job_env, kill_group, start_job
from txstore.spark.runtime.startup import java_cause
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark


def this_checkout(**extra: str) -> dict[str, str]:
    return job_env(PYTHONPATH=str(REPO), **extra)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A port that accepts connections (the kernel's backlog) and never says a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s


def ended(job: subprocess.Popen[str], seconds: float) -> tuple[int, str, float]:
    """Wait for the job (killed with its group after ``seconds``); its exit status, stderr and time."""
    started = time.monotonic()
    err = StderrLines(job)
    try:
        job.wait(timeout=seconds)
    finally:
        kill_group(job)
    return job.returncode, err.text(), time.monotonic() - started


@pytest.mark.parametrize("address", ["closed-port", "unknown-host", "silent-port"])
def test_an_unreachable_connect_server_ends_the_job_in_bounded_time_with_one_line_naming_it(
    kafka: MockKafkaCluster,
    database_url: str,
    new_topic: Callable[..., str],
    silent_server: socket.socket,
    address: str,
) -> None:
    host, port, reason = {
        "closed-port": ("127.0.0.1", closed_port(), ": connection refused at 127.0.0.1:{port}"),
        "unknown-host": ("no-such-host.invalid", 15002, ": unknown host no-such-host.invalid"),
        "silent-port": ("127.0.0.1", silent_server.getsockname()[1], ""),  # TCP opens; gRPC hears nothing
    }[address]
    remote = f"sc://{host}:{port}/;token=secret-token"
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 3})  # data, so the batch needs Spark
    args = count_topic_args(
        kafka, database_url, topic, "--once", "--remote", remote, "--connect-timeout", "4"
    )
    status, err, seconds = ended(start_job(*args, env=this_checkout()), 90)
    assert status == 1, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"count_topic: error: the Spark Connect server at sc://{host}:{port} did not answer within 4 s"
        f"{reason.format(port=port)}; start it, or correct --remote / SPARK_REMOTE (--connect-timeout sets the wait)"
    ), err[-3000:]
    assert "Traceback" not in err and "secret-token" not in err
    assert seconds < 40


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_ends_the_wait_for_a_connect_server_at_once(
    broker_db: BrokerDb, silent_server: socket.socket, signum: signal.Signals
) -> None:
    port = silent_server.getsockname()[1]
    topic = broker_db.new_topic(1)
    broker_db.produce(topic, {0: 3})
    args = count_topic_args(
        broker_db.kafka,
        broker_db.database_url,
        topic,
        "--interval",
        "1",
        "--remote",
        f"sc://127.0.0.1:{port}",
        "--connect-timeout",
        "300",
    )
    job = start_job(*args, env=this_checkout())
    try:
        silent_server.settimeout(120)
        silent_server.accept()[0].close()  # the job is waiting for the server now
        silent_server.settimeout(None)
        time.sleep(1)
        job.send_signal(signum)
        status, err, seconds = ended(job, 30)
    finally:
        kill_group(job)
    assert status == 0, err[-3000:]
    assert seconds < 10, err[-3000:]
    name = signal.Signals(signum).name
    assert f"received {name}: finishing the current batch, then stopping" in err
    assert (
        f"job count_topic: stopped while waiting for the Spark Connect server at sc://127.0.0.1:{port}; no batch ran"
        in err
    ), err[-3000:]
    assert "Traceback" not in err and "interrupted" not in err
    assert broker_db.totals(topic) == {topic: 0}  # nothing counted


def test_a_standalone_master_that_cannot_be_reached_is_named_with_its_cause(
    kafka: MockKafkaCluster, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 3})
    env = this_checkout(PYSPARK_SUBMIT_ARGS="--master spark://spark-master.invalid:7077 pyspark-shell")
    status, err, seconds = ended(
        start_job(*count_topic_args(kafka, database_url, topic, "--once"), env=env), 120
    )
    assert status == 1, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "count_topic: error: Spark did not start: the master spark://spark-master.invalid:7077 cannot be "
        "reached: unknown host spark-master.invalid; start it, or correct the master's address "
        "(spark-submit --master)"
    ), err[-3000:]
    assert "Traceback" not in err and "An error occurred while calling" not in err
    assert seconds < 90  # not Spark's minute and more of registering with it again


def test_a_java_error_is_told_by_its_deepest_cause(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    unknown = jvm.java.net.UnknownHostException("spark-master")
    wrapped = jvm.org.apache.spark.SparkException("Exception thrown in awaitResult: ", unknown)
    error = Py4JJavaError(
        "An error occurred while calling None.org.apache.spark.sql.classic.SparkSession.", wrapped
    )
    assert java_cause(error) == "UnknownHostException: spark-master"
    assert java_cause(ValueError("not Java")) is None
