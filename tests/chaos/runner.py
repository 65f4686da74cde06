"""One chaos trial: count_topic as users run it, under faults, then an exact check.

A trial (everything about it follows from its seed, so a failure can be
replayed with ``python -m tests.chaos --replay SEED``):

1. a new topic with several partitions, keyed messages produced before the job
   starts and all through the fault window;
2. ``jobs/count_topic.py --interval`` started as a real process (``python`` or
   ``spark-submit``, or with ``connect`` a Spark Connect client of a server the
   trials share), talking to PostgreSQL through a proxy the runner can cut;
3. once it has run its first batch, the fault window: faults at random moments
   (see :data:`FAULT_KINDS`), crashed or killed instances restarted;
4. the faults stop (fail points switch themselves off, ``TXSTORE_FAILPOINTS_UNTIL``;
   the broker and the proxy heal): extra instances are stopped, one catches up
   and is stopped with SIGTERM (a fresh one if none is left);
5. the check: the topic total (and, with ``--by key`` among the plan's job
   flags, every key's count)
   equals what Kafka holds, every stored offset equals its log end, and the
   last instance exited 0. Any unexplained exit or timeout fails the trial too.

The events a job must stop on (a recreated topic, a poison message) or publish
in parts are in :mod:`tests.chaos.events`: their injection, the operator's step
after a stop, and what the end must show; the runner calls them through hooks.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from tests.chaos.events import EVENT_FAULT_KINDS, OPERATOR_EXITS, TrialEvents, compatible, plan_job_args
from tests.chaos.procs import (
    TAG_ENV,
    busy,
    handles,
    kill,
    kill_tagged,
    python_workers,
    server_python_workers,
    start_logged,
    tagged,
)
from tests.chaos.proxy import TcpProxy, frozen_network_available
from tests.chaos.real_broker import ChaosRealKafka
from tests.chaos.standalone import SPARK_HOME, StandaloneCluster
from tests.chaos.transactions import TransactionalTraffic
from tests.helpers.spark_connect import SparkConnectServer
from txstore.core.ranges import OffsetRange
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader, close_idle_consumers
from txstore.postgres.migrate import upgrade
from txstore.testing.mock_kafka import MockKafkaCluster

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "count_topic.py"

TASK_POINTS = ("before-upsert", "between-upsert-and-offsets", "before-commit", "after-commit")
DRIVER_POINTS = ("after-plan", "between-batches")

FAULT_KINDS = (
    "kill-python-worker",  # kill -9 of a PySpark worker while it runs a task
    "kill-driver",  # kill -9 of the job's process while a batch runs, then a restart
    *(f"fp-{p}" for p in TASK_POINTS + DRIVER_POINTS),  # TXSTORE_FAILPOINTS, raise or exit
    "pg-terminate",  # pg_terminate_backend of connections inside a transaction
    "pg-unreachable",  # the proxy drops every connection and refuses new ones for seconds
    "kafka-down",  # the broker down for seconds
    "kafka-request-errors",  # Fetch / ListOffsets / Metadata requests fail
    "speculation",  # speculative task copies (standalone cluster; counted from the event log)
    "second-instance",  # another instance of the same job at the same time
    "instance-during-batch",  # another instance started while one runs a batch
    "pg-frozen",  # the proxy stops forwarding for seconds, closing and refusing nothing
    "kafka-frozen",  # the broker answers every request seconds late, closing and refusing nothing
    *EVENT_FAULT_KINDS,  # topic-recreated, poison-message, oversized-publish (tests/chaos/events.py)
)
# Under Spark Connect (``launch == "connect"``: the job is a Connect client, ``--remote sc://``,
# of a server the runner shares between trials) every kind means what it means on classic,
# with the driver split in two: kill-driver kills the client process mid-batch (the server
# may finish the batch's tasks after its client is gone, as an abandoned driver's would);
# kill-python-worker kills a Python worker of the server's executor; task fail points
# ship with the tasks and fire in the server's workers. Excluded there:
CONNECT_EXCLUDED = (
    # Speculative copies need the standalone cluster with speculation switched on; the
    # Connect server is local[2,4], configured once for every trial it serves (its
    # Spark configuration is the server's, a client cannot turn speculation on).
    "speculation",
)
# On real Apache Kafka (``--kafka real``, tests/chaos/real_broker.py) the jobs reach the broker
# through a proxy the broker advertises, so kafka-down drops and refuses the job's connections
# there (the proxy's outage) and kafka-frozen freezes its network (the proxy's freeze: packets
# dropped, as for pg-frozen). Three kinds only a real broker has:
REAL_KAFKA_FAULT_KINDS = (
    "kafka-killed-mid-read",  # SIGKILL of the broker while a task reads, then a restart
    "kafka-killed-mid-commit",  # SIGKILL of the broker while a task is inside its commit transaction
    "aborted-transactions",  # a transactional producer commits some transactions, aborts others
)
# The kinds a real-Kafka trial's first fault rotates over (the others are drawn from every kind
# that runs there): the point of those trials is the broker.
REAL_KAFKA_FIRST_KINDS = (*REAL_KAFKA_FAULT_KINDS, "kafka-frozen", "kafka-down")
REAL_KAFKA_EXCLUDED = (
    # The mock's request-error injection (push_request_errors) has no counterpart on a real broker.
    "kafka-request-errors",
)
# Run on real Kafka when asked for (--faults), not drawn: the operator's step after a recreation
# was written against the mock (no topic IDs, a topic auto-created by a producer) and has passed
# only a few trials on a real broker; drawing it would also change what every real seed plans.
REAL_KAFKA_OPT_IN = ("topic-recreated",)
# Known, but only run when asked for (--faults): none now. Adding kinds to FAULT_KINDS
# changes what every seed plans (README, "Chaos testing").
OPT_IN_FAULT_KINDS: tuple[str, ...] = ()
# The job's frozen PostgreSQL connections fail in seconds (the defaults take 30 s).
FROZEN_PEER_PARAMS = "tcp_user_timeout=4000&keepalives_idle=2&keepalives_interval=1&keepalives_count=2"

# Retriable Kafka errors: LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT.
KAFKA_ERRORS = (5, 6, 7)
KAFKA_APIS = {"Fetch": 1, "ListOffsets": 2, "Metadata": 3}

# Faults that need a task in flight: their trials also stall some tasks (sleep
# fail points) so that "in the middle of a task" is a window, not an instant.
DRIVER_EXIT_SECONDS = 5.0  # from a driver fail point's raise to its process's exit, at most
# Stops with an event's line tolerated after the operator's step; more is the trial's failure
# (it used to restart instances for good).
OPERATOR_RESTARTS = 3
SPECULATION_ALLOWANCE = 20.0  # more time with stragglers, for Spark to speculate on them
# A make-up instance (Trial._make_up_missed_fail_points) runs until its point fires, for at most
# this long to its first batch (on the loaded 2-core machine: a fresh spark-submit's first batch
# took 42 s beside two other instances, a Spark Connect client's 50-65 s), then this much longer.
MAKE_UP_FIRST_BATCH_SECONDS = 180.0
MAKE_UP_AFTER_FIRST_BATCH_SECONDS = 15.0
# A speculation make-up instance stalls tasks this long after its first batch, at most.
MAKE_UP_SPECULATION_SECONDS = 60.0
NEEDS_SLOW_TASKS = {
    "kill-python-worker",
    "kill-driver",
    "pg-terminate",
    "instance-during-batch",
    "speculation",
    "kafka-killed-mid-read",
    "kafka-killed-mid-commit",
}


# -- the plan -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialPlan:
    seed: int
    faults: tuple[str, ...]
    fault_times: tuple[float, ...]  # seconds into the fault window
    partitions: int
    keys: int
    initial_messages: int
    window: float
    interval: float
    launch: str  # "python", "spark-submit", or "connect" (python jobs/count_topic.py --remote sc://...)
    max_offsets_per_batch: int | None
    failpoints: str
    job_args: tuple[str, ...] = ()  # more count_topic flags, e.g. ("--by", "key", "--commit", "per-batch")
    kafka: str = (
        "mock"  # "mock" (librdkafka's mock cluster) or "real" (Apache Kafka, tests/chaos/real_broker.py)
    )

    @property
    def standalone(self) -> bool:
        return "speculation" in self.faults

    @property
    def connect(self) -> bool:
        return self.launch == "connect"

    @property
    def real_kafka(self) -> bool:
        return self.kafka == "real"

    @classmethod
    def generate(
        cls,
        seed: int,
        faults: Sequence[str] | None = None,
        intense: bool = False,
        job_args: Sequence[str] = (),
        connect: bool = False,
        kafka: str = "mock",
    ) -> TrialPlan:
        """The trial for ``seed``: its first fault kind rotates with the seed, 0-2 more at random.

        ``intense``: fail points fire more often and batches come faster, so that a
        short trial surely injects every fault it plans (the CI subset).
        ``job_args``: how the job counts (``--by key``, ``--commit per-batch``, ...);
        by default the topic total, committed per range.
        ``connect``: the job runs as a Spark Connect client (without the kinds in
        :data:`CONNECT_EXCLUDED`); the other draws are the classic plan's.
        ``kafka``: "real" runs on Apache Kafka: the first kind rotates over
        :data:`REAL_KAFKA_FIRST_KINDS`, the others come from every kind that runs there.
        """
        if kafka not in ("mock", "real"):
            raise ValueError(f"kafka must be 'mock' or 'real', not {kafka!r}")
        real = kafka == "real"
        rng = random.Random(seed)
        if faults is None:
            kinds = [k for k in kinds_for(kafka) if not (connect and k in CONNECT_EXCLUDED)]
            rotation = REAL_KAFKA_FIRST_KINDS if real else kinds
            first = rotation[seed % len(rotation)]
            others = [k for k in kinds if k not in (first, "speculation")]
            faults = (first, *rng.sample(others, rng.choice((0, 1, 1, 2))))
        faults = compatible(faults)
        wrong = set(faults) - set(kinds_for(kafka)) - set(REAL_KAFKA_OPT_IN if real else ())
        if wrong & (set(FAULT_KINDS) | set(REAL_KAFKA_FAULT_KINDS)):
            raise ValueError(f"fault kinds {sorted(wrong)} do not run on the {kafka} broker")
        if connect and set(faults) & set(CONNECT_EXCLUDED):
            excluded = ", ".join(sorted(set(faults) & set(CONNECT_EXCLUDED)))
            raise ValueError(f"fault kinds {excluded} do not run under Spark Connect (CONNECT_EXCLUDED)")
        unknown = set(faults) - set(FAULT_KINDS) - set(OPT_IN_FAULT_KINDS) - set(REAL_KAFKA_FAULT_KINDS)
        if unknown:
            known = ", ".join(FAULT_KINDS + OPT_IN_FAULT_KINDS + REAL_KAFKA_FAULT_KINDS)
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {known}")
        window = rng.uniform(6.0, 11.0) + (10.0 if "speculation" in faults else 0.0)
        plan = cls(
            seed=seed,
            faults=tuple(faults),
            fault_times=tuple(round(rng.uniform(0.0, window * 0.7), 2) for _ in faults),
            partitions=rng.randint(2, 6),
            keys=rng.randint(1, 12),
            initial_messages=rng.randint(100, 3000),
            window=round(window, 1),
            interval=0.3 if intense else rng.choice((0.3, 0.5, 1.0)),
            launch=rng.choice(("python", "spark-submit")),
            max_offsets_per_batch=rng.choice((None, None, rng.randint(200, 2000))),
            failpoints=_failpoints(rng, faults, intense),
        )
        args, keys = plan_job_args(rng, faults, job_args)  # what the event faults need
        launch = "connect" if connect else plan.launch
        return dataclasses.replace(plan, job_args=args, keys=keys or plan.keys, launch=launch, kafka=kafka)

    @property
    def driver_points(self) -> tuple[str, ...]:
        """The fail points that fire in the job's own process: with --commit per-batch
        the driver commits, so the sink's fire there too."""
        return DRIVER_POINTS + (TASK_POINTS if "per-batch" in self.job_args else ())

    @property
    def counts_per_key(self) -> bool:
        return "--by" in self.job_args


