"""A Kafka-protocol broker for tests, the demo and benchmarks.

Wraps librdkafka's mock cluster, which ships inside the confluent-kafka wheel
and speaks the real Kafka protocol over loopback TCP, through ctypes. Any
Kafka client, in any process, can use it while the owning process lives.

It emulates retention: each partition keeps at most 5 MiB or 100,000 message
sets, and older ones are dropped (the log-start offset advances).

    with MockKafkaCluster(brokers=1) as kafka:
        kafka.create_topic("events", partitions=4)
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})

:class:`MockKafkaCluster` serves the cluster from a child process of its own
(:class:`InProcessMockCluster` in it), driven over a pipe. Taking a broker down
closes its listening socket and binds a new one to the same port at once; a
process that forks at that moment (``subprocess`` does, between fork and exec)
still holds the old listener, the bind fails and librdkafka aborts the whole
process. The child never forks, so callers may start processes freely.

``python -m txstore.testing.mock_kafka --topic events:4`` serves one until stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

import confluent_kafka

_RD_KAFKA_PRODUCER = 0


def _load_librdkafka() -> ctypes.CDLL:
    package = os.path.dirname(confluent_kafka.__file__)
    candidates = sorted(
        glob.glob(os.path.join(package, os.pardir, "confluent_kafka.libs", "librdkafka*.so*"))
    )
    candidates += sorted(glob.glob(os.path.join(package, ".dylibs", "librdkafka*.dylib")))
    if not candidates:
        raise RuntimeError("librdkafka from the confluent-kafka wheel not found; reinstall confluent-kafka")
    lib = ctypes.CDLL(candidates[0])
    vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    signatures: dict[str, tuple[list[object], object]] = {
        "rd_kafka_conf_new": ([], vp),
        "rd_kafka_conf_set": ([vp, cp, cp, cp, sz], i),
        "rd_kafka_new": ([i, vp, cp, sz], vp),
        "rd_kafka_destroy": ([vp], None),
        "rd_kafka_mock_cluster_new": ([vp, i], vp),
        "rd_kafka_mock_cluster_destroy": ([vp], None),
        "rd_kafka_mock_cluster_bootstraps": ([vp], cp),
        "rd_kafka_mock_topic_create": ([vp, cp, i, i], i),
        "rd_kafka_mock_topic_delete": ([vp, cp], i),
        "rd_kafka_mock_broker_set_down": ([vp, ctypes.c_int32], i),
        "rd_kafka_mock_broker_set_up": ([vp, ctypes.c_int32], i),
        "rd_kafka_mock_broker_set_rtt": ([vp, ctypes.c_int32, i], i),
        "rd_kafka_mock_partition_set_leader": ([vp, cp, ctypes.c_int32, ctypes.c_int32], i),
        "rd_kafka_mock_push_request_errors_array": ([vp, ctypes.c_int16, sz, ctypes.POINTER(i)], None),
        "rd_kafka_mock_clear_request_errors": ([vp, ctypes.c_int16], None),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = restype
    return lib


_RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")


def _reserve_ports(ports: set[str]) -> set[str]:
    """Keep the kernel from giving ``ports`` to outgoing connections; return the ones
    this call added (best effort: Linux, and only where the file may be written)."""
    try:
        current = {p for p in _RESERVED_PORTS.read_text().strip().split(",") if p}
        added = ports - current
        if added:
            _RESERVED_PORTS.write_text(",".join(sorted(current | added)) + "\n")
        return added
    except OSError:
        return set()


def _release_ports(ports: set[str]) -> None:
    if not ports:
        return
    with contextlib.suppress(OSError):
        current = {p for p in _RESERVED_PORTS.read_text().strip().split(",") if p}
        _RESERVED_PORTS.write_text(",".join(sorted(current - ports)) + "\n")


class InProcessMockCluster:
    """A mock Kafka cluster of ``brokers`` brokers on 127.0.0.1, in this process, alive until closed.

    Not safe where this process may fork while a broker is taken down (see the module's
    docstring): use :class:`MockKafkaCluster` there.
    """

    def __init__(self, brokers: int = 1) -> None:
        self._lib = _load_librdkafka()
        errstr = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"2", errstr, len(errstr))
        self._rk = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new failed: {errstr.value.decode(errors='replace')}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._cluster:
            self._lib.rd_kafka_destroy(self._rk)
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.brokers = brokers
        self.bootstrap_servers: str = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()
        self._ports = {address.rsplit(":", 1)[1] for address in self.bootstrap_servers.split(",")}
        self._reserved: set[str] = set()

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed: {confluent_kafka.KafkaError(code).str()}")

    def create_topic(self, topic: str, partitions: int = 1, replication_factor: int = 1) -> None:
        """Create ``topic`` (AdminClient.create_topics does not work against the mock)."""
        self._check(
            self._lib.rd_kafka_mock_topic_create(
                self._cluster, topic.encode(), partitions, replication_factor
            ),
            f"creating topic {topic!r}",
        )

    def delete_topic(self, topic: str) -> None:
        self._check(
            self._lib.rd_kafka_mock_topic_delete(self._cluster, topic.encode()), f"deleting {topic!r}"
        )

    def recreate_topic(self, topic: str, partitions: int = 1) -> None:
        """Delete ``topic`` and create it again, empty: its offsets start over at 0.

        Clients learn it from fresh metadata; what they cached may still name the old topic.
        """
        self.delete_topic(topic)
        self.create_topic(topic, partitions)

    def set_broker_down(self, broker_id: int) -> None:
        """Close the broker's connections and refuse new ones until :meth:`set_broker_up`.

        librdkafka closes the listener and binds a new one to the port at once,
        and aborts the whole process if that bind fails: when a forked child
        still holds the old listener, or when the kernel gave the port to an
        outgoing connection in between. This process must not fork meanwhile;
        the ports are reserved against the second (``ip_local_reserved_ports``,
        where this process may write it) until up.
        """
        self._reserved |= _reserve_ports(self._ports)
        self._check(self._lib.rd_kafka_mock_broker_set_down(self._cluster, broker_id), "broker down")

    def set_broker_up(self, broker_id: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_up(self._cluster, broker_id), "broker up")
        self._release_ports()

    def set_broker_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response of the broker by ``rtt_ms`` (0: none) from now on.

        Connections stay open and nothing is refused: a request sent meanwhile
        is answered ``rtt_ms`` late, as by a broker behind a frozen network.
        """
        self._check(self._lib.rd_kafka_mock_broker_set_rtt(self._cluster, broker_id, rtt_ms), "broker rtt")

    def _release_ports(self) -> None:
        _release_ports(self._reserved)
        self._reserved = set()

    def set_partition_leader(self, topic: str, partition: int, broker_id: int) -> None:
        self._check(
            self._lib.rd_kafka_mock_partition_set_leader(self._cluster, topic.encode(), partition, broker_id),
            "set leader",
        )

    def push_request_errors(self, api_key: int, *errors: int) -> None:
        """Make the next requests with Kafka API ``api_key`` fail with ``errors``, in order."""
        array = (ctypes.c_int * len(errors))(*errors)
        self._lib.rd_kafka_mock_push_request_errors_array(self._cluster, api_key, len(errors), array)

    def clear_request_errors(self, api_key: int) -> None:
        self._lib.rd_kafka_mock_clear_request_errors(self._cluster, api_key)

    def close(self) -> None:
        self._release_ports()
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._cluster = None
        if self._rk:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None

    def __enter__(self) -> InProcessMockCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# What the child answers over its pipe: InProcessMockCluster's methods, by name.
