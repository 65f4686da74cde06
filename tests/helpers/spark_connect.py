"""A local Spark Connect server for tests, from the pip-installed PySpark.

The server is the one users run (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, whose jar ships in
the pyspark wheel), in ``local[2,4]`` like the classic ``spark`` fixture,
bound to 127.0.0.1 on a free port. Its Python workers run on this
interpreter (``PYSPARK_PYTHON``), so they import this checkout's txstore.

Steps: start spark-submit in its own process group with its output in a log
file; wait (bounded) until the gRPC port accepts connections; on failure or
timeout, stop it and raise with the tail of its log. :meth:`close` ends the
whole process group (the JVM and the Python workers it started) by its id:
TERM, then KILL after a grace period.

``python -m tests.helpers.spark_connect`` starts one, prints its URL and start-up
time, and stops it (a smoke check of this machine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from tests.helpers.local import SPARK_HOME, free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_SECONDS = 180.0
STOP_TIMEOUT_SECONDS = 30.0


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class SparkConnectServer:
    """``with SparkConnectServer(directory) as server:`` then ``server.url`` (``sc://127.0.0.1:PORT``)."""

    def __init__(
        self, directory: Path, timeout: float = START_TIMEOUT_SECONDS, master: str = "local[2,4]"
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.log = directory / "spark-connect.log"
        directory.mkdir(parents=True, exist_ok=True)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))},
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        command = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--master",
            master,
            "--name",
            "txstore-tests-connect",
            "--conf",
            f"spark.connect.grpc.binding.port={self.port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            "spark-internal",
        ]
        started = time.monotonic()
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=directory,
                start_new_session=True,  # its own process group: close() ends it and its workers
            )
        try:
            deadline = started + timeout
            while not _accepts(self.port):
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"the Spark Connect server exited with code {self.process.returncode} before "
                        f"listening on 127.0.0.1:{self.port}; log {self.log}:\n{_tail(self.log)}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the Spark Connect server did not listen on 127.0.0.1:{self.port} within "
                        f"{timeout:g}s; log {self.log}:\n{_tail(self.log)}"
                    )
                time.sleep(0.25)
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.monotonic() - started

    def close(self) -> None:
        """End the server's process group: TERM, then KILL if it is still there after a grace period."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        # Python workers left in the group after the JVM went.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> SparkConnectServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def connect_session(url: str) -> object:
    """A Spark Connect client session for ``url``.

    Built with the Connect builder itself, not ``SparkSession.builder.remote``:
    in a process that already runs a classic session (the ``spark``
    fixture), the generic builder refuses with ``SESSION_ALREADY_EXIST``,
    and it would also set ``SPARK_CONNECT_MODE_ENABLED`` for the rest of the
    process, switching every later classic call to Connect.
    """
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    return RemoteSparkSession.builder.remote(url).create()


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, SparkConnectServer(Path(tmp)) as server:
        print(f"{server.url} listening after {server.startup_seconds:.1f}s")
        begun = time.monotonic()
        session: object = connect_session(server.url)
        print(session.range(5).count(), f"first query after {time.monotonic() - begun:.1f}s")  # type: ignore[attr-defined]
        session.stop()  # type: ignore[attr-defined]