def kinds_for(kafka: str) -> tuple[str, ...]:
    """The fault kinds that run on the ``kafka`` broker ("mock" or "real")."""
    if kafka == "real":
        drawn = (*REAL_KAFKA_EXCLUDED, *REAL_KAFKA_OPT_IN)
        return tuple(k for k in FAULT_KINDS if k not in drawn) + REAL_KAFKA_FAULT_KINDS
    return FAULT_KINDS


def _failpoints(rng: random.Random, faults: Sequence[str], intense: bool = False) -> str:
    points = []
    for kind in faults:
        if not kind.startswith("fp-"):
            continue
        name = kind.removeprefix("fp-")
        action = rng.choice(("raise", "exit"))
        # Driver points fire once per batch; keep the job mostly alive between crashes.
        probability = rng.uniform(0.15, 0.3) if name in DRIVER_POINTS else rng.uniform(0.1, 0.35)
        if intense:
            probability = 0.2 if name in DRIVER_POINTS else 0.4
        points.append(f"{name}:{action}@{probability:.2f}")
    if NEEDS_SLOW_TASKS & set(faults):
        long = "speculation" in faults
        name = rng.choice(TASK_POINTS[:3])
        seconds = rng.uniform(1.5, 3.0) if long else rng.uniform(0.3, 1.5)
        chance = 0.5 if intense else rng.uniform(0.2, 0.5)
        points.append(f"{name}:sleep={seconds:.2f}@{chance:.2f}")
    return ",".join(points)


# -- results --------------------------------------------------------------------------------------
@dataclass
class TrialResult:
    plan: TrialPlan
    produced: int = 0
    counted: int = 0
    lost: int = 0
    duplicated: int = 0
    injected: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    events: collections.Counter[str] = field(default_factory=collections.Counter)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures and self.lost == 0 and self.duplicated == 0

    def line(self) -> str:
        faults = " ".join(f"{k}={v}" for k, v in sorted(self.injected.items())) or "none"
        events = " ".join(f"{k}={v}" for k, v in sorted(self.events.items()))
        # One line, whatever the failures quote (a command's output has newlines): the
        # summary is rebuilt from these lines (``--summarize``).
        status = "ok" if self.ok else "FAILED: " + "; ".join(f.replace("\n", " / ") for f in self.failures)
        return (
            f"trial seed {self.plan.seed}: {status}; injected {faults}; produced {self.produced}, "
            f"counted {self.counted}, lost {self.lost}, duplicated {self.duplicated}; "
            f"{events}; {self.seconds:.0f}s"
        )


@dataclass
class Summary:
    seed: int | None = None
    results: list[TrialResult] = field(default_factory=list)
    kafka: str = "mock"

    def add(self, result: TrialResult) -> None:
        self.results.append(result)

    @property
    def injected(self) -> collections.Counter[str]:
        total: collections.Counter[str] = collections.Counter()
        for r in self.results:
            total.update(r.injected)
        return total

    @property
    def failed(self) -> list[TrialResult]:
        return [r for r in self.results if not r.ok]

    def line(self) -> str:
        injected = self.injected
        listed = kinds_for(self.kafka)
        everything = dict.fromkeys(listed + FAULT_KINDS + OPT_IN_FAULT_KINDS + REAL_KAFKA_FAULT_KINDS)
        kinds = " ".join(f"{k}={injected[k]}" for k in everything if k in listed or injected[k])
        produced = sum(r.produced for r in self.results)
        counted = sum(r.counted for r in self.results)
        retried = sum(r.events["failed-task-attempts"] for r in self.results)
        failed = ",".join(str(r.plan.seed) for r in self.failed) or "none"
        broker = ", real Kafka" if self.kafka == "real" else ""
        return (
            f"chaos: {len(self.results)} trials (seed {self.seed}{broker}), faults injected: {kinds}; "
            f"Spark task attempts failed and retried {retried}; messages produced {produced}, "
            f"counted {counted}, lost {sum(r.lost for r in self.results)}, "
            f"duplicated {sum(r.duplicated for r in self.results)}; failed trials: {failed}"
        )


