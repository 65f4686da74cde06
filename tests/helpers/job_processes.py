"""Jobs as users run them, in processes of their own, and the processes they leave.

Shared by the tests that start ``python jobs/count_topic.py``, ``spark-submit`` or the
``txstore`` command (test_job_process.py, test_cluster.py, test_example_jobs.py and others):

- the environment a job process gets (:func:`job_env`: the test's own, less the variables a
  job would read instead of its flags) and count_topic's flags (:func:`count_topic_args`);
- running one to its end (:func:`run_job`, :func:`operator_cli`, :func:`spark_submit`), an
  interpreter without txstore (:func:`python_without_txstore`, for ``--py-files``);
- the process tree, read from /proc (:func:`children`, :func:`descendants`,
  :func:`command_line`, :func:`alive`, :func:`gone_within`), and :func:`kill_group`, which
  ends a process started with ``start_new_session=True`` and all its group, by its pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.helpers.local import SPARK_HOME
from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import RealKafkaCluster

JOB = str(REPO / "jobs" / "count_topic.py")


def job_env(**extra: str) -> dict[str, str]:
    skip = ("TXSTORE_", "KAFKA_", "PYSPARK_SUBMIT", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, **extra})
    return env


def count_topic_args(
    kafka: MockKafkaCluster | RealKafkaCluster, database_url: str, topic: str, *more: str
) -> list[str]:
    """A job's servers and topic as its command line takes them (count_topic's and the other jobs')."""
    return [
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--database-url",
        database_url,
        "--topic",
        topic,
        *more,
    ]


def run_job(
    *args: str, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, JOB, *args], env=env or job_env(), capture_output=True, text=True, timeout=timeout
    )


def start_job(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``python jobs/count_topic.py ARGS`` in its own process group (end it with
    :func:`kill_group`), its output piped."""
    return subprocess.Popen(
        [sys.executable, JOB, *args],
        env=env or job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def operator_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txstore.ops.cli", *args],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def spark_submit(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**env, "SPARK_HOME": str(SPARK_HOME)}
    return subprocess.run(
        [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            *args,
        ],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def python_without_txstore(tmp_path: Path) -> str:
    """An interpreter with txstore's dependencies but not txstore itself: a venv that
    sees the test venv's site-packages as a plain path, so its editable txstore
    install (a .pth hook there) does not apply."""
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)
    site = next((bare / "lib").glob("python*/site-packages"))
    deps = next(p for p in map(Path, sys.path) if (p / "confluent_kafka").is_dir())
    (site / "deps.pth").write_text(f"{deps}\n")
    python = str(bare / "bin" / "python")
    check = subprocess.run(
        [python, "-c", "import confluent_kafka, psycopg, pyspark; import txstore"],
        cwd=tmp_path,
        env=job_env(),
        capture_output=True,
        text=True,
    )
    assert "No module named 'txstore'" in check.stderr
    return python


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL a process started with ``start_new_session=True`` and its whole group, if it
    still runs, and reap it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc (a process that ends meanwhile is left out)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
    return parents


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    return [child for child, parent in _parents().items() if parent == pid]


def descendants(pid: int) -> set[int]:
    """Every living process under ``pid`` (children, theirs, ...)."""
    parents = _parents()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def gone_within(pids: set[int], seconds: float) -> set[int]:
    """The pids still alive after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class StderrLines:
    """A started process's stderr, read line by line in a thread as it comes, so a test can wait
    for a line (:meth:`wait_for`) and still read the whole of it afterwards (:meth:`text`)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        self.lines: list[str] = []
        self._stream = process.stderr
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line)

    def wait_for(self, text: str, seconds: float) -> bool:
        return wait_for(
            lambda: any(text in line for line in self.lines) or not self._reader.is_alive(), seconds
        ) and any(text in line for line in self.lines)

    def text(self, seconds: float = 30) -> str:
        """All of it, once the process closed its stderr (waits up to ``seconds``)."""
        self._reader.join(seconds)
        return "".join(self.lines)
