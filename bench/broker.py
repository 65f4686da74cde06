"""The test broker in its own process, so its stored messages never count as the driver's memory.

``python -m bench.broker`` starts a :class:`MockKafkaCluster`, prints its
bootstrap address, then obeys one command per line on stdin and answers
``ok`` or ``error: ...``:

    create TOPIC PARTITIONS
    delete TOPIC

It exits when stdin closes (the benchmark ended or died) or on SIGTERM.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from types import TracebackType

from txstore.testing.mock_kafka import MockKafkaCluster

ANSWER_TIMEOUT_SECONDS = 60.0


def serve() -> int:
    with MockKafkaCluster(brokers=1) as cluster:
        print(cluster.bootstrap_servers, flush=True)
        for line in sys.stdin:
            words = line.split()
            try:
                if words[:1] == ["create"] and len(words) == 3:
                    cluster.create_topic(words[1], int(words[2]))
                elif words[:1] == ["delete"] and len(words) == 2:
                    cluster.delete_topic(words[1])
                else:
                    raise ValueError(f"unknown command {line.strip()!r}")
                print("ok", flush=True)
            except Exception as e:
                print(f"error: {e}", flush=True)
    return 0


class BrokerProcess:
    """Starts ``python -m bench.broker``; stops it (by pid) on :meth:`close`."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.broker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # librdkafka logs disconnects when clients go away
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_lines, daemon=True).start()
        self.bootstrap_servers = self._answer()
        if ":" not in self.bootstrap_servers:
            self.close()
            raise RuntimeError(f"test broker did not start: {self.bootstrap_servers!r}")

    def _read_lines(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.strip())
        self._lines.put("")  # the broker exited

    def _answer(self) -> str:
        try:
            return self._lines.get(timeout=ANSWER_TIMEOUT_SECONDS)
        except queue.Empty:
            return f"no answer within {ANSWER_TIMEOUT_SECONDS:g}s"

    def _command(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        if answer != "ok":
            raise RuntimeError(f"test broker: {text}: {answer or 'no answer'}")

    def create_topic(self, topic: str, partitions: int) -> None:
        self._command(f"create {topic} {partitions}")

    def delete_topic(self, topic: str) -> None:
        self._command(f"delete {topic}")

    def close(self) -> None:
        if self.process.poll() is None:
            if self.process.stdin is not None:
                self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(serve())