_COMMANDS = frozenset(
    {
        "create_topic",
        "delete_topic",
        "recreate_topic",
        "set_broker_down",
        "set_broker_up",
        "set_broker_rtt",
        "set_partition_leader",
        "push_request_errors",
        "clear_request_errors",
    }
)


class MockKafkaCluster:
    """A mock Kafka cluster of ``brokers`` brokers on 127.0.0.1, served by a child process
    until closed; the same methods as :class:`InProcessMockCluster`.

    Each call is one JSON line to the child's stdin and one answer from its stdout,
    within ``timeout`` seconds. The child exits when its stdin closes, so it does not
    outlive this process.
    """

    def __init__(self, brokers: int = 1, timeout: float = 60.0) -> None:
        self.brokers = brokers
        self._timeout = timeout
        self._lock = threading.Lock()  # one call on the pipe at a time
        self._pending = b""
        self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
            # This file as a script: it needs only confluent-kafka, not the txstore package.
            [sys.executable, os.path.abspath(__file__), "--brokers", str(brokers), "--control"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            started = json.loads(self._answer("starting"))
        except BaseException:
            self.close()
            raise
        self.bootstrap_servers: str = started["bootstrap_servers"]

    @property
    def pid(self) -> int | None:
        """The child's process id (None once closed)."""
        return self._process.pid if self._process is not None else None

    def _answer(self, what: str) -> bytes:
        """The child's next line, within the timeout; raises if it died or said nothing."""
        process = self._process
        if process is None or process.stdout is None:
            raise RuntimeError(f"mock Kafka cluster: {what} after close")
        deadline = time.monotonic() + self._timeout
        fd = process.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                process.kill()  # a late answer would be taken for the next call's: no next call
                raise RuntimeError(
                    f"mock Kafka cluster: no answer to {what} within {self._timeout:g} s; stopped it"
                )
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"mock Kafka cluster: its process exited ({process.wait()}) during {what}")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _call(self, command: str, *args: object) -> None:
        with self._lock:
            process = self._process
            if process is None or process.stdin is None:
                raise RuntimeError(f"mock Kafka cluster: {command} after close")
            try:
                process.stdin.write(json.dumps([command, *args]).encode() + b"\n")
                process.stdin.flush()
            except BrokenPipeError:
                raise RuntimeError(
                    f"mock Kafka cluster: its process exited ({process.wait()}) before {command}"
                ) from None
            answer = json.loads(self._answer(command))
        if answer is not None:
            raise RuntimeError(answer)

    def create_topic(self, topic: str, partitions: int = 1, replication_factor: int = 1) -> None:
        """Create ``topic`` (AdminClient.create_topics does not work against the mock)."""
        self._call("create_topic", topic, partitions, replication_factor)

    def delete_topic(self, topic: str) -> None:
        self._call("delete_topic", topic)

    def recreate_topic(self, topic: str, partitions: int = 1) -> None:
        """Delete ``topic`` and create it again, empty: its offsets start over at 0."""
        self._call("recreate_topic", topic, partitions)

    def set_broker_down(self, broker_id: int) -> None:
        """Close the broker's connections and refuse new ones until :meth:`set_broker_up`."""
        self._call("set_broker_down", broker_id)

    def set_broker_up(self, broker_id: int) -> None:
        self._call("set_broker_up", broker_id)

    def set_broker_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response of the broker by ``rtt_ms`` (0: none) from now on."""
        self._call("set_broker_rtt", broker_id, rtt_ms)

    def set_partition_leader(self, topic: str, partition: int, broker_id: int) -> None:
        self._call("set_partition_leader", topic, partition, broker_id)

    def push_request_errors(self, api_key: int, *errors: int) -> None:
        """Make the next requests with Kafka API ``api_key`` fail with ``errors``, in order."""
        self._call("push_request_errors", api_key, *errors)

    def clear_request_errors(self, api_key: int) -> None:
        self._call("clear_request_errors", api_key)

    def close(self) -> None:
        """End the child: its stdin closes, it destroys the cluster and exits (killed after the timeout)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(timeout=self._timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=self._timeout)
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> MockKafkaCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _serve_control(cluster: InProcessMockCluster) -> None:
    """Answer :class:`MockKafkaCluster`'s calls: a JSON line ``[command, *args]`` on stdin,
    ``null`` or an error's text on stdout; until stdin closes."""
    out = sys.stdout
    out.write(json.dumps({"bootstrap_servers": cluster.bootstrap_servers}) + "\n")
    out.flush()
    for line in sys.stdin:
        command, *args = json.loads(line)
        answer: str | None = None
        if command not in _COMMANDS:
            answer = f"mock Kafka cluster: unknown command {command!r}"
        else:
            try:
                getattr(cluster, command)(*args)
            except Exception as e:
                answer = str(e)
        out.write(json.dumps(answer) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m txstore.testing.mock_kafka",
        description="Serve a Kafka-protocol mock cluster on 127.0.0.1 until stopped (Ctrl-C or SIGTERM).",
    )
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS]",
        help="create a topic (default 4 partitions); repeatable",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help=argparse.SUPPRESS,  # MockKafkaCluster's child: commands on stdin, until it closes
    )
    args = parser.parse_args(argv)
    if args.control:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C is the parent's to handle
        with InProcessMockCluster(args.brokers) as cluster:
            _serve_control(cluster)
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with InProcessMockCluster(args.brokers) as cluster:
        for spec in args.topic:
            name, _, partitions = spec.partition(":")
            cluster.create_topic(name, int(partitions or 4))
        print(cluster.bootstrap_servers, flush=True)
        print(
            f"mock Kafka serving on {cluster.bootstrap_servers}; Ctrl-C to stop", file=sys.stderr, flush=True
        )
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
