"""A Spark standalone cluster on this machine whose two workers count as two hosts.

Spark never speculates in local mode, and never runs a speculative copy on
the host that runs the original attempt. So the cluster's two workers
advertise different host names for the same loopback address (``localhost``
and ``127.0.0.1``): every task then has another "host" for its copy. Every
server binds 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from tests.chaos.procs import TAG_ENV, kill_tagged, start_logged
from tests.helpers.local import SPARK_HOME, free_port

HOSTS = ("localhost", "127.0.0.1")


class StandaloneCluster:
    def __init__(self, directory: Path, tag: str, cores_per_worker: int = 6) -> None:
        """``cores_per_worker`` is generous on purpose: up to three jobs' executors fit at once."""
        self.directory = directory
        self.tag = tag
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        directory.mkdir(parents=True, exist_ok=True)
        self.work_dirs = [directory / f"worker-{i}" for i in range(len(HOSTS))]
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))},
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # Keep executors' logs after their application ends: the runner reads them.
            "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=false",
            TAG_ENV: tag,
        }
        self._processes: list[subprocess.Popen[bytes]] = []
        try:
            self._start(
                env,
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(free_port())],
                "I have been elected leader",
            )
            for host, work_dir in zip(HOSTS, self.work_dirs, strict=True):
                self._start(
                    env,
                    f"worker-{host}",
                    "org.apache.spark.deploy.worker.Worker",
                    [
                        "--host",
                        host,
                        "--cores",
                        str(cores_per_worker),
                        "--memory",
                        "3g",
                        "--webui-port",
                        str(free_port()),
                        "--work-dir",
                        str(work_dir),
                        self.url,
                    ],
                    "Successfully registered with master",
                )
        except BaseException:
            self.close()
            raise

    def _start(self, env: dict[str, str], name: str, main: str, args: list[str], ready: str) -> None:
        log = self.directory / f"{name}.log"
        process = start_logged(
            [str(SPARK_HOME / "bin" / "spark-class"), main, *args], env, log, self.directory
        )
        self._processes.append(process)
        deadline = time.monotonic() + 180
        while ready not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Spark {name} did not start; see {log}")
            time.sleep(0.2)

    def executor_logs(self, app_ids: list[str]) -> str:
        """The stderr of the executors of these applications (where task fail points report)."""
        text = []
        for work_dir in self.work_dirs:
            for app in app_ids:
                for stderr in sorted((work_dir / app).glob("*/stderr")):
                    text.append(stderr.read_text(errors="replace"))
        return "\n".join(text)

    def close(self) -> None:
        for p in self._processes:
            if p.poll() is None:
                p.kill()
        for p in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
        kill_tagged(self.tag)  # executors and their Python workers, by pid
