"""A real Apache Kafka broker for tests: one KRaft node (broker and controller) on 127.0.0.1.

    with RealKafkaCluster() as kafka:
        kafka.create_topic("events", partitions=4)
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})

The same shape as :class:`~txstore.testing.mock_kafka.MockKafkaCluster`
(``bootstrap_servers``, ``create_topic``, ``delete_topic``, ``recreate_topic``,
a context manager), so a test can take either. Unlike the mock it is Kafka
itself: last stable offsets below open transactions, offsets-for-times,
topic IDs, log recovery after a kill.

Kafka's jars come from Maven Central, once (:mod:`txstore.testing.kafka_jars`):
:func:`kafka_jars` has Maven copy ``org.apache.kafka:kafka_2.13`` (:data:`KAFKA_VERSION`) and
its runtime dependencies, plus an SLF4J provider, into ``~/.cache/txstore/kafka-VERSION/libs``
(``TXSTORE_KAFKA_CACHE`` replaces ``~/.cache/txstore``). Without Maven, or offline with an
empty cache, it raises :class:`KafkaJarsUnavailable` with one line.

Starting is what Kafka's ``bin/kafka-storage.sh format --standalone`` and
``bin/kafka-server-start.sh`` do (:mod:`txstore.testing.kafka_process`): format a log directory
in a fresh temporary directory, then run ``kafka.Kafka`` on two free ports (clients and
controller) with a small heap. The broker's output goes to ``kafka.log`` in that directory; a
broker that does not answer metadata within ``start_timeout`` raises :class:`KafkaStartFailed`
naming that file and its last lines (and the directory is kept for reading).
:meth:`RealKafkaCluster.kill` ends it with SIGKILL, :meth:`RealKafkaCluster.restart` starts it
again on the same ports and log directory; :meth:`RealKafkaCluster.close` stops it (SIGTERM,
then SIGKILL after ``stop_timeout``) and deletes the directory. On Linux the broker is also
killed when the thread that started it dies (``setpriv --pdeathsig``), so a test run that is
killed leaves no broker behind.

``scram_users={"name": "password"}`` adds a second listener, SASL_SSL on its own
port (:attr:`RealKafkaCluster.secure_bootstrap_servers`): TLS with a certificate for
127.0.0.1 signed by a CA made at start (``openssl``; the CA's PEM is
:attr:`RealKafkaCluster.ca_location`, the broker's key and chain a PEM keystore) and
SCRAM-SHA-512 logins for those users, written by ``kafka-storage format --add-scram``
(:mod:`txstore.testing.kafka_tls`).
:meth:`RealKafkaCluster.sasl_ssl_options` gives a client's settings for it. Two more SASL_SSL
listeners serve certificates that CA signed but a client refuses all the same, one expired and
one for another host name (:meth:`RealKafkaCluster.faulty_bootstrap_servers`).

``python -m txstore.testing.real_kafka --topic events:4`` serves one until
stopped; ``--fetch`` only fetches the jars.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from txstore.testing.kafka_jars import (
    CACHE_ENV,
    FETCH_TIMEOUT_SECONDS,
    KAFKA_VERSION,
    KafkaJarsUnavailable,
    cache_root,
    kafka_jars,
    maven_dependencies,
)
from txstore.testing.kafka_process import (
    KafkaStartFailed,
    Listener,
    format_log_directory,
    free_port,
    start_process,
    tail,
    write_config,
)
from txstore.testing.kafka_tls import (
    FAULTY_LISTENERS,
    SCRAM_MECHANISM,
    broker_settings,
    make_certificates,
    make_faulty_certificates,
    scram_format_args,
)
from txstore.testing.mock_kafka import _release_ports, _reserve_ports

__all__ = [  # the names tests, chaos trials, the benchmark and the demo import from here
    "CACHE_ENV",
    "FETCH_TIMEOUT_SECONDS",
    "KAFKA_VERSION",
    "SCRAM_MECHANISM",
    "KafkaJarsUnavailable",
    "KafkaStartFailed",
    "RealKafkaCluster",
    "cache_root",
    "kafka_jars",
    "main",
    "make_certificates",
    "maven_dependencies",
]

START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 20.0
ADMIN_TIMEOUT_SECONDS = 30.0


class RealKafkaCluster:
    """One Apache Kafka node (KRaft broker and controller) on 127.0.0.1, until closed.

    ``jars``: a directory of Kafka's jars (default: :func:`kafka_jars`, which
    may fetch them). ``workdir``: where the log directory, settings and
    ``kafka.log`` go (default: a new temporary directory, deleted on close).
    ``broker_config``: extra ``server.properties`` lines, e.g.
    ``{"log.retention.check.interval.ms": "1000"}``. ``scram_users``: name to
    password; given, the broker also listens with SASL_SSL (SCRAM-SHA-512) on
    :attr:`secure_port`, and on :attr:`faulty_ports` with an expired certificate and one for
    another host name (:data:`~txstore.testing.kafka_tls.FAULTY_LISTENERS`). ``extra_listeners``: more
    plaintext listeners on 127.0.0.1, name -> (port, advertised ``host:port``):
    a client that bootstraps through one is told only its advertised address
    (a proxy's, so that the clients of that listener cannot go around the proxy);
    :attr:`bootstrap_servers` stays the direct ``PLAINTEXT`` listener.
    """

    brokers = 1
    broker_id = 1  # node.id

    def __init__(
        self,
        jars: Path | None = None,
        workdir: Path | None = None,
        broker_config: Mapping[str, str] | None = None,
        start_timeout: float = START_TIMEOUT_SECONDS,
        stop_timeout: float = STOP_TIMEOUT_SECONDS,
        version: str = KAFKA_VERSION,
        scram_users: Mapping[str, str] | None = None,
        extra_listeners: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.version = version
        self.scram_users = dict(scram_users or {})
        self.secure_port = 0
        self.ca_location: Path | None = None  # the CA that signed the SASL_SSL listener's certificate
        self._keystore: Path | None = None
        self._faulty_keystores: dict[str, Path] = {}
        self.faulty_ports: dict[str, int] = {}  # listener name (FAULTY_LISTENERS) to port
        self.extra_listeners = dict(extra_listeners or {})
        self.jars = jars if jars is not None else kafka_jars(version)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="txstore-kafka-")) if workdir is None else workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "kafka.log"
        self._extra = dict(broker_config or {})
        self._process: subprocess.Popen[bytes] | None = None
        self._admin: AdminClient | None = None
        self._reserved: set[str] = set()
        self._closed = False
        self.start_seconds: float | None = None  # how long the last start took
        self.port = 0
        self.controller_port = 0
        try:
            if self.scram_users:
                self.ca_location, self._keystore = make_certificates(self.workdir / "tls")
                self._faulty_keystores = make_faulty_certificates(self.workdir / "tls")
            self._format_and_start()
        except BaseException:
            self._kill_process()
            raise

    # -- starting ---------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_bootstrap_servers(self) -> str:
        """The SASL_SSL listener (only with ``scram_users``)."""
        if not self.scram_users:
            raise RuntimeError("this broker has no SASL_SSL listener: pass scram_users")
        return f"127.0.0.1:{self.secure_port}"

    def sasl_ssl_options(self, user: str, password: str, trust_ca: bool = True) -> dict[str, str]:
        """A client's settings for the SASL_SSL listener (``--kafka-option`` pairs). ``trust_ca``
        False leaves the test CA out: the client checks the certificate against the system's CAs."""
        options = {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": password,
        }
        if trust_ca:
            options["ssl.ca.location"] = str(self.ca_location)
        return options

    def faulty_bootstrap_servers(self, listener: str) -> str:
        """A SASL_SSL listener whose certificate the CA signed but a client refuses:
        ``EXPIRED`` or ``OTHER_HOST`` (:data:`~txstore.testing.kafka_tls.FAULTY_LISTENERS`)."""
        if listener not in self.faulty_ports:
            raise RuntimeError(f"this broker has no {listener} listener: pass scram_users")
        return f"127.0.0.1:{self.faulty_ports[listener]}"

    @property
    def pid(self) -> int | None:
        """The broker's process id (None while it is not running)."""
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        """Whether the broker process is alive (it may still be starting or stopping)."""
        return self._process is not None and self._process.poll() is None

    def _listeners(self) -> list[Listener]:
        """Every client listener: (name, port, advertised ``host:port``, security protocol)."""
        found = [("PLAINTEXT", self.port, f"127.0.0.1:{self.port}", "PLAINTEXT")]
        found += [
            (name, port, advertised, "PLAINTEXT") for name, (port, advertised) in self.extra_listeners.items()
        ]
        if self.scram_users:
            found.append(("SASL_SSL", self.secure_port, f"127.0.0.1:{self.secure_port}", "SASL_SSL"))
        found += [(name, port, f"127.0.0.1:{port}", "SASL_SSL") for name, port in self.faulty_ports.items()]
        return found

    def _write_config(self) -> Path:
        secure = broker_settings(self._keystore, self._faulty_keystores) if self._keystore is not None else {}
        return write_config(
            self.workdir, self.broker_id, self.controller_port, self._listeners(), {**secure, **self._extra}
        )

    def _format_and_start(self) -> None:
        """Format a fresh log directory and start on free ports; new ports once if they were taken."""
        for attempt in (1, 2):
            self.port, self.controller_port = free_port(), free_port()
            while self.controller_port == self.port:
                self.controller_port = free_port()
            if self.scram_users:
                self.secure_port = free_port()
                while self.secure_port in (self.port, self.controller_port):
                    self.secure_port = free_port()
                self.faulty_ports = {}
                for name in FAULTY_LISTENERS:
                    taken = {self.port, self.controller_port, self.secure_port, *self.faulty_ports.values()}
                    port = free_port()
                    while port in taken:
                        port = free_port()
                    self.faulty_ports[name] = port
            config = self._write_config()
            shutil.rmtree(self.workdir / "data", ignore_errors=True)
            self._format(config)
            try:
                self._start()
                return
            except KafkaStartFailed:
                in_use = "Address already in use" in tail(self.log_path, 200)
                if attempt == 2 or not in_use:
                    raise

    def _format(self, config: Path) -> None:
        more = scram_format_args(self.scram_users)
        format_log_directory(self.jars, self.workdir, config, self.log_path, self.start_timeout, more)

    def _start(self) -> None:
        """Run the broker on the ports and log directory set up, and wait until it answers metadata."""
        if self._process is not None:
            raise RuntimeError(f"Kafka is already running (pid {self._process.pid})")
        self._release_ports()
        started = time.monotonic()
        banner = f"--- starting Kafka {self.version} on {self.bootstrap_servers}"
        self._process = start_process(self.jars, self.workdir, self.log_path, banner)
        try:
            self._wait_until_ready(started + self.start_timeout)
        except BaseException:
            self._kill_process()
            self._admin = None
            raise
        self.start_seconds = time.monotonic() - started

    def _failed(self, why: str) -> KafkaStartFailed:
        return KafkaStartFailed(
            f"Kafka {self.version} on {self.bootstrap_servers} {why}; log {self.log_path}:\n"
            f"{tail(self.log_path)}"
        )

    def _wait_until_ready(self, deadline: float) -> None:
        process = self._process
        assert process is not None
        # First the port (no client noise about refused connections), then a metadata answer.
        while True:
            code = process.poll()
            if code is not None:
                raise self._failed(f"exited with {code} while starting")
            if time.monotonic() > deadline:
                raise self._failed(f"did not listen within {self.start_timeout:g} s")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        admin = self.admin()
        while True:
            code = process.poll()
            if code is not None:
                raise self._failed(f"exited with {code} while starting")
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._failed(f"did not answer metadata within {self.start_timeout:g} s")
            try:
                metadata = admin.list_topics(timeout=min(2.0, left))
                if self.broker_id in metadata.brokers:
                    return
            except KafkaException:
                pass
            time.sleep(0.1)

    def admin(self) -> AdminClient:
        """An AdminClient on this broker, kept for the cluster's life (it reconnects after a restart)."""
        if self._admin is None:
            settings: dict[str, Any] = {
                "bootstrap.servers": self.bootstrap_servers,
                "log_level": 0,  # refused connections while down are expected, not news
                "error_cb": lambda _error: None,
                "socket.connection.setup.timeout.ms": 5000,
                "reconnect.backoff.max.ms": 500,
            }
            self._admin = AdminClient(settings)
        return self._admin

    # -- topics -----------------------------------------------------------------
    def create_topic(
        self,
        topic: str,
        partitions: int = 1,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Create ``topic`` and wait until every partition has a leader.

        ``config``: topic settings, e.g. ``{"retention.ms": "1000"}``. Retries for a
        bounded time while a deleted topic of the same name is still being removed.
        """
        deadline = time.monotonic() + ADMIN_TIMEOUT_SECONDS
        while True:
            future = self.admin().create_topics(
                [NewTopic(topic, partitions, replication_factor, config=dict(config or {}))],
                request_timeout=ADMIN_TIMEOUT_SECONDS,
            )[topic]
            try:
                future.result(ADMIN_TIMEOUT_SECONDS)
                break
            except KafkaException as e:
                error = e.args[0]
                still_deleting = (
                    isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
                )
                if not still_deleting or time.monotonic() > deadline:
                    raise RuntimeError(f"creating topic {topic!r} failed: {error}") from None
                time.sleep(0.2)
        self._wait_for(
            lambda: self._leaders(topic) == partitions,
            f"topic {topic!r}: {partitions} partitions with leaders",
        )

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` and wait until the broker's metadata no longer names it."""
        future = self.admin().delete_topics([topic], request_timeout=ADMIN_TIMEOUT_SECONDS)[topic]
        try:
            future.result(ADMIN_TIMEOUT_SECONDS)
        except KafkaException as e:
            raise RuntimeError(f"deleting topic {topic!r} failed: {e.args[0]}") from None
        self._wait_for(lambda: self._leaders(topic) is None, f"topic {topic!r} gone from metadata")

    def recreate_topic(
        self, topic: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Delete ``topic`` and create it again, empty, with a new topic ID: offsets start over at 0."""
        self.delete_topic(topic)
        self.create_topic(topic, partitions, config=config)

    def _leaders(self, topic: str) -> int | None:
        """How many partitions of ``topic`` have a leader now (None: no such topic)."""
        found = self.admin().list_topics(topic, timeout=ADMIN_TIMEOUT_SECONDS).topics.get(topic)
        if found is None or (
            found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            return None
        return sum(1 for p in found.partitions.values() if p.leader >= 0 and p.error is None)

    def _wait_for(self, condition: Any, what: str) -> None:
        deadline = time.monotonic() + ADMIN_TIMEOUT_SECONDS
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Kafka on {self.bootstrap_servers}: no {what} within {ADMIN_TIMEOUT_SECONDS:g} s"
                )
            time.sleep(0.05)

    # -- stopping and restarting ------------------------------------------------
    def _ports(self) -> set[str]:
        """Every port the broker listens on (kept reserved while it is down)."""
        return {
            str(self.port),
            str(self.controller_port),
            *(str(p) for p, _ in self.extra_listeners.values()),
            *([str(self.secure_port)] if self.secure_port else []),
            *(str(p) for p in self.faulty_ports.values()),
        }

    def kill(self) -> None:
        """SIGKILL the broker (no controlled shutdown); :meth:`restart` recovers its log."""
        process = self._process
        if process is None:
            return
        self._reserved |= _reserve_ports(self._ports())
        self._kill_process()

    def stop(self) -> None:
        """Stop the broker: SIGTERM (controlled shutdown), SIGKILL after ``stop_timeout``."""
        process = self._process
        if process is None:
            return
        self._reserved |= _reserve_ports(self._ports())
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self._kill_process()
        self._process = None

    def restart(self) -> None:
        """Stop the broker if it runs, then start it again on the same ports and log directory."""
        if self._closed:
            raise RuntimeError("Kafka cluster is closed")
        self.stop()
        self._start()

    def _kill_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(self.stop_timeout)

    def _release_ports(self) -> None:
        _release_ports(self._reserved)
        self._reserved = set()

    def close(self) -> None:
        """Stop the broker and delete its directory (unless one was given)."""
        if self._closed:
            return
        self._closed = True
        self._admin = None
        try:
            self.stop()
        finally:
            self._release_ports()
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RealKafkaCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m txstore.testing.real_kafka",
        description=f"Serve Apache Kafka {KAFKA_VERSION} (one KRaft node) on 127.0.0.1 until stopped "
        "(Ctrl-C or SIGTERM).",
    )
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS]",
        help="create a topic (default 4 partitions); repeatable",
    )
    parser.add_argument("--fetch", action="store_true", help="only fetch the jars (Maven) and print where")
    args = parser.parse_args(argv)
    try:
        jars = kafka_jars()
    except KafkaJarsUnavailable as e:
        print(f"real_kafka: {e}", file=sys.stderr)
        return 1
    if args.fetch:
        print(jars)
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        with RealKafkaCluster(jars) as cluster:
            for spec in args.topic:
                name, _, partitions = spec.partition(":")
                cluster.create_topic(name, int(partitions or 4))
            print(cluster.bootstrap_servers, flush=True)
            print(
                f"Kafka {cluster.version} serving on {cluster.bootstrap_servers} (started in "
                f"{cluster.start_seconds or 0:.1f} s, pid {cluster.pid}, log {cluster.log_path}); "
                "Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            while not stop.wait(1.0):
                if not cluster.running():
                    print(
                        f"real_kafka: Kafka exited; its log ends:\n{tail(cluster.log_path)}", file=sys.stderr
                    )
                    return 1
    except KafkaStartFailed as e:
        print(f"real_kafka: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