# -- what the trials share --------------------------------------------------------------------------
class ChaosEnvironment:
    """The broker, a fresh database, the proxy in front of it, and (lazily) a standalone cluster
    and a Spark Connect server.

    ``kafka``: "mock" (librdkafka's mock cluster, in a child process) or "real" (Apache Kafka,
    the jobs' connections through a proxy of its own: :mod:`tests.chaos.real_broker`).
    """

    def __init__(
        self,
        admin_url: str,
        directory: Path | None = None,
        connect_server: SparkConnectServer | None = None,
        kafka: str = "mock",
    ) -> None:
        self.tag = f"chaos-{os.getpid()}-{int(time.time())}"
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="txstore-chaos-")
        self.directory = directory or Path(self._tmp.name)  # type: ignore[union-attr]
        self.directory.mkdir(parents=True, exist_ok=True)
        self.admin_url = admin_url
        self.real_kafka: ChaosRealKafka | None = None
        self.kafka: MockKafkaCluster | ChaosRealKafka
        if kafka == "real":
            self.kafka = self.real_kafka = ChaosRealKafka(self.directory / "kafka")
        else:
            self.kafka = MockKafkaCluster(brokers=1)
        # What the jobs are given: on the real broker, the proxy it advertises.
        self.job_bootstrap_servers = (
            self.real_kafka.job_bootstrap_servers if self.real_kafka else self.kafka.bootstrap_servers
        )
        self.database = f"txstore_chaos_{os.getpid()}"
        self._cluster: StandaloneCluster | None = None
        # Given (the tests' session server): used, not stopped; else started on first use.
        self._connect_server, self._own_connect_server = connect_server, connect_server is None
        self.startups: list[float] = []  # seconds from starting a job to its first batch, by trial
        info = psycopg.conninfo.conninfo_to_dict(admin_url)
        # In a network namespace of its own where possible, so that pg-frozen is a real freeze.
        self.proxy = TcpProxy(
            str(info.get("host", "127.0.0.1")),
            int(str(info.get("port", 5432))),
            frozen_network=frozen_network_available(),
        )
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self.database_url = _with_database(admin_url, self.database)
        self.job_database_url = (
            _with_database(admin_url, self.database, port=self.proxy.port, host=self.proxy.host)
            + f"?{FROZEN_PEER_PARAMS}"
        )
        upgrade(self.database_url)

    @property
    def startup_seconds(self) -> float:
        """How long a job takes to its first batch: the slowest of the last five (the machine
        is shared), so that fail points rarely switch off before the fault window ends."""
        return max(self.startups[-5:], default=25.0)

    def standalone(self) -> StandaloneCluster:
        if self._cluster is None:
            self._cluster = StandaloneCluster(self.directory / "standalone", f"{self.tag}-cluster-")
        return self._cluster

    def spark_connect(self) -> SparkConnectServer:
        if self._connect_server is None:
            self._connect_server = SparkConnectServer(self.directory / "spark-connect")
        return self._connect_server

    def connect(self) -> psycopg.Connection:
        """A direct connection for checks (never through the proxy; not named txstore)."""
        return psycopg.connect(self.database_url, autocommit=True, application_name="txstore-chaos")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            kill_tagged(self.tag)
        if self._cluster is not None:
            self._cluster.close()
        if self._connect_server is not None and self._own_connect_server:
            self._connect_server.close()
        self.proxy.close()
        close_idle_consumers()  # the checks' readers, before their broker goes away
        self.kafka.close()
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> ChaosEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _with_database(url: str, database: str, port: int | None = None, host: str = "127.0.0.1") -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = database
    if port is not None:
        info["host"], info["port"] = host, str(port)
    user = info.get("user", "postgres")
    password = f":{info['password']}" if info.get("password") else ""
    return (
        f"postgresql://{user}{password}@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{database}"
    )


# -- job instances ----------------------------------------------------------------------------------
@dataclass
class Instance:
    number: int
    tag: str
    process: subprocess.Popen[bytes]
    log_path: Path
    failpoints: str
    primary: bool
    launch: str
    killed: bool = False  # SIGKILLed by the runner
    stopping: bool = False  # SIGTERM sent by the runner
    reported: bool = False  # its exit has been judged

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def last_lines(self, n: int = 3) -> str:
        lines = [line for line in self.log().splitlines() if line.strip()]
        return " | ".join(lines[-n:])[-600:]

    def alive(self) -> bool:
        return self.process.poll() is None


def driver_pid(inst: Instance) -> int | None:
    """The pid of the instance's Python driver (the process itself, or spark-submit's child)."""
    if inst.launch in ("python", "connect"):
        return inst.process.pid
    for p in tagged(inst.tag):
        program = os.path.basename(p.cmdline.split(" ")[0])
        if p.tag == inst.tag and program.startswith("python") and "count_topic.py" in p.cmdline:
            return p.pid
    return None


FIRED = re.compile(r"txstore fail point ([\w-]+): (raise|exit|sleep) \(attempt \d+\)")


_FIRST_BATCH = re.compile(r" batch \d+: |: batch failed ")
# The job's PostgreSQL sessions inside a transaction (pg_stat_activity; the database a parameter).
_JOB_IN_TRANSACTION = (
    "datname = %s AND application_name = 'txstore' AND xact_start IS NOT NULL AND state <> 'idle'"
)


