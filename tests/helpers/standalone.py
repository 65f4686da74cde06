"""A Spark standalone cluster from the pip-installed Spark: a master and one worker on 127.0.0.1
(the ``standalone`` fixture, tests/conftest.py), and spark-submit to it."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.helpers.job_processes import job_env, kill_group
from tests.helpers.local import SPARK_HOME, free_port

WORKER_TIMEOUT = 120.0


@dataclass(frozen=True)
class Standalone:
    master_url: str
    worker_pid: int
    env: dict[str, str]

    def submit(self, *args: str, env: dict[str, str], cwd: Path, log: IO[str]) -> subprocess.Popen[str]:
        """``spark-submit ARGS`` to this master (client mode, the driver on 127.0.0.1, 512 MB
        executors) in its own process group, its output into ``log``; ``env`` adds to the cluster's."""
        return subprocess.Popen(
            [
                str(SPARK_HOME / "bin" / "spark-submit"),
                "--master",
                self.master_url,
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.driver.host=127.0.0.1",
                "--conf",
                "spark.driver.bindAddress=127.0.0.1",
                "--conf",
                "spark.executor.memory=512m",
                *args,
            ],
            env={**self.env, **env},
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def _wait_for_worker(webui_port: int, processes: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    deadline = time.monotonic() + WORKER_TIMEOUT
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


def standalone_cluster(tmp_path: Path) -> Iterator[Standalone]:
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
