"""A real Apache Kafka broker for tests: one KRaft node (broker and controller) on 127.0.0.1.

    with RealKafkaCluster() as kafka:
        kafka.create_topic("events", partitions=4)
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})

The same shape as :class:`~txstore.testing.mock_kafka.MockKafkaCluster`
(``bootstrap_servers``, ``create_topic``, ``delete_topic``, ``recreate_topic``,
a context manager), so a test can take either. Unlike the mock it is Kafka
itself: last stable offsets below open transactions, offsets-for-times,
topic IDs, log recovery after a kill.

Kafka's jars come from Maven Central, once: :func:`kafka_jars` has Maven copy
``org.apache.kafka:kafka_2.13`` (:data:`KAFKA_VERSION`) and its runtime
dependencies, plus an SLF4J provider, into ``~/.cache/txstore/kafka-VERSION/libs``
(``TXSTORE_KAFKA_CACHE`` replaces ``~/.cache/txstore``). Without Maven, or
offline with an empty cache, it raises :class:`KafkaJarsUnavailable` with one line.

Starting is what Kafka's ``bin/kafka-storage.sh format --standalone`` and
``bin/kafka-server-start.sh`` do: format a log directory in a fresh temporary
directory, then run ``kafka.Kafka`` on two free ports (clients and controller)
with a small heap. The broker's output goes to ``kafka.log`` in that
directory; a broker that does not answer metadata within ``start_timeout``
raises :class:`KafkaStartFailed` naming that file and its last lines (and the
directory is kept for reading). :meth:`RealKafkaCluster.kill` ends it with
SIGKILL, :meth:`RealKafkaCluster.restart` starts it again on the same ports
and log directory; :meth:`RealKafkaCluster.close` stops it (SIGTERM, then
SIGKILL after ``stop_timeout``) and deletes the directory. On Linux the
broker is also killed when the thread that started it dies (``setpriv
--pdeathsig``), so a test run that is killed leaves no broker behind.

``scram_users={"name": "password"}`` adds a second listener, SASL_SSL on its own
port (:attr:`RealKafkaCluster.secure_bootstrap_servers`): TLS with a certificate for
127.0.0.1 signed by a CA made at start (``openssl``; the CA's PEM is
:attr:`RealKafkaCluster.ca_location`, the broker's key and chain a PEM keystore) and
SCRAM-SHA-512 logins for those users, written by ``kafka-storage format --add-scram``.
:meth:`RealKafkaCluster.sasl_ssl_options` gives a client's settings for it.

``python -m txstore.testing.real_kafka --topic events:4`` serves one until
stopped; ``--fetch`` only fetches the jars.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from txstore.testing.mock_kafka import _release_ports, _reserve_ports

KAFKA_VERSION = "4.1.2"
"""The Apache Kafka release the tests run (``org.apache.kafka:kafka_2.13``)."""
LOG4J_VERSION = "2.25.3"  # the log4j-core Kafka 4.1.2 depends on; its SLF4J 1.7 provider
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
FETCH_TIMEOUT_SECONDS = 300.0  # within pytest-timeout's 600 s for the test whose fixture fetches
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 20.0
ADMIN_TIMEOUT_SECONDS = 30.0
CACHE_ENV = "TXSTORE_KAFKA_CACHE"
JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:TieredStopAtLevel=1",  # C1 only: starts faster on a busy machine; a test broker moves little data
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)
_COMPLETE = ".complete"  # written last into libs/: the copy is whole

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txstore.testing</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""

# Warnings and errors only, plus the line that says the server is up.
_LOG4J2 = """status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


class KafkaJarsUnavailable(RuntimeError):
    """Kafka's jars are not cached and Maven cannot fetch them (not installed, or offline)."""

    not_published = False  # Maven Central has no such artifact (asking again will not help)


class KafkaStartFailed(RuntimeError):
    """The broker did not start, or did not answer metadata in time."""


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "txstore"