class Trial:
    def __init__(self, env: ChaosEnvironment, plan: TrialPlan, log: Callable[[str], None]) -> None:
        self.env = env
        self.plan = plan
        self.say = log
        self.rng = random.Random(plan.seed * 7919 + 1)
        self.tag = f"{env.tag}-t{plan.seed}-"
        self.topic = f"chaos-{plan.seed}-{os.getpid()}"
        self.job = f"chaos_{plan.seed}"
        self.directory = env.directory / f"trial-{plan.seed}"
        self.event_logs = self.directory / "events"
        self.event_logs.mkdir(parents=True, exist_ok=True)
        self.result = TrialResult(plan)
        self.instances: list[Instance] = []
        self.lock = threading.Lock()
        self.stop_producing = threading.Event()
        self.window_over = threading.Event()
        self.window_kept_open = threading.Event()  # past its end, for a fault awaiting its moment
        self.delivered = 0
        self.until = 0.0
        self.delivery_errors: list[str] = []
        self.pause_producing = threading.Event()  # set: the producer flushes, drops itself and waits
        self.producing_paused = threading.Event()
        self.key_grain = "key+window" if "--window" in plan.job_args else "key"
        self.events = TrialEvents(self)
        self.transactions: TransactionalTraffic | None = None  # the aborted-transactions kind's producer
        # Where this trial's part of the Connect server's log (task fail points) begins.
        self.server_log_start = self._server_log_size()

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> TrialResult:
        started = time.monotonic()
        producer: threading.Thread | None = None
        faults: list[threading.Thread] = []
        try:
            if self.plan.standalone:
                self.env.standalone()  # started once, before the clock of the fail points runs
            if self.plan.connect:
                self.env.spark_connect()  # likewise
                self.server_log_start = self._server_log_size()
            self.env.kafka.create_topic(self.topic, self.plan.partitions)
            self.events.prepare()
            self._produce(self.plan.initial_messages, random.Random(self.plan.seed * 31 + 3))
            # Fail points switch themselves off at `until`: then the running
            # instances can catch up as they are, without a restart.
            # The first batch comes after about `startup_seconds` (measured on earlier trials).
            launched = time.time()
            self.until = launched + self.env.startup_seconds + self.plan.window
            if self.plan.standalone:
                self.until += SPECULATION_ALLOWANCE
            self.start_instance(self.plan.failpoints, primary=True)
            self._await_first_batch()
            if not self.plan.standalone:
                self.env.startups.append(time.time() - launched)
            producer = threading.Thread(target=self._produce_during_window, daemon=True)
            producer.start()
            window_start = time.monotonic()
            window_end = max(window_start + self.plan.window, window_start + self.until - time.time())
            pending = sorted(zip(self.plan.fault_times, self.plan.faults, strict=True))
            while time.monotonic() < window_end or self._faults_awaiting_moment(pending, faults):
                if time.monotonic() >= window_end:
                    self.window_kept_open.set()  # the producers trickle: a moment, not a backlog
                now = time.monotonic() - window_start
                while pending and pending[0][0] <= now:
                    _, kind = pending.pop(0)
                    thread = threading.Thread(target=self._inject, args=(kind,), daemon=True, name=kind)
                    thread.start()
                    faults.append(thread)
                self._supervise()
                time.sleep(0.1)
            self._make_up_missed_fail_points()
            self._make_up_missed_speculation()
            self.window_over.set()
            self.stop_producing.set()
            producer.join(timeout=90)
            for thread in faults:  # a recreation waits for the operator's step
                thread.join(timeout=180)
            self._heal()
            self._catch_up_and_stop()
            self._check()
        except Exception as e:  # a trial that cannot finish is a failed trial, with the reason
            self.result.failures.append(f"{type(e).__name__}: {e}")
        finally:
            self.window_over.set()
            self.stop_producing.set()
            self._heal()
            kill_tagged(self.tag)
            for inst in self.instances:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    inst.process.wait(timeout=30)
            self._count_from_logs()
            self.result.seconds = time.monotonic() - started
        return self.result

    def _faults_awaiting_moment(
        self, pending: list[tuple[float, str]], faults: list[threading.Thread]
    ) -> bool:
        """Whether the window stays open past its end for faults still waiting for their moment
        (producing and supervising go on). A batch job's faults end with the window."""
        return False

    def _make_up_missed_fail_points(self) -> None:
        """Inject each planned fail point that has not fired yet, once, in a fresh instance.

        A driver point is checked once per batch and a crash costs a restart, so a slow
        machine can spend a whole window without the draw coming up. The make-up
        instance runs beside the others with only that point on, certain to fire
        (task points on a task's first attempt only), until it fires or
        :data:`MAKE_UP_AFTER_FIRST_BATCH_SECONDS` after its own first batch (its first
        batch may plan ranges the others commit before it gets there); then it is
        stopped, so the catch-up runs with every fault over. The bound counts from its
        first batch, not from an estimate of the start-up: a fresh instance beside
        running ones on a loaded machine starts much slower than the trial's first did
        (a CI run stopped one before its first batch, and the point never fired).
        """
        fired = self._fired(self._logs())
        for kind in self.plan.faults:
            if not kind.startswith("fp-") or fired[kind]:
                continue
            name = kind.removeprefix("fp-")
            action = self.rng.choice(("raise", "exit"))
            spec = f"{name}:{action}" if name in DRIVER_POINTS else f"{name}:{action}@first"
            self.say(f"  {kind} had not fired in the window; making it up")
            started = time.monotonic()
            deadline = started + MAKE_UP_FIRST_BATCH_SECONDS
            until = time.time() + MAKE_UP_FIRST_BATCH_SECONDS + MAKE_UP_AFTER_FIRST_BATCH_SECONDS
            inst = self.start_instance(spec, primary=False, until=until)
            first_batch = False
            while time.monotonic() < deadline and inst.alive() and not self._fired(self._logs())[kind]:
                if not first_batch and _FIRST_BATCH.search(inst.log()):
                    first_batch = True
                    deadline = time.monotonic() + MAKE_UP_AFTER_FIRST_BATCH_SECONDS
                self._supervise()
                time.sleep(0.2)
            if inst.alive():  # SIGTERM: a task point's batch finishes on the retry, then it exits
                self._stop(inst)
            self._supervise()

    def _make_up_missed_speculation(self) -> None:
        """Stall tasks in a fresh instance until Spark speculates on one, where the window saw
        no speculative copy.

        The trial's stalls are switched off at ``until``, counted from the instance's launch;
        on a loaded machine a standalone job can spend most of that waiting for its two
        executors (a CI run's seed 106 stalled 2 tasks in its window and Spark copied
        neither). The make-up instance runs the trial's own sleep point beside the others,
        with its clock counted from its own first batch, and is stopped as soon as Spark's
        event log shows a speculative copy, or :data:`MAKE_UP_SPECULATION_SECONDS` after
        that first batch (then the trial fails its every-fault-kind check, as before).
        """
        if (
            "speculation" not in self.plan.faults
            or _event_counts(self.event_logs)["speculative-task-attempts"]
        ):
            return
        sleeps = [p for p in self.plan.failpoints.split(",") if ":sleep=" in p]
        if not sleeps:
            return
        self.say("  speculation had not happened in the window; making it up")
        deadline = time.monotonic() + MAKE_UP_FIRST_BATCH_SECONDS
        until = time.time() + MAKE_UP_FIRST_BATCH_SECONDS + MAKE_UP_SPECULATION_SECONDS
        inst = self.start_instance(sleeps[0], primary=False, until=until)
        first_batch = False
        while time.monotonic() < deadline and inst.alive():
            if _event_counts(self.event_logs)["speculative-task-attempts"]:
                break
            if not first_batch and _FIRST_BATCH.search(inst.log()):
                first_batch = True
                deadline = time.monotonic() + MAKE_UP_SPECULATION_SECONDS
            self._supervise()
            time.sleep(0.5)
        if inst.alive():
            self._stop(inst)
        self._supervise()

    def _logs(self, events: _EventCounts | None = None) -> str:
        """The jobs' own output so far, with the executors' on a standalone cluster and the
        Connect server's since this trial began (where task fail points report)."""
        logs = "\n".join(inst.log() for inst in self.instances)
        if self.plan.standalone:
            app_ids = (events or _event_counts(self.event_logs)).app_ids
            logs += "\n" + self.env.standalone().executor_logs(app_ids)
        if self.plan.connect:
            with open(self.env.spark_connect().log, "rb") as f:
                f.seek(self.server_log_start)
                logs += "\n" + f.read().decode(errors="replace")
        return logs

    def _server_log_size(self) -> int:
        if not self.plan.connect:
            return 0
        with contextlib.suppress(OSError):
            return self.env.spark_connect().log.stat().st_size
        return 0

    @staticmethod
    def _fired(logs: str) -> collections.Counter[str]:
        """Fail points fired, by kind (``fp-NAME``); sleeps, which only stall a task, as
        ``stalled-tasks``."""
        fired: collections.Counter[str] = collections.Counter()
        for name, action in FIRED.findall(logs):
            fired["stalled-tasks" if action == "sleep" else f"fp-{name}"] += 1
        return fired

    def start_instance(self, failpoints: str, primary: bool, until: float | None = None) -> Instance:
        """Start an instance of the trial's job (:meth:`_instance_command` says how), its output in
        ``instance-N.log``."""
        with self.lock:
            number = len(self.instances) + 1
            tag = f"{self.tag}i{number}-"
            log_path = self.directory / f"instance-{number}.log"
            command, env, launch = self._instance_command(tag, failpoints, until)
            process = start_logged(command, env, log_path, self.directory)
            inst = Instance(number, tag, process, log_path, failpoints, primary, launch)
            self.instances.append(inst)
        self.say(f"  instance {number} started ({self._started_as(failpoints)})")
        return inst

    def _instance_command(
        self, tag: str, failpoints: str, until: float | None
    ) -> tuple[list[str], dict[str, str], str]:
        """The command of an instance tagged ``tag``, its environment, and how it is launched."""
        args = [*self._job_args(), "--interval", str(self.plan.interval), "--max-batch-failures", "1000"]
        if self.plan.max_offsets_per_batch:
            args += ["--max-offsets-per-batch", str(self.plan.max_offsets_per_batch)]
        args += self.plan.job_args
        args += self.events.instance_args()
        spark = self._spark_args(tag)
        env = self._instance_env(tag, ("TXSTORE_", "KAFKA_", "PYSPARK_", "PYTHONPATH", "SPARK_"))
        if failpoints:
            env["TXSTORE_FAILPOINTS"] = failpoints
            env["TXSTORE_FAILPOINTS_UNTIL"] = f"{until or self.until:.3f}"
        if self.plan.connect:  # a client: its Spark configuration is the server's
            command = [sys.executable, str(JOB), *args, "--remote", self.env.spark_connect().url]
        elif self.plan.launch == "python":
            env["PYSPARK_SUBMIT_ARGS"] = shlex.join([*spark, "pyspark-shell"])
            command = [sys.executable, str(JOB), *args]
        else:
            command = [str(SPARK_HOME / "bin" / "spark-submit"), *spark, str(JOB), *args]
        return command, env, self.plan.launch

    def _started_as(self, failpoints: str) -> str:
        """How :meth:`start_instance` says an instance was started."""
        return f"{self.plan.launch}{', fail points ' + failpoints if failpoints else ''}"

    def _job_args(self) -> list[str]:
        """The job's broker, database, topic and name: the flags every instance starts with."""
        return [
            "--bootstrap-servers",
            self.env.job_bootstrap_servers,
            "--database-url",
            self.env.job_database_url,
            "--topic",
            self.topic,
            "--job",
            self.job,
        ]

    @staticmethod
    def _instance_env(tag: str, drop: tuple[str, ...], **more: str) -> dict[str, str]:
        """This process's environment less the variables named with a prefix in ``drop`` (what
        would set the job up otherwise), with Spark's Python and home, ``tag`` and ``more``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env.update(
            {
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
                "SPARK_HOME": str(SPARK_HOME),
                TAG_ENV: tag,
                **more,
            }
        )
        return env

    def _spark_args(self, tag: str) -> list[str]:
        conf = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.task.maxFailures": "4",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": f"file://{self.event_logs}",
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
        }
        if self.plan.standalone:
            master = self.env.standalone().url
            conf.update(
                {
                    # One 2-core executor per worker ("host"): a straggler's copy finds a free core.
                    "spark.cores.max": "4",
                    "spark.executor.cores": "2",
                    # ... once both executors are there. Spark's default starts scheduling at 80%
                    # of the cores or after 30 s; an executor later than that (a loaded machine)
                    # leaves every task on one host, where Spark never runs a copy. A CI run's
                    # speculation trial (seed 106) stalled 12 tasks and copied none; its logs
                    # were gone, so this is the likely cause, not a proven one.
                    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                    "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
                    "spark.executor.memory": "512m",
                    f"spark.executorEnv.{TAG_ENV}": tag,
                    "spark.speculation": "true",
                    "spark.speculation.interval": "100ms",
                    "spark.speculation.multiplier": "1.5",
                    "spark.speculation.quantile": "0.25",
                    "spark.speculation.minTaskRuntime": "100ms",
                    "spark.speculation.efficiency.enabled": "false",
                }
            )
        else:
            master = "local[2,4]"  # 2 cores, up to 4 attempts per task
        args = ["--master", master, "--driver-java-options", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        return args

    def _await_first_batch(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._supervise()
            # A first batch that failed (every attempt of a task hit a fail point) counts too.
            if any(_FIRST_BATCH.search(inst.log()) for inst in self.instances):
                return
            time.sleep(0.2)
        raise TimeoutError(f"no instance ran a batch within {timeout:.0f}s")

    # -- producing -------------------------------------------------------------------------------
    def _producer(self) -> Producer:
        return Producer(self._producer_config())

    def _producer_config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.env.kafka.bootstrap_servers,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
            "log_level": 2,
        }

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self.delivered += 1
            self.events.delivered(msg)
        else:
            self.delivery_errors.append(str(err))

    def _produce(self, n: int, rng: random.Random, producer: Producer | None = None) -> None:
        own = producer is None
        producer = producer or self._producer()
        for _ in range(n):
            key = f"k{rng.randrange(self.plan.keys)}".encode()
            while True:
                try:
                    producer.produce(self.topic, value=b"v", key=key, on_delivery=self._on_delivery)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
        if own and producer.flush(120) != 0:
            raise RuntimeError("the producer could not deliver the initial messages in 120s")

    def _produce_during_window(self) -> None:
        """Produce until the window ends; while ``pause_producing`` is set, with everything
        delivered and no producer (a recreated topic needs a new idempotent producer)."""
        producer: Producer | None = self._producer()
        rng = random.Random(self.plan.seed * 31 + 7)
        while not self.stop_producing.wait(rng.uniform(0.05, 0.5)):
            if self.pause_producing.is_set():
                if producer is not None and producer.flush(120) != 0:
                    self.delivery_errors.append("messages still undelivered after 120s")
                producer = None
                self.producing_paused.set()
                continue
            if producer is None:
                self.producing_paused.clear()
                producer = self._producer()
            self._produce(rng.randint(1, 20 if self.window_kept_open.is_set() else 200), rng, producer)
        if producer is not None and producer.flush(120) != 0:
            self.delivery_errors.append("messages still undelivered after 120s")

    # -- faults ------------------------------------------------------------------------------------
    def _inject(self, kind: str) -> None:
        try:
            injected = getattr(self, "_fault_" + kind.replace("-", "_"), lambda: False)()
        except Exception as e:
            self.result.failures.append(f"injecting {kind} failed: {type(e).__name__}: {e}")
            return
        if injected:
            with self.lock:
                self.result.injected[kind] += 1
            self.say(f"  injected {kind}")
        elif not kind.startswith("fp-") and kind not in ("speculation", "oversized-publish"):
            self.say(f"  {kind}: no moment found to inject it")
            self.result.events[f"missed-{kind}"] += 1

    def _alive(self) -> list[Instance]:
        with self.lock:
            return [i for i in self.instances if i.alive() and not i.stopping]

    def _busy_worker(self, timeout: float = 25.0) -> tuple[Instance, int] | None:
        """An instance with a Python worker in the middle of a task, and that worker."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.window_over.is_set():
            if self.plan.connect:
                found = self._busy_server_worker()
                if found is not None:
                    return found
            for inst in self._alive():
                for worker in python_workers(inst.tag):
                    if busy(worker.pid):
                        return inst, worker.pid
            time.sleep(0.02)
        return None

    def _busy_server_worker(self) -> tuple[Instance, int] | None:
        """Under Connect the workers are the server's, shared by the trial's clients: a busy
        one is some client's batch; with one client alive that is surely its batch, with
        several the primary's is assumed (a client shows nothing of the batch it waits on)."""
        alive = self._alive()
        if not alive:
            return None
        for worker in server_python_workers(self.env.spark_connect().process.pid):
            if busy(worker.pid):
                return next((i for i in alive if i.primary), alive[0]), worker.pid
        return None

    def _busy_workers(self) -> int:
        """How many Python workers of the alive instances are in the middle of a task now."""
        return sum(1 for inst in self._alive() for w in python_workers(inst.tag) if busy(w.pid))

    def _fault_kill_python_worker(self) -> bool:
        found = self._busy_worker()
        return found is not None and kill(found[1])

    def _fault_kill_driver(self) -> bool:
        found = self._busy_worker()
        if found is None:
            return False
        inst = found[0]
        was_primary, inst.primary, inst.killed = inst.primary, False, True
        # python jobs/count_topic.py (under Connect the client: its server goes on), or spark-submit's JVM
        if not kill(inst.process.pid):
            return False
        self.start_instance(inst.failpoints, primary=was_primary)
        return True

    def _fault_pg_terminate(self) -> bool:
        return self._terminate_in_transaction(25)

    def _terminate_in_transaction(self, seconds: float, past_the_window: bool = False) -> bool:
        """pg_terminate_backend of the job's sessions inside a transaction, as soon as there is one
        within ``seconds`` (and before the window is over, unless ``past_the_window``)."""
        deadline = time.monotonic() + seconds
        with self.env.connect() as conn:
            while time.monotonic() < deadline and (past_the_window or not self.window_over.is_set()):
                rows = conn.execute(
                    f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {_JOB_IN_TRANSACTION}",
                    (self.env.database,),
                ).fetchall()
                if any(ok for (ok,) in rows):
                    return True
                time.sleep(0.02)
        return False

    def _fault_pg_unreachable(self) -> bool:
        seconds = self.rng.uniform(1.0, 5.0)
        self.env.proxy.outage(seconds)
        time.sleep(seconds)
        return True

    def _fault_pg_frozen(self) -> bool:
        """Freeze the job's PostgreSQL network for 1-8 s: shorter than the job's tcp_user_timeout
        (4 s), connections carry on where they were; longer, they fail and are retried."""
        seconds = self.rng.uniform(1.0, 8.0)
        self.env.proxy.freeze()
        try:
            time.sleep(seconds)
        finally:
            self.env.proxy.thaw()
        return True

    def _fault_kafka_down(self) -> bool:
        if self.env.real_kafka is not None:  # the jobs' connections dropped, new ones refused
            seconds = self.rng.uniform(1.0, 5.0)
            self.env.real_kafka.proxy.outage(seconds)
            time.sleep(seconds)
            return True
        assert isinstance(self.env.kafka, MockKafkaCluster)
        self.env.kafka.set_broker_down(1)
        try:
            time.sleep(self.rng.uniform(1.0, 5.0))
        finally:
            self.env.kafka.set_broker_up(1)
        return True

    def _fault_kafka_frozen(self) -> bool:
        """Delay every answer of the broker by 1-8 s for as long: its connections stay open,
        requests in that time are answered that late (the mock's round-trip time; a proxy
        cannot freeze it, clients connect to the address the broker advertises)."""
        seconds = self.rng.uniform(1.0, 8.0)
        if self.env.real_kafka is not None:  # the jobs' network to the broker frozen (the proxy)
            self.env.real_kafka.proxy.freeze()
            try:
                time.sleep(seconds)
            finally:
                self.env.real_kafka.proxy.thaw()
            return True
        assert isinstance(self.env.kafka, MockKafkaCluster)
        self.env.kafka.set_broker_rtt(1, int(seconds * 1000))
        try:
            time.sleep(seconds)
        finally:
            self.env.kafka.set_broker_rtt(1, 0)
        return True

    def _fault_kafka_request_errors(self) -> bool:
        assert isinstance(self.env.kafka, MockKafkaCluster)
        api = self.rng.choice(sorted(KAFKA_APIS.values()))
        errors = [self.rng.choice(KAFKA_ERRORS) for _ in range(self.rng.randint(1, 8))]
        self.env.kafka.push_request_errors(api, *errors)
        return True

    def _jobs_in_transaction(self) -> int:
        """How many of the job's PostgreSQL sessions are inside a transaction now."""
        with self.env.connect() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM pg_stat_activity WHERE {_JOB_IN_TRANSACTION}", (self.env.database,)
            ).fetchone()
        return int(row[0]) if row else 0

    def _kill_broker_when(self, moment: Callable[[], bool]) -> bool:
        """SIGKILL the real broker at a moment ``moment`` finds (within 25 s of the broker being
        up), keep it down for 0-3 s, then restart it (its log recovered) and wait until it answers."""
        real = self.env.real_kafka
        assert real is not None
        real.await_outage_end()  # another kill's restart: its moment comes once the broker is back
        deadline = time.monotonic() + 25
        while not moment():
            if time.monotonic() > deadline or self.window_over.is_set():
                return False
            time.sleep(0.02)
        seconds = real.kill_and_restart(self.rng.uniform(0.0, 3.0))
        self.say(f"  broker restarted in {seconds:.1f}s")
        return True

    def _fault_kafka_killed_mid_read(self) -> bool:
        """While a Python worker runs a task and fewer job sessions than busy workers are inside
        a transaction: some task is reading (or aggregating what it read), not committing."""

        def reading() -> bool:
            busy_workers = self._busy_workers()
            return busy_workers > 0 and self._jobs_in_transaction() < busy_workers

        return self._kill_broker_when(reading)

    def _fault_kafka_killed_mid_commit(self) -> bool:
        """While a job session is inside its commit transaction (the sleep fail points stall
        tasks there)."""
        return self._kill_broker_when(lambda: self._jobs_in_transaction() > 0)

    def _fault_aborted_transactions(self) -> bool:
        """Transactions committed and aborted until the window ends (tests/chaos/transactions.py)."""
        traffic = TransactionalTraffic(
            self.env.kafka.bootstrap_servers,
            self.topic,
            self.plan.partitions,
            self.plan.keys,
            random.Random(self.plan.seed * 131 + 11),
            self.stop_producing,
            self.say,
        )
        self.transactions = traffic
        traffic.run()
        done = traffic.transactions
        self.result.events["transactions-committed"] += done["committed"]
        self.result.events["transactions-aborted"] += done["aborted"]
        self.result.events["transactions-fenced"] += done["fenced"]
        self.result.events["aborted-messages"] += traffic.count(traffic.aborted)
        self.say(
            f"  transactions: {done['committed']} committed ({traffic.count(traffic.committed)} messages), "
            f"{done['aborted']} aborted ({traffic.count(traffic.aborted)}), {done['fenced']} fenced"
        )
        return done["aborted"] > 0

    def _fault_topic_recreated(self) -> bool:
        return self.events.inject_topic_recreated()

    def _fault_poison_message(self) -> bool:
        return self.events.inject_poison_message()

    def _fault_oversized_publish(self) -> bool:
        """Planned into the job's flags, counted from what was published; in some trials the
        broker also refuses publishing for good once (rows set aside, then --retry-failed)."""
        if self.events.inject_publish_refused():
            self.result.events["publish-refused"] += 1
        return False

    def _fault_second_instance(self) -> bool:
        self.start_instance(self.plan.failpoints, primary=False)
        return True

    def _fault_instance_during_batch(self) -> bool:
        if self._busy_worker() is None:
            return False
        self.start_instance(self.plan.failpoints, primary=False)
        return True

    # -- supervision -------------------------------------------------------------------------------
    def _supervise(self) -> None:
        """Judge every instance that exited; restart the primary if it crashed."""
        for inst, reason in self._judge_exits():
            if reason in OPERATOR_EXITS:  # stopped by an event: the operator restarts it
                inst.primary = False
            self._restart_if_primary(inst)
        if self.events.operator_due(len(self._alive())):
            self.events.operate()
            self.start_instance("" if self.window_over.is_set() else self.plan.failpoints, primary=True)

    def _judge_exits(self) -> Iterator[tuple[Instance, str | None]]:
        """Each instance that exited since the last look, one at a time, with why
        (:meth:`_exit_reason`): counted as an event, or None, the trial's failure."""
        with self.lock:
            exited = [i for i in self.instances if not i.alive() and not i.reported]
        for inst in exited:
            inst.reported = True
            reason = self._exit_reason(inst)
            if reason is None:
                self.result.failures.append(
                    f"instance {inst.number} exited {inst.process.returncode} unexpectedly: {inst.last_lines()}"
                )
            else:
                self.result.events[reason] += 1
            yield inst, reason

    def _restart_if_primary(self, inst: Instance) -> None:
        """An exited primary is replaced by a new one with its fail points, until the window is over."""
        if inst.primary and not inst.stopping and not self.window_over.is_set():
            inst.primary = False
            self.start_instance(inst.failpoints, primary=True)

    def _exit_reason(self, inst: Instance) -> str | None:
        """Why an instance exited, if that was expected; None for an unexplained exit."""
        event = self.events.exit_reason(inst)
        if event is not None:
            return event
        code = inst.process.returncode
        log = inst.log()
        if inst.killed and code == -signal.SIGKILL:
            return "driver-killed"
        if inst.stopping and code == 0:
            return "stopped"
        if code == 137 and any(f"txstore fail point {p}: exit" in log for p in self.plan.driver_points):
            return "driver-fail-point-exit"
        last = inst.last_lines(2)
        if code == 1 and "InjectedFailure: fail point" in last:
            return "driver-fail-point-raise"
        return None

    def _heal(self) -> None:
        real = self.env.real_kafka
        if real is not None:
            real.proxy.heal()
            self.env.proxy.heal()
            try:
                real.ensure_running()
            except Exception as e:
                self.result.failures.append(f"the broker did not start again: {type(e).__name__}: {e}")
            return
        assert isinstance(self.env.kafka, MockKafkaCluster)
        with contextlib.suppress(Exception):
            self.env.kafka.set_broker_up(1)
        with contextlib.suppress(Exception):
            self.env.kafka.set_broker_rtt(1, 0)
        for api in (*KAFKA_APIS.values(), 0):  # 0: Produce, refused by oversized-publish
            with contextlib.suppress(Exception):
                self.env.kafka.clear_request_errors(api)
        self.env.proxy.heal()

    # -- ending ------------------------------------------------------------------------------------
    def _stop(self, inst: Instance, timeout: float = 120.0) -> None:
        """SIGTERM to the Python driver: the current batch finishes, then the job exits 0.

        Under spark-submit the driver is the JVM's child; a SIGTERM to the JVM
        would stop Spark under the running batch instead.
        """
        inst.stopping = True
        # Signal it once it handles SIGTERM: a job still starting its interpreter would
        # just die of it, as any process does (spark-submit starts Python late).
        deadline = time.monotonic() + timeout
        while inst.alive() and time.monotonic() < deadline:
            driver = driver_pid(inst)
            if driver is not None and handles(driver, signal.SIGTERM):
                kill(driver, signal.SIGTERM)
                break
            time.sleep(0.1)
        try:
            inst.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.result.failures.append(
                f"instance {inst.number} did not stop within {timeout:.0f}s of SIGTERM: {inst.last_lines()}"
            )
            kill(inst.process.pid)
            inst.process.wait(timeout=30)
            inst.reported = True
            return
        self._supervise()

    def _catch_up_and_stop(self) -> None:
        """Faults are over (fail points expired): one instance catches up, the others stop."""
        alive = self._alive()
        keep = next((i for i in alive if i.primary), alive[0] if alive else None)
        for inst in alive:
            if inst is not keep:
                self._stop(inst)
        self._supervise()
        if keep is None or not keep.alive():  # the operator's step may have started one
            keep = self._primary_or_new("")
        keep.primary = True
        ends = self._log_ends()
        deadline = time.monotonic() + 240
        # A fail point in the driver that fired just before the faults ended can end its
        # process a moment after: give that time to show, and then an exit the fail point
        # explains is not the catch-up's failure; a clean instance takes over.
        settle = self.until + DRIVER_EXIT_SECONDS if self._driver_may_fail(keep) else 0.0
        stops_after_operator = 0
        while (
            self._offsets() != ends
            or time.time() < settle
            or not self.events.settled()
            or not self._caught_up()
        ):
            if not keep.alive():
                self._supervise()
                if self._exit_reason(keep) in OPERATOR_EXITS:  # stopped by an event: the operator
                    if self.events.awaiting is not None:  # step waits for the others to stop
                        for inst in self._alive():
                            self._stop(inst)
                    else:  # the operator's step is done: a stop again is the trial's failure
                        stops_after_operator += 1
                        if stops_after_operator > OPERATOR_RESTARTS:
                            raise RuntimeError(
                                f"instance {keep.number} stopped with an event's line after the operator's "
                                f"step, {stops_after_operator} times: {keep.last_lines()}"
                            )
                    keep = self._primary_or_new("")
                    deadline, settle = time.monotonic() + 240, 0.0
                    continue
                if keep.failpoints and self._exit_reason(keep) is not None:
                    keep = self.start_instance("", primary=True)
                    deadline, settle = time.monotonic() + 240, 0.0
                    continue
                raise RuntimeError(f"the clean instance {keep.number} exited while catching up")
            if time.monotonic() > deadline:
                behind = "" if self._caught_up() else ", or its checkpoint did not commit its last batch"
                raise TimeoutError(
                    f"offsets {self._offsets()} did not reach the log ends {ends}{behind} within 240s "
                    f"(instance {keep.number}: {keep.last_lines()})"
                )
            time.sleep(0.3)
        self._stop_last(keep)

    def _caught_up(self) -> bool:
        """Whatever else the catch-up waits for besides the offsets (a stream's checkpoint)."""
        return True

    def _primary_or_new(self, failpoints: str) -> Instance:
        """The alive primary instance, or a new primary with ``failpoints``."""
        primary = next((i for i in self._alive() if i.primary), None)
        return primary or self.start_instance(failpoints, primary=True)

    def _stop_last(self, keep: Instance) -> None:
        """Stop the instance that caught up (:meth:`_stop`): it must exit 0 saying it stopped."""
        self._stop(keep)
        if keep.process.returncode != 0 or "stopped after" not in keep.log():
            self.result.failures.append(
                f"the last instance did not exit cleanly on SIGTERM ({keep.process.returncode}): {keep.last_lines()}"
            )

    def _driver_may_fail(self, inst: Instance) -> bool:
        """Whether ``inst`` has fail points that fire in its driver process."""
        return any(p in inst.failpoints for p in self.plan.driver_points)

    def _log_ends(self) -> dict[int, int]:
        """The log ends (read-committed; with transactions, once none is left open, so that they
        are the ends for good)."""
        conf = client_config(self.env.kafka.bootstrap_servers)
        marks = fetch_watermarks(conf, [self.topic])
        if any(m.low != 0 for m in marks):
            raise RuntimeError(f"the broker dropped messages (log start above 0): {marks}")
        ends = {m.partition: m.high for m in marks}
        if self.transactions is not None:
            deadline = time.monotonic() + 60
            while (last := self._uncommitted_ends()) != ends:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"transactions still open after 60s: stable ends {ends}, log ends {last}"
                    )
                time.sleep(0.5)
                ends = {m.partition: m.high for m in fetch_watermarks(conf, [self.topic])}
        return ends

    def _uncommitted_ends(self) -> dict[int, int]:
        admin = AdminClient({"bootstrap.servers": self.env.kafka.bootstrap_servers, "log_level": 2})
        futures = admin.list_offsets(
            {TopicPartition(self.topic, p): _LATEST for p in range(self.plan.partitions)},
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=30,
        )
        return {tp.partition: int(f.result(timeout=30).offset) for tp, f in futures.items()}

    def _offsets(self) -> dict[int, int]:
        with self.env.connect() as conn:
            rows = conn.execute(
                "SELECT part, off FROM txn_offsets WHERE job = %s AND topic = %s", (self.job, self.topic)
            ).fetchall()
        return {int(p): int(o) for p, o in rows}

    def _check(self) -> None:
        ends = self._log_ends()
        visible: dict[int, dict[int, bytes]] = {}
        messages = ends  # per partition; with transactions, their markers and aborted messages are not
        if self.transactions is not None:
            visible = self._scan(ends)
            messages = {p: len(visible.get(p, {})) for p in ends}
        produced = self.events.produced(messages)  # with a recreated topic's old messages
        expected_total = self.events.expected_total(messages)  # without poison, with the old generation
        with self.env.connect() as conn:
            total = conn.execute(
                "SELECT coalesce(sum(metric), 0) FROM txn_data WHERE job = %s AND topic = %s "
                "AND grain = 'topic'",
                (self.job, self.topic),
            ).fetchone()
            by_key = conn.execute(
                "SELECT key, sum(metric) FROM txn_data WHERE job = %s AND topic = %s AND grain = %s "
                "GROUP BY key",
                (self.job, self.topic, self.key_grain),
            ).fetchall()
            lost_ranges = conn.execute(
                "SELECT count(*) FROM txn_lost_ranges WHERE job = %s", (self.job,)
            ).fetchone()
        counted = int(total[0]) if total else 0
        r = self.result
        r.produced, r.counted = produced, counted
        r.lost, r.duplicated = max(0, expected_total - counted), max(0, counted - expected_total)
        self._check_delivered(visible, produced)
        if self._offsets() != ends:
            r.failures.append(f"offsets {self._offsets()} differ from the log ends {ends}")
        if lost_ranges and lost_ranges[0]:
            r.failures.append(f"{lost_ranges[0]} ranges recorded as lost in txn_lost_ranges")
        if self.plan.counts_per_key and not by_key and produced:
            r.failures.append("the job counts per key but wrote no per-key rows")
        if by_key or self.plan.counts_per_key:
            expected = self.events.expected_keys(self._key_counts(ends, visible))
            counted_keys = {str(k): int(v) for k, v in by_key}
            if counted_keys != expected:
                wrong = {
                    k: (expected.get(k, 0), counted_keys.get(k, 0))
                    for k in expected.keys() | counted_keys.keys()
                    if expected.get(k, 0) != counted_keys.get(k, 0)
                }
                r.failures.append(f"per-key counts differ (key: produced, counted): {wrong}")
                r.lost += sum(max(0, p - c) for p, c in wrong.values())
                r.duplicated += sum(max(0, c - p) for p, c in wrong.values())
        self.events.check()

    def _check_delivered(self, visible: dict[int, dict[int, bytes]], produced: int) -> None:
        """The messages the producers were acknowledged (and, with transactions, those of the
        committed ones, judged against ``visible``) are the ``produced`` messages Kafka holds."""
        r = self.result
        transactional = 0
        if self.transactions is not None:
            transactional, problems = self.transactions.judge(visible)
            r.failures.extend(problems)
        if self.delivered + transactional != produced or self.delivery_errors:
            r.failures.append(
                f"producer acknowledged {self.delivered} messages (and {transactional} in committed "
                f"transactions) but Kafka holds {produced} ({self.delivery_errors[:3]})"
            )

    def _key_counts(
        self, ends: dict[int, int], visible: dict[int, dict[int, bytes]] | None = None
    ) -> dict[str, int]:
        counts: collections.Counter[str] = collections.Counter()
        for keys in (visible or self._scan(ends)).values():
            counts.update(k.decode() for k in keys.values())
        return dict(counts)

    def _scan(self, ends: dict[int, int]) -> dict[int, dict[int, bytes]]:
        """Every message a read-committed reader sees below ``ends``: partition -> offset -> key."""
        found: dict[int, dict[int, bytes]] = {}
        conf = client_config(self.env.kafka.bootstrap_servers)
        for partition, end in ends.items():
            found[partition] = {}
            for batch in RangeReader(conf, OffsetRange(self.topic, partition, 0, end)):
                found[partition].update((int(m.offset() or 0), m.key() or b"") for m in batch)
        return found

    def _count_from_logs(self) -> None:
        """Fail points that fired and speculative copies, from the jobs' own reports."""
        events = _event_counts(self.event_logs)
        logs = self._logs(events)
        fired = self._fired(logs)
        self.result.events["stalled-tasks"] += fired.pop("stalled-tasks", 0)
        self.result.injected.update(fired)
        if events["speculative-task-attempts"]:
            self.result.injected["speculation"] += events["speculative-task-attempts"]
        self.result.events["failed-task-attempts"] += events["failed-task-attempts"]
        self.result.events["already-committed"] += logs.count(", already committed")


