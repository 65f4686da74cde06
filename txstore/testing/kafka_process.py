"""Running Apache Kafka's JVM for the test broker: its settings, its storage, its process.

What Kafka's ``bin/kafka-storage.sh format --standalone`` and ``bin/kafka-server-start.sh`` do,
without the scripts (the jars come from Maven, :mod:`txstore.testing.kafka_jars`):

1. :func:`write_config`: ``server.properties`` for one KRaft node (broker and controller) whose
   client listeners are given once, as (name, port, advertised ``host:port``, protocol), so
   ``listeners``, ``advertised.listeners`` and the protocol map cannot disagree; and a
   ``log4j2.properties`` that keeps warnings, errors and the line saying the server is up;
2. :func:`format_log_directory`: ``kafka.tools.StorageTool format`` with a random cluster ID;
3. :func:`start_process`: ``kafka.Kafka`` in a session of its own, its output appended to the
   log file, and on Linux killed with the thread that started it (``setpriv --pdeathsig``), so
   a test run that is killed leaves no broker behind.

Each failure is a :class:`KafkaStartFailed` naming the log file and its last lines
(:func:`tail`). :class:`~txstore.testing.real_kafka.RealKafkaCluster` puts these together, with
the ports, the waiting, restarts and topics.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

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

Listener = tuple[str, int, str, str]
"""A client listener: its name, port on 127.0.0.1, advertised ``host:port`` and security protocol."""


class KafkaStartFailed(RuntimeError):
    """The broker did not start, or did not answer metadata in time."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cluster_id() -> str:
    """A random Kafka cluster ID (``kafka-storage.sh random-uuid``: base64url, no padding)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka's Uuid.randomUuid() avoids these too
            return text


def tail(path: Path, lines: int = 15) -> str:
    """The last non-blank ``lines`` of a log file, for an error message."""
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


def java_command(jars: Path, workdir: Path, main: str, *args: str) -> list[str]:
    """Run ``main`` of Kafka's jars with the test broker's JVM options and ``workdir``'s logging."""
    return [
        _java(),
        *JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
        "-cp",
        f"{jars}/*",
        main,
        *args,
    ]


def write_config(
    workdir: Path,
    node_id: int,
    controller_port: int,
    listeners: Sequence[Listener],
    more: Mapping[str, str],
) -> Path:
    """``workdir/server.properties`` for one KRaft node with ``listeners`` (the first is the
    inter-broker ``PLAINTEXT`` one) and a controller on ``controller_port``, its data in
    ``workdir/data``; ``more`` settings last, so they win. Also ``workdir/log4j2.properties``."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": ",".join(
            [
                *(f"{name}://127.0.0.1:{port}" for name, port, _, _ in listeners),
                f"CONTROLLER://127.0.0.1:{controller_port}",
            ]
        ),
        "advertised.listeners": ",".join(f"{name}://{a}" for name, _, a, _ in listeners),
        "listener.security.protocol.map": ",".join(
            ["CONTROLLER:PLAINTEXT", *(f"{name}:{protocol}" for name, _, _, protocol in listeners)]
        ),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(workdir / "data"),
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
        **more,
    }
    path = workdir / "server.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    (workdir / "log4j2.properties").write_text(_LOG4J2)
    return path


def format_log_directory(
    jars: Path, workdir: Path, config: Path, log_path: Path, timeout: float, more: Sequence[str] = ()
) -> None:
    """Format the log directory ``config`` names (``kafka-storage format --standalone``, a new
    cluster ID; ``more`` arguments such as ``--add-scram``), its output appended to ``log_path``."""
    command = java_command(
        jars,
        workdir,
        "kafka.tools.StorageTool",
        "format",
        "--standalone",
        "-t",
        cluster_id(),
        "-c",
        str(config),
        *more,
    )
    with open(log_path, "ab") as log:
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise KafkaStartFailed(
                f"formatting Kafka's log directory took over {timeout:g} s; log {log_path}:\n{tail(log_path)}"
            ) from None
    if done.returncode != 0:
        raise KafkaStartFailed(
            f"formatting Kafka's log directory failed (exit {done.returncode}); "
            f"log {log_path}:\n{tail(log_path)}"
        )


def start_process(jars: Path, workdir: Path, log_path: Path, banner: str) -> subprocess.Popen[bytes]:
    """``kafka.Kafka`` on ``workdir/server.properties``, started, not waited for: ``banner`` and
    then its output appended to ``log_path``."""
    command = java_command(jars, workdir, "kafka.Kafka", str(workdir / "server.properties"))
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is not None:  # the broker dies with the thread that started it
        command = [setpriv, "--pdeathsig", "KILL", *command]
    with open(log_path, "ab") as log:
        log.write(f"{banner}\n".encode())
        log.flush()
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal is the test run's to handle
        )