def _first_error(output: str) -> str:
    """Maven's first ``[ERROR]`` line without its prefix or colours (else its last line)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    lines = [line.strip() for line in plain.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("[ERROR]"):
            return line.removeprefix("[ERROR]").strip().removesuffix("-> [Help 1]").strip()
    return lines[-1] if lines else "no output"


def kafka_jars(version: str = KAFKA_VERSION, timeout: float = FETCH_TIMEOUT_SECONDS) -> Path:
    """The directory of Kafka ``version``'s jars, fetched by Maven the first time.

    Raises :class:`KafkaJarsUnavailable` with one line when the jars are not cached and Maven
    is missing or fails (:func:`maven_dependencies`).
    """
    return maven_dependencies(
        cache_root() / f"kafka-{version}",
        _POM.format(kafka=version, log4j=LOG4J_VERSION),
        f"Kafka {version}'s jars (org.apache.kafka:kafka_2.13:{version})",
        "kafka_2.13-",
        timeout,
    )


def maven_dependencies(home: Path, pom: str, what: str, expected: str, timeout: float) -> Path:
    """``home/libs``: the runtime dependencies of ``pom``, copied there by Maven the first time.

    Safe to call from several processes at once (a lock file in ``home``; the copy is renamed
    into place whole, marked complete last). A jar whose name starts with ``expected`` must be
    among them. Raises :class:`KafkaJarsUnavailable` in one line naming ``what`` when Maven is
    missing, takes longer than ``timeout`` or fails (its output kept in ``home/mvn.log``;
    ``not_published`` set when Maven Central has no such artifact).
    """
    libs = home / "libs"
    if (libs / _COMPLETE).exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaJarsUnavailable(
            f"{what} are not in {libs} and Maven (mvn) is not on PATH to fetch them; "
            "install it (apt-get install maven)"
        )
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching: wait for it
        if (libs / _COMPLETE).exists():
            return libs
        work = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
        try:
            (work / "pom.xml").write_text(pom)
            command = [
                mvn,
                "-B",
                "-q",
                "-Dstyle.color=never",
                "-f",
                str(work / "pom.xml"),
                f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
                f"-DoutputDirectory={work / 'libs'}",
                "-DincludeScope=runtime",
            ]
            log = home / "mvn.log"
            try:
                done = subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise KafkaJarsUnavailable(
                    f"Maven did not fetch {what} within {timeout:g} s; is Maven Central reachable?"
                ) from None
            log.write_text(done.stdout)
            jars = sorted((work / "libs").glob("*.jar")) if (work / "libs").is_dir() else []
            if done.returncode != 0 or not any(j.name.startswith(expected) for j in jars):
                error = KafkaJarsUnavailable(
                    f"Maven could not fetch {what} (exit {done.returncode}, output in {log}): "
                    f"{_first_error(done.stdout)}"
                )
                error.not_published = (
                    "Could not find artifact" in done.stdout or "was not found in" in done.stdout
                )
                raise error
            (work / "libs" / _COMPLETE).write_text("".join(f"{j.name}\n" for j in jars))
            if libs.exists():
                shutil.rmtree(libs)  # an incomplete copy left by a killed fetch
            (work / "libs").rename(libs)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return libs


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cluster_id() -> str:
    """A random Kafka cluster ID (``kafka-storage.sh random-uuid``: base64url, no padding)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka's Uuid.randomUuid() avoids these too
            return text


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(cannot read it: {e})"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept) if kept else "(empty)"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise KafkaStartFailed(
            "Kafka needs Java 17 or newer on PATH (apt-get install openjdk-17-jre-headless)"
        )
    return found


SCRAM_MECHANISM = "SCRAM-SHA-512"
CERTIFICATE_DAYS = 7