_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]


class _EventCounts(collections.Counter[str]):
    app_ids: list[str]
    hosts: set[str]  # the executors' hosts: Spark copies a task only onto another host


def _event_counts(directory: Path) -> _EventCounts:
    """From Spark's event logs: speculative task launches and failed task attempts."""
    counts = _EventCounts()
    counts.app_ids = []
    counts.hosts = set()
    for path in sorted(directory.glob("*")):
        app = path.name.removesuffix(".inprogress")
        if app not in counts.app_ids:
            counts.app_ids.append(app)
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith('{"Event":"SparkListenerExecutorAdded"'):
                    with contextlib.suppress(ValueError, KeyError):
                        counts.hosts.add(json.loads(line)["Executor Info"]["Host"])
                    continue
                if '"SparkListenerTask' not in line[:40]:
                    continue
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    info = event.get("Task Info", {})
                    if event["Event"] == "SparkListenerTaskStart" and info.get("Speculative"):
                        counts["speculative-task-attempts"] += 1
                    elif event["Event"] == "SparkListenerTaskEnd":
                        reason = event.get("Task End Reason", {}).get("Reason")
                        if reason not in (None, "Success"):
                            counts["failed-task-attempts"] += 1
    return counts


# -- running many ---------------------------------------------------------------------------------
def run_trials(
    env: ChaosEnvironment,
    plans: Sequence[TrialPlan],
    log: Callable[[str], None] = print,
    summary: Summary | None = None,
) -> Summary:
    summary = summary or Summary()
    broker = "real" if env.real_kafka else "mock"
    if any(p.kafka != broker for p in plans):
        raise ValueError(f"plans for another broker than the environment's ({broker})")
    for n, plan in enumerate(plans, 1):
        log(
            f"trial {n}/{len(plans)} seed {plan.seed}: faults {','.join(plan.faults)}; "
            f"{plan.partitions} partitions, {plan.launch}, interval {plan.interval}, window {plan.window}s"
            + (", real Kafka" if plan.real_kafka else "")
            + (f", {shlex.join(plan.job_args)}" if plan.job_args else "")
        )
        run_trial(Trial(env, plan, log), summary, log)
    return summary


