"""Chaos trials of a Structured Streaming query (``python -m tests.chaos --stream``).

A trial is the runner's (:class:`tests.chaos.runner.Trial`): a new topic, messages produced before
and all through a fault window, faults at random moments, then a catch-up and an exact check. The
job is :mod:`tests.chaos.stream_job`: ``readStream.format("txstore")`` ->
``writeStream.format("txstore")`` with a processingTime trigger, in one of three modes (counts: a
row per message counted into ``txn_data``; counted: ``txstore.countMessages``; table: a row per
message merged into a results table the trial creates, ``k`` its key, ``n`` 1, ``osum`` its
offset). The fault kinds are in :data:`STREAM_FAULT_KINDS` (and, on real Kafka,
:data:`STREAM_REAL_KAFKA_KINDS`).

A streaming query fails as a whole where a batch job retries a batch: a PostgreSQL connection
dropped under the sink's commit, a broker gone while the planner asks for offsets, a planner worker
killed. Such an instance exits 1 with ``stream_job: query failed: LINE``; during the fault window
(and until the faults have healed) that is an explained exit and the runner restarts it, as an
operator's supervisor would. The check does not rely on it: what counts is the end, where
everything Kafka holds (committed messages only) is counted once and the stored offsets are the log
ends, reached by one clean instance within a bound (else the trial is *wedged*).
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

from tests.chaos.procs import kill_tagged
from tests.chaos.runner import (
    ChaosEnvironment,
    Instance,
    Summary,
    Trial,
    TrialPlan,
    TrialResult,
    run_trial,
)

STREAM_JOB = Path(__file__).resolve().parent / "stream_job.py"
MODES = ("counts", "counted", "table")

STREAM_FAULT_KINDS = (
    "kill-driver",  # kill -9 of the driver (its process group: Python, JVM, workers) while a task runs
    "kill-driver-after-commit",  # kill -9 of the driver between the sink's PostgreSQL commit and Spark's commit log
    "kill-python-worker",  # kill -9 of a PySpark worker mid-task (a reading task, or the planner/sink's worker)
    "pg-terminate",  # pg_terminate_backend of the query's sessions inside a transaction
    "pg-unreachable",  # the PostgreSQL proxy drops every connection and refuses new ones for 1-5 s
    "kafka-down",  # the broker down (mock) or the jobs' Kafka proxy's outage (real) for 1-5 s
    "kafka-frozen",  # the broker answers late (mock) or the jobs' Kafka network frozen (real) for 1-8 s
    "checkpoint-deleted",  # the query stopped (SIGTERM or kill -9), its checkpoint deleted, restarted
    "checkpoint-restored",  # the query stopped, an older copy of its checkpoint restored, restarted
    "second-instance",  # a second query of the same job: refused by the stream lock
)
STREAM_REAL_KAFKA_KINDS = (
    "kafka-killed-mid-read",  # SIGKILL of the broker while a task reads, then a restart
    "kafka-killed-mid-commit",  # SIGKILL of the broker while the sink's commit transaction is open
    "aborted-transactions",  # a transactional producer commits some transactions and aborts others
    "partitions-added",  # partitions added to the live topic (CreatePartitions; the mock has none)
)
# Kinds under which a query may fail as a whole (exit 1, restarted): the faults of its
# connections and processes. A query failure in a trial without any of them is unexplained.
QUERY_FAILING_KINDS = {
    "kill-python-worker",
    "pg-terminate",
    "pg-unreachable",
    "kafka-down",
    "kafka-frozen",
    "kafka-killed-mid-read",
    "kafka-killed-mid-commit",
    "partitions-added",
}
# Seconds after the faults heal in which a query failure is still the faults' (a connection the
# query kept, dropped during the window, fails its next use).
HEAL_GRACE = 20.0
CATCH_UP_SECONDS = 300.0  # from the catching-up instance's start (a start took 65-180 s at load 15-20)
FIRST_BATCH_SECONDS = 420.0  # likewise, to the first micro-batch
CATCH_UP_RESTARTS = 3  # query failures tolerated during the catch-up (the faults' aftermath)
MISMATCH_LINE = "txn_offsets stores offset"
LOCKED_LINE = "another streaming query of this job is running"
# A query stops when a Python worker Spark starts (the source's, the sink's, a planner's) does not
# connect back within Spark's fixed 10 s: seen at load 15-25 on the shared 2-core machine.
OVERLOADED_LINE = "Python worker failed to connect back"
_BATCH = re.compile(r"^stream_job: batch \d+: ", re.M)
# How long a stream fault waits for its moment (a running primary, a commit to stall in): the
# window is seconds, a restart by an earlier fault takes minutes on the loaded machine.
WINDOW_LONG_KINDS = ("aborted-transactions",)
"""Faults that last until the window ends (the transactional producer): no moment to wait for."""
FAULT_WAIT_SECONDS = 150.0  # within the runner's 180 s join of the fault threads
_ALREADY = re.compile(r"already committed; skipped")


def checkpoint_caught_up(checkpoint: Path) -> bool:
    """Whether Spark's checkpoint has committed the last batch its offset log plans (or plans
    none): its ``offsets/N`` and ``commits/N`` files, N the batch id."""

    def last(folder: str) -> int:
        names = (p.name for p in (checkpoint / folder).glob("[0-9]*"))
        return max((int(n) for n in names if n.isdigit()), default=-1)

    return last("commits") >= last("offsets")


def stalled_batch(checkpoint: Path) -> int | None:
    """The batch a query stalled in its sink is in: the last its offset log plans without a commit
    (None if every planned batch is committed)."""

    def ids(folder: str) -> set[int]:
        return {int(p.name) for p in (checkpoint / folder).glob("[0-9]*") if p.name.isdigit()}

    pending = ids("offsets") - ids("commits")
    return max(pending, default=None)


def _checkpoint_of(inst: Instance) -> Path:
    """The checkpoint an instance was started on (its ``--checkpoint`` argument)."""
    command = inst.process.args
    args = [str(a) for a in command] if isinstance(command, list) else []
    return Path(args[args.index("--checkpoint") + 1])


def stream_kinds(kafka: str) -> tuple[str, ...]:
    return STREAM_FAULT_KINDS + (STREAM_REAL_KAFKA_KINDS if kafka == "real" else ())


@dataclass(frozen=True)
class StreamPlan(TrialPlan):
    mode: str = "counts"  # counts, counted or table (stream_job's --mode)
    source_failpoints: str = ""  # stalls in reading tasks (after-first-range:sleep)
    sink_failpoints: str = ""  # stalls in the sink's commit (before-commit / after-commit:sleep)

    @classmethod
    def generate_stream(
        cls, seed: int, faults: Sequence[str] | None = None, kafka: str = "mock", mode: str | None = None
    ) -> StreamPlan:
        """The stream trial for ``seed``: the mode rotates with the seed, the first fault kind with
        ``seed // 3``, 0-1 more at random; windows of 6-10 s so a trial takes about a minute."""
        if kafka not in ("mock", "real"):
            raise ValueError(f"kafka must be 'mock' or 'real', not {kafka!r}")
        kinds = stream_kinds(kafka)
        rng = random.Random(seed * 15485863 + 17)
        if faults is None:
            rotation = (*STREAM_REAL_KAFKA_KINDS, "kafka-down", "kafka-frozen") if kafka == "real" else kinds
            first = rotation[(seed // 3) % len(rotation)]
            if kafka == "real" and (seed // 3 // len(rotation)) % 2:
                first = kinds[(seed // 3) % len(kinds)]  # every other round over every kind
            others = [k for k in kinds if k != first]
            faults = (first, *rng.sample(others, rng.choice((0, 1, 1))))
        unknown = set(faults) - set(kinds)
        if unknown:
            raise ValueError(
                f"unknown stream fault kinds on the {kafka} broker {sorted(unknown)}; known: {kinds}"
            )
        window = rng.uniform(6.0, 10.0)
        source, sink = "", ""
        if {"kill-driver", "kill-python-worker", "kafka-killed-mid-read"} & set(faults):
            source = f"after-first-range:sleep={rng.uniform(0.5, 1.5):.2f}@{rng.uniform(0.3, 0.6):.2f}"
        sinks = []
        if {"pg-terminate", "kafka-killed-mid-commit"} & set(faults):
            sinks.append(f"before-commit:sleep={rng.uniform(0.5, 1.2):.2f}@{rng.uniform(0.3, 0.6):.2f}")
        if "kill-driver-after-commit" in faults:
            sinks.append(f"after-commit:sleep={rng.uniform(1.0, 2.0):.2f}@{rng.uniform(0.4, 0.7):.2f}")
        sink = ",".join(sinks)
        base = TrialPlan(
            seed=seed,
            faults=tuple(faults),
            fault_times=tuple(round(rng.uniform(0.0, window * 0.7), 2) for _ in faults),
            partitions=rng.randint(2, 5),
            keys=rng.randint(2, 12),
            initial_messages=rng.randint(100, 2000),
            window=round(window, 1),
            interval=rng.choice((0.3, 0.5, 1.0)),
            launch="python",
            max_offsets_per_batch=rng.choice((rng.randint(100, 600), rng.randint(600, 3000))),
            failpoints=f"{source}|{sink}",  # stream_job's --source-failpoints | --sink-failpoints
            kafka=kafka,
        )
        return cls(
            **{f: getattr(base, f) for f in TrialPlan.__dataclass_fields__},
            mode=mode or MODES[seed % len(MODES)],
            source_failpoints=source,
            sink_failpoints=sink,
        )


class StreamTrial(Trial):
    plan: StreamPlan

    def __init__(self, env: ChaosEnvironment, plan: StreamPlan, log: Callable[[str], None]) -> None:
        super().__init__(env, plan, log)
        self.partitions = plan.partitions  # grows with partitions-added
        self.checkpoints = 0
        self.checkpoint = self._new_checkpoint()
        self.table = f"chaos_stream_{plan.seed}" if plan.mode == "table" else None
        self.snapshot: Path | None = None  # an older copy of the checkpoint (checkpoint-restored)
        self.snapshot_offsets: dict[int, int] = {}  # txn_offsets when it was taken
        self.restored = False  # the older copy is in place: a CheckpointMismatch stop is expected
        self.healed_at: float | None = None
        self.window_overrun: float | None = None  # when a window kept open for a fault closes
        self.catch_up_failures = 0
        self.failure_lines: collections.Counter[str] = collections.Counter()  # query failures' causes
        self.failures_seen: set[int] = set()  # the instances whose failure is counted there

    def _new_checkpoint(self) -> Path:
        self.checkpoints += 1
        return self.directory / f"checkpoint-{self.checkpoints}"

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> TrialResult:
        if self.table:
            with self.env.connect() as conn:
                conn.execute(
                    f"CREATE TABLE {self.table} (k text PRIMARY KEY, n bigint NOT NULL, osum bigint NOT NULL)"
                )
        # The window is the plan's: no fail point waits for a measured start-up (the runner would
        # stretch the window to it, minutes on a loaded machine).
        self.env.startups.clear()
        try:
            return super().run()
        finally:
            self.env.startups.clear()
            if self.failure_lines:
                for line, n in self.failure_lines.most_common(4):
                    self.say(f"  query failures ({n}x): {line[:300]}")

    def _make_up_missed_fail_points(self) -> None:
        """No raise/exit fail points in stream trials: the stalls are sleeps."""

    def _faults_awaiting_moment(
        self, pending: list[tuple[float, str]], faults: list[threading.Thread]
    ) -> bool:
        """A stream fault waits up to :data:`FAULT_WAIT_SECONDS` for its moment (a commit to stall
        in, a task to kill in), and a moment needs micro-batches: with the producers stopped at the
        window's end, a query that has caught up runs none, and the fault finds no moment (seed
        201's ``kill-driver-after-commit`` in CI). So the window, its producers and the supervisor
        go on until every planned fault has been injected or given up, at most
        :data:`FAULT_WAIT_SECONDS` and a minute past the window's end."""
        waiting = bool(pending) or any(t.is_alive() and t.name not in WINDOW_LONG_KINDS for t in faults)
        if not waiting:
            return False
        if self.window_overrun is None:
            self.window_overrun = time.monotonic() + FAULT_WAIT_SECONDS + 60
            self.say("  the window stays open for a fault still waiting for its moment")
        return time.monotonic() < self.window_overrun

    def _instance_command(
        self, tag: str, failpoints: str, until: float | None
    ) -> tuple[list[str], dict[str, str], str]:
        """``python stream_job.py`` on the current checkpoint; ``failpoints`` is ``SOURCE|SINK``."""
        source, _, sink = failpoints.partition("|")
        args = [
            *self._job_args(),
            "--checkpoint",
            str(self.checkpoint),
            "--mode",
            self.plan.mode,
            "--trigger",
            str(self.plan.interval),
        ]
        if self.table:
            args += ["--table", self.table]
        if self.plan.max_offsets_per_batch:
            args += ["--max-offsets-per-trigger", str(self.plan.max_offsets_per_batch)]
        if source:
            args += ["--source-failpoints", source]
        if sink:
            args += ["--sink-failpoints", sink]
        env = self._instance_env(
            tag,
            ("TXSTORE_", "KAFKA_", "PYSPARK_", "SPARK_"),
            PYSPARK_SUBMIT_ARGS=shlex.join([*self._spark_args(tag), "pyspark-shell"]),
        )
        return [sys.executable, str(STREAM_JOB), *args], env, "python"

    def _started_as(self, failpoints: str) -> str:
        points = f", fail points {failpoints}" if failpoints != "|" else ""
        return f"{self.plan.mode}, {self.checkpoint.name}{points}"

    def _await_first_batch(self, timeout: float = FIRST_BATCH_SECONDS) -> None:
        super()._await_first_batch(timeout)
        if "checkpoint-restored" in self.plan.faults:  # the older copy, taken early
            self._snapshot()

    def _snapshot(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (self.checkpoint / "commits").is_dir():
            time.sleep(0.2)
        target = self.directory / "checkpoint-older"
        for _ in range(5):  # the query writes on: copy until a copy is whole
            shutil.rmtree(target, ignore_errors=True)
            try:
                offsets = self._offsets()
                shutil.copytree(self.checkpoint, target)
                self.snapshot, self.snapshot_offsets = target, offsets
                return
            except (OSError, shutil.Error):
                time.sleep(0.2)

    def _producer_config(self) -> dict[str, Any]:
        return {
            **super()._producer_config(),
            "topic.metadata.refresh.interval.ms": 1000,  # partitions added are produced to
        }

    # -- faults ----------------------------------------------------------------------------------
    def _kill_group(self, inst: Instance) -> bool:
        """kill -9 of the whole driver: the Python process, its JVM and the JVM's Python workers."""
        inst.killed = True
        was_primary, inst.primary = inst.primary, False
        try:
            os.killpg(inst.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        kill_tagged(inst.tag)  # anything that left the group
        self.start_instance(inst.failpoints, primary=was_primary)
        return True

    def _fault_kill_driver(self) -> bool:
        found = self._busy_worker()
        return found is not None and self._kill_group(found[0])

    def _fault_kill_driver_after_commit(self) -> bool:
        """Watch for the sink's ``after-commit`` stall (after COMMIT returned, before Spark writes
        its commit log) and kill the driver in it."""
        line = "txstore fail point after-commit: sleep"
        seen = {i.number: i.log().count(line) for i in self.instances}
        deadline = time.monotonic() + FAULT_WAIT_SECONDS  # a restarted instance starts slowly
        while time.monotonic() < deadline:
            for inst in self._alive():
                if inst.log().count(line) > seen.get(inst.number, 0):
                    batch = stalled_batch(_checkpoint_of(inst))
                    self.say(f"  instance {inst.number} killed after its commit of batch {batch}")
                    if batch == 0:
                        # Spark replays batch 0 from initialOffset() again, now the stored
                        # offsets: an empty batch, not one the sink recognises as committed.
                        self.result.events["killed-in-batch-0"] += 1
                    return self._kill_group(inst)
            time.sleep(0.02)
        return False

    def _running_primary(self, deadline: float | None = None) -> Instance | None:
        """The primary instance once it runs micro-batches (a restart by another fault takes
        minutes on a loaded machine), within :data:`FAULT_WAIT_SECONDS`."""
        deadline = deadline or time.monotonic() + FAULT_WAIT_SECONDS
        while time.monotonic() < deadline:
            inst = next((i for i in self._alive() if i.primary), None)
            if inst is not None and _BATCH.search(inst.log()):
                return inst
            time.sleep(0.3)
        return None

    def _fault_checkpoint_deleted(self) -> bool:
        inst = self._running_primary()
        if inst is None:
            return False
        self._stop_between_runs(inst)
        shutil.rmtree(self.checkpoint, ignore_errors=True)
        self.say(f"  {self.checkpoint.name} deleted")
        self.start_instance(inst.failpoints, primary=True)
        return True

    def _fault_checkpoint_restored(self) -> bool:
        if self.snapshot is None:
            return False
        # Older: the query has committed since the copy (else the copy is the checkpoint as it is).
        deadline = time.monotonic() + FAULT_WAIT_SECONDS
        while self._offsets() == self.snapshot_offsets and time.monotonic() < deadline:
            time.sleep(0.2)
        inst = self._running_primary(deadline)
        if inst is None:
            return False
        self._stop_between_runs(inst)
        shutil.rmtree(self.checkpoint, ignore_errors=True)
        shutil.copytree(self.snapshot, self.checkpoint)
        self.restored = True
        self.say(f"  an older copy of {self.checkpoint.name} restored")
        self.start_instance(inst.failpoints, primary=True)
        return True

    def _stop_between_runs(self, inst: Instance) -> None:
        """Stop the query: SIGTERM (a clean stop) or kill -9, at random."""
        inst.primary = False
        if self.rng.random() < 0.5:
            self._stop(inst)
        else:
            inst.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(inst.process.pid, signal.SIGKILL)
            kill_tagged(inst.tag)
            with contextlib.suppress(subprocess.TimeoutExpired):
                inst.process.wait(timeout=30)

    def _fault_second_instance(self) -> bool:
        self.start_instance(self.plan.failpoints, primary=False)
        return True

    def _fault_partitions_added(self) -> bool:
        added = self.rng.randint(1, 3)
        admin = AdminClient({"bootstrap.servers": self.env.kafka.bootstrap_servers, "log_level": 2})
        futures = admin.create_partitions([NewPartitions(self.topic, self.partitions + added)])
        for f in futures.values():
            f.result(timeout=60)
        self.partitions += added
        self.say(f"  {added} partitions added ({self.partitions} now)")
        return True

    def _fault_pg_terminate(self) -> bool:
        """As the runner's, but waiting up to :data:`FAULT_WAIT_SECONDS` (past the window) for a
        session inside its transaction: a query restarted by another fault takes minutes here."""
        return self._terminate_in_transaction(FAULT_WAIT_SECONDS, past_the_window=True)

    def _fault_kafka_killed_mid_read(self) -> bool:
        def reading() -> bool:
            return self._busy_workers() > 0 and self._jobs_in_transaction() == 0

        return self._kill_broker_when(reading)

    # -- supervision -----------------------------------------------------------------------------
    def _supervise(self) -> None:
        for inst, reason in self._judge_exits():
            if reason == "checkpoint-mismatch":  # the operator: what the line says
                self.checkpoint = self._new_checkpoint()
                self.result.events["operator-new-checkpoint"] += 1
                self.say(f"  operator: restarting with a new checkpointLocation ({self.checkpoint.name})")
            self._restart_if_primary(inst)

    def _exit_reason(self, inst: Instance) -> str | None:
        code = inst.process.returncode
        log = inst.log()
        if inst.killed and code in (-signal.SIGKILL, 137):
            return "driver-killed"
        if inst.stopping and code == 0 and "stopped after" in log:
            return "stopped"
        if code != 1:
            return None
        failure = next(
            (line for line in reversed(log.splitlines()) if line.startswith("stream_job: query failed: ")), ""
        )
        if LOCKED_LINE in failure:
            return "stream-locked"
        if OVERLOADED_LINE in failure:  # Spark's own 10 s for a new Python worker: the machine, not txstore
            return "python-worker-start-timeout"
        if MISMATCH_LINE in failure:
            if self.restored:
                return "checkpoint-mismatch"
            self.result.failures.append(
                f"instance {inst.number} stopped on a checkpoint mismatch nobody made"
            )
            return "checkpoint-mismatch"
        if failure:
            if inst.number not in self.failures_seen:
                self.failures_seen.add(inst.number)
                self.failure_lines[_shape(failure)] += 1
            if QUERY_FAILING_KINDS & set(self.plan.faults) or self._recent_kill():
                return "query-failed"
        return None

    def _recent_kill(self) -> bool:
        return any(i.killed for i in self.instances)

    def _heal(self) -> None:
        super()._heal()
        if self.window_over.is_set() and self.healed_at is None:
            self.healed_at = time.time()

    # -- ending ----------------------------------------------------------------------------------
    def _catch_up_and_stop(self) -> None:
        """One instance (a new one if none is alive) reaches the log ends within the bound; a
        query failure in the faults' aftermath restarts it (bounded), anything else fails."""
        for inst in self._alive():
            if not inst.primary:
                self._stop(inst)
        self._supervise()
        keep = self._primary_or_new("|")
        keep.primary = True
        ends = self._log_ends()
        deadline = time.monotonic() + CATCH_UP_SECONDS
        while self._offsets() != ends:
            if not keep.alive():
                self._supervise()
                if keep.stopping or keep.killed:  # a fault still running stopped it (and starts another)
                    time.sleep(1.0)
                    keep = self._primary_or_new("|")
                    deadline = time.monotonic() + CATCH_UP_SECONDS
                    continue
                reason = self._exit_reason(keep)
                if reason in (
                    "query-failed",
                    "stream-locked",
                    "checkpoint-mismatch",
                    "python-worker-start-timeout",
                ):
                    self.catch_up_failures += 1
                    self.result.events["restarts-in-catch-up"] += 1
                    if self.catch_up_failures > CATCH_UP_RESTARTS:
                        raise RuntimeError(
                            f"wedged: the query failed {self.catch_up_failures} times after the faults "
                            f"healed: {keep.last_lines()}"
                        )
                    keep = self.start_instance("|", primary=True)
                    deadline = time.monotonic() + CATCH_UP_SECONDS
                    continue
                raise RuntimeError(f"the catching-up instance {keep.number} exited: {keep.last_lines()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"wedged: offsets {self._offsets()} did not reach the log ends {ends} within "
                    f"{CATCH_UP_SECONDS:.0f}s (instance {keep.number}: {keep.last_lines()})"
                )
            time.sleep(0.3)
        self._stop_last(keep)

    def _caught_up(self) -> bool:
        """The checkpoint's commit log has its offset log's last batch: a driver killed between
        the sink's COMMIT and Spark's commit log leaves that batch to the next instance, which
        replays it as already committed. The offsets in PostgreSQL are at the log ends before
        that replay; stopping the clean instance then (before its first micro-batch, minutes
        into a start on a loaded machine) would leave the replay untried (seed 201 in CI)."""
        return checkpoint_caught_up(self.checkpoint)

    def _uncommitted_ends(self) -> dict[int, int]:
        plan = self.plan
        self.plan = replace(plan, partitions=self.partitions)
        try:
            return super()._uncommitted_ends()
        finally:
            self.plan = plan

    def _check(self) -> None:
        if self.table is None:
            super()._check()
        else:
            self._check_table()
        if self.restored and not self.result.events["checkpoint-mismatch"]:
            self.result.events["checkpoint-restored-aligned"] += 1  # the older copy was one batch back

    def _check_table(self) -> None:
        """The results table: per key, n = the messages Kafka holds with that key, osum = the sum
        of their offsets (so a message counted twice, or another's counted instead, shows)."""
        ends = self._log_ends()
        visible = self._scan(ends)
        expected: dict[str, list[int]] = {}
        for messages in visible.values():
            for offset, key in messages.items():
                k = key.decode()
                row = expected.setdefault(k, [0, 0])
                row[0] += 1
                row[1] += offset
        with self.env.connect() as conn:
            rows = conn.execute(f"SELECT k, n, osum FROM {self.table}").fetchall()
        got = {str(k): [int(n), int(o)] for k, n, o in rows}
        r = self.result
        produced = sum(len(m) for m in visible.values())
        counted = sum(n for n, _ in got.values())
        r.produced, r.counted = produced, counted
        self._check_delivered(visible, produced)
        for k in expected.keys() | got.keys():
            want, have = expected.get(k, [0, 0]), got.get(k, [0, 0])
            if want != have:
                r.failures.append(f"key {k!r}: (n, offset sum) {have}, Kafka holds {want}")
                r.lost += max(0, want[0] - have[0])
                r.duplicated += max(0, have[0] - want[0])
                if want[0] == have[0]:  # as many, but not the same messages
                    r.lost += 1
                    r.duplicated += 1
        if self._offsets() != ends:
            r.failures.append(f"offsets {self._offsets()} differ from the log ends {ends}")

    def _count_from_logs(self) -> None:
        super()._count_from_logs()
        logs = "\n".join(inst.log() for inst in self.instances)
        self.result.events["already-committed"] += len(_ALREADY.findall(logs))
        if self.failure_lines:
            self.result.events["query-failures"] += sum(self.failure_lines.values())


def _shape(line: str) -> str:
    """A query failure's line without its numbers, so that alike failures group."""
    return re.sub(r"\d+", "N", line.removeprefix("stream_job: query failed: "))[:400]


class StreamSummary(Summary):
    def line(self) -> str:
        injected = self.injected
        kinds = " ".join(f"{k}={injected[k]}" for k in stream_kinds(self.kafka))
        produced = sum(r.produced for r in self.results)
        counted = sum(r.counted for r in self.results)
        failed = ",".join(str(r.plan.seed) for r in self.failed) or "none"
        broker = ", real Kafka" if self.kafka == "real" else ""
        wedged = sum(1 for r in self.results if any("wedged" in f for f in r.failures))
        return (
            f"chaos --stream: {len(self.results)} trials (seed {self.seed}{broker}), faults injected: {kinds}; "
            f"messages produced {produced}, counted {counted}, lost {sum(r.lost for r in self.results)}, "
            f"duplicated {sum(r.duplicated for r in self.results)}, wedged {wedged}; failed trials: {failed}"
        )


def run_stream_trials(
    env: ChaosEnvironment,
    plans: Sequence[StreamPlan],
    log: Callable[[str], None] = print,
    summary: StreamSummary | None = None,
) -> StreamSummary:
    summary = summary or StreamSummary()
    for n, plan in enumerate(plans, 1):
        log(
            f"trial {n}/{len(plans)} seed {plan.seed}: stream {plan.mode}, faults {','.join(plan.faults)}; "
            f"{plan.partitions} partitions, trigger {plan.interval}s, maxOffsetsPerTrigger "
            f"{plan.max_offsets_per_batch}, window {plan.window}s"
            + (", real Kafka" if plan.real_kafka else "")
        )
        run_trial(StreamTrial(env, plan, log), summary, log)
    return summary