def _openssl(workdir: Path, *args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise KafkaStartFailed("a SASL_SSL listener needs openssl on PATH (apt-get install openssl)")
    done = subprocess.run(
        [openssl, *args], cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise KafkaStartFailed(
            f"openssl {args[0]} failed (exit {done.returncode}): {lines[-1] if lines else ''}"
        )


def make_certificates(directory: Path) -> tuple[Path, Path]:
    """A CA, and a certificate for 127.0.0.1 (and localhost) it signs, valid for a week:
    ``(the CA's PEM, the broker's PEM keystore: unencrypted PKCS#8 key, then its chain)``."""
    directory.mkdir(parents=True, exist_ok=True)
    days = str(CERTIFICATE_DAYS)
    _openssl(
        directory,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        days,
        "-subj",
        "/CN=txstore test CA",
    )
    _openssl(
        directory,
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "broker.key",
        "-out",
        "broker.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        directory,
        "x509",
        "-req",
        "-in",
        "broker.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "broker.pem",
        "-days",
        days,
        "-extfile",
        "san.cnf",
    )
    keystore = directory / "broker-keystore.pem"
    keystore.write_text(
        (directory / "broker.key").read_text()
        + (directory / "broker.pem").read_text()
        + (directory / "ca.pem").read_text()
    )
    return directory / "ca.pem", keystore


class RealKafkaCluster:
    """One Apache Kafka node (KRaft broker and controller) on 127.0.0.1, until closed.

    ``jars``: a directory of Kafka's jars (default: :func:`kafka_jars`, which
    may fetch them). ``workdir``: where the log directory, settings and
    ``kafka.log`` go (default: a new temporary directory, deleted on close).
    ``broker_config``: extra ``server.properties`` lines, e.g.
    ``{"log.retention.check.interval.ms": "1000"}``. ``scram_users``: name to
    password; given, the broker also listens with SASL_SSL (SCRAM-SHA-512) on
    :attr:`secure_port`. ``extra_listeners``: more
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

    @property
    def pid(self) -> int | None:
        """The broker's process id (None while it is not running)."""
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        """Whether the broker process is alive (it may still be starting or stopping)."""
        return self._process is not None and self._process.poll() is None

    def _secure_settings(self) -> dict[str, str]:
        if not self.scram_users:
            return {}
        return {  # the listener itself is in _listeners
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self._keystore),
            "ssl.client.auth": "none",
        }

    def _listeners(self) -> list[tuple[str, int, str, str]]:
        """Every client listener: (name, port, advertised ``host:port``, security protocol)."""
        found = [("PLAINTEXT", self.port, f"127.0.0.1:{self.port}", "PLAINTEXT")]
        found += [
            (name, port, advertised, "PLAINTEXT") for name, (port, advertised) in self.extra_listeners.items()
        ]
        if self.scram_users:
            found.append(("SASL_SSL", self.secure_port, f"127.0.0.1:{self.secure_port}", "SASL_SSL"))
        return found

    def _write_config(self) -> Path:
        listeners = self._listeners()
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.broker_id),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": ",".join(
                [
                    *(f"{name}://127.0.0.1:{port}" for name, port, _, _ in listeners),
                    f"CONTROLLER://127.0.0.1:{self.controller_port}",
                ]
            ),
            "advertised.listeners": ",".join(f"{name}://{a}" for name, _, a, _ in listeners),
            "listener.security.protocol.map": ",".join(
                ["CONTROLLER:PLAINTEXT", *(f"{name}:{protocol}" for name, _, _, protocol in listeners)]
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",  # txstore never creates topics: tests create theirs
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # After a kill, the restarted controller unfences the broker only once the old
            # registration's session has expired: 4 s instead of 9 s makes such a restart take
            # about 8 s rather than 13-17 s here (heartbeats every 0.5 s keep a live one in).
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "4000",
            "num.network.threads": "2",
            "num.io.threads": "4",
            **self._secure_settings(),
            **self._extra,
        }
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        return path

    def _java_command(self, main: str, *args: str) -> list[str]:
        return [
            _java(),
            *JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            f"{self.jars}/*",
            main,
            *args,
        ]

    def _format_and_start(self) -> None:
        """Format a fresh log directory and start on free ports; new ports once if they were taken."""
        for attempt in (1, 2):
            self.port, self.controller_port = _free_port(), _free_port()
            while self.controller_port == self.port:
                self.controller_port = _free_port()
            if self.scram_users:
                self.secure_port = _free_port()
                while self.secure_port in (self.port, self.controller_port):
                    self.secure_port = _free_port()
            config = self._write_config()
            shutil.rmtree(self.workdir / "data", ignore_errors=True)
            self._format(config)
            try:
                self._start()
                return
            except KafkaStartFailed:
                in_use = "Address already in use" in _tail(self.log_path, 200)
                if attempt == 2 or not in_use:
                    raise

    def _format(self, config: Path) -> None:
        scram = [
            arg
            for name, password in sorted(self.scram_users.items())
            for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]")
        ]
        command = self._java_command(
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            _cluster_id(),
            "-c",
            str(config),
            *scram,
        )
        with open(self.log_path, "ab") as log:
            try:
                done = subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=self.start_timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise KafkaStartFailed(
                    f"formatting Kafka's log directory took over {self.start_timeout:g} s; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                ) from None
        if done.returncode != 0:
            raise KafkaStartFailed(
                f"formatting Kafka's log directory failed (exit {done.returncode}); "
                f"log {self.log_path}:\n{_tail(self.log_path)}"
            )

    def _start(self) -> None:
        """Run the broker on the ports and log directory set up, and wait until it answers metadata."""
        if self._process is not None:
            raise RuntimeError(f"Kafka is already running (pid {self._process.pid})")
        self._release_ports()
        command = self._java_command("kafka.Kafka", str(self.workdir / "server.properties"))
        setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
        if setpriv is not None:  # the broker dies with the thread that started it
            command = [setpriv, "--pdeathsig", "KILL", *command]
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"--- starting Kafka {self.version} on {self.bootstrap_servers}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is the test run's to handle
            )
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
            f"{_tail(self.log_path)}"
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
                        f"real_kafka: Kafka exited; its log ends:\n{_tail(cluster.log_path)}", file=sys.stderr
                    )
                    return 1
    except KafkaStartFailed as e:
        print(f"real_kafka: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