def run_trial(trial: Trial, summary: Summary, log: Callable[[str], None]) -> None:
    """Run ``trial``, add its result to ``summary`` and log its line; keep the logs of a failed one
    only (of every one with ``TXSTORE_CHAOS_KEEP_ALL=1``: a check that reads a passed trial's
    events, such as the stream's replays, is explained only by its instances' logs)."""
    result = trial.run()
    summary.add(result)
    log("  " + result.line())
    if result.ok and not os.environ.get("TXSTORE_CHAOS_KEEP_ALL"):
        shutil.rmtree(trial.directory, ignore_errors=True)
    else:
        log(f"  logs: {trial.directory}")


@contextlib.contextmanager
def environment(
    admin_url: str | None = None,
    directory: Path | None = None,
    connect_server: SparkConnectServer | None = None,
    kafka: str = "mock",
) -> Iterator[ChaosEnvironment]:
    """What the trials share; ``connect_server``: the Connect server for ``connect`` trials
    (default: one started on first use and stopped at the end); ``kafka``: "mock" or "real"."""
    url = admin_url or default_admin_url()
    env = ChaosEnvironment(url, directory, connect_server, kafka)
    try:
        yield env
    finally:
        env.close()


def default_admin_url() -> str:
    host = os.environ.get("PGHOST", "127.0.0.1")
    port = os.environ.get("PGPORT", "5432")
    user = os.environ.get("PGUSER", "postgres")
    password = os.environ.get("PGPASSWORD", "")
    auth = f"{user}:{password}" if password else user
    return f"postgresql://{auth}@{host}:{port}/postgres"
