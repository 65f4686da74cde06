"""Chaos fault kinds for the events a job must stop on, or step over, with one line.

Three kinds whose right outcome is not "count on" but "stop and say so", or
"skip exactly what was recorded"; each trial also plays the operator who
reads the line and runs what it says:

``topic-recreated``
    At a moment when every partition has counted something, producing pauses
    (the producer is flushed and dropped: its idempotence state names the old
    log), the old topic's messages as delivered are kept aside, the topic is
    deleted and recreated with as many partitions, and refilled, per trial,
    either *past* the old log ends (each instance must stop with the
    ``TopicRecreated`` line) or *below* the stored offsets (``OffsetOutOfLog``,
    or ``TopicRecreated`` where the topic ID is seen first; ``OffsetOutOfLog`` is
    right after a refill past too if the job looked while the new topic was still
    shorter, as its line shows). Instances that stop
    so are not restarted. Once none runs, the operator step runs ``txstore reset
    --to-earliest`` as a dry run: every partition that counted something of the old
    log must show ``new generation 1``; it checks what was counted (the total equals
    the messages below the stored offsets: of the old log in those partitions, of
    the new log in the others, which had nothing to verify), executes the reset for
    exactly those partitions, resumes producing and starts the job again. The end:
    total = what the old generation counted + everything the new topic holds,
    offsets = the new log ends, generation 1 in the partitions reset, 0 elsewhere.

``poison-message``
    One to three messages with a timestamp no calendar holds (key ``poison``), so
    the job runs with ``--window 1m``; in about half the trials also with
    ``--on-bad-message skip``. With ``fail`` every instance that reaches one stops
    with the ``BadMessage`` line; the operator step checks that nothing at or
    past the poison was committed in its partition and that the total equals the
    messages below the stored offsets, then restarts with ``--on-bad-message
    skip``. The end, either way: total = produced - poison, per key without the
    poison key, ``txn_bad_messages`` = exactly the poison offsets.

``oversized-publish``
    The job publishes with ``--publish-topic`` and ``--publish-max-bytes 4096``
    ``--by key`` over 150-400 keys, so commits need several parts. The end: no
    outbox row pending or set aside, every published value at most 4096 bytes,
    and every published commit has parts 1..n. Counted as injected once per
    commit published in more than one part.
"""

from __future__ import annotations

import collections
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer

from txstore.core.ranges import OffsetRange
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader
from txstore.testing.mock_kafka import MockKafkaCluster

if TYPE_CHECKING:
    from tests.chaos.runner import Instance, Trial

EVENT_FAULT_KINDS = ("topic-recreated", "poison-message", "oversized-publish")
# Exits the operator must act on: such an instance is not restarted by the runner.
OPERATOR_EXITS = ("topic-recreated", "offset-out-of-log", "bad-message")
BEYOND_ANY_CALENDAR_MS = 300_000_000_000_000  # year 11476: --window cannot place it
POISON_KEY = b"poison"
PUBLISH_MAX_BYTES = 4096
PRODUCE_API = 0
TOPIC_AUTHORIZATION_FAILED = 29  # a Produce error retrying cannot fix: the row is set aside

RECREATED_LINE = "the topic was deleted and recreated"
OUT_OF_LOG_LINES = ("is beyond the log-end offset", "Kafka no longer has this partition")
OUT_OF_LOG = re.compile(
    r"partition (?P<partition>\d+): stored offset \d+ is beyond the log-end offset (?P<end>\d+)"
)
BAD_MESSAGE_LINE = "the aggregate failed on this message"
TOPIC_MISSING_LINE = "does not exist on Kafka"


def compatible(faults: Sequence[str]) -> tuple[str, ...]:
    """A recreated topic and a poison message in one trial would need two operators'
    stories at once: a trial with both keeps the recreation. So does a trial with a recreation
    and aborted transactions (real Kafka), whose producer would write across the recreation."""
    if "topic-recreated" in faults:
        return tuple(k for k in faults if k not in ("poison-message", "aborted-transactions"))
    return tuple(faults)


def plan_job_args(
    rng: random.Random, faults: Sequence[str], job_args: Sequence[str]
) -> tuple[tuple[str, ...], int | None]:
    """The count_topic flags the planned event faults need, and a key count if they need one."""
    args = list(job_args)
    keys = None
    if "poison-message" in faults:
        if "--window" not in args:
            args += ["--window", "1m"]
        if rng.random() < 0.5:
            args += ["--on-bad-message", "skip"]
    if "oversized-publish" in faults:
        args += ["--publish-max-bytes", str(PUBLISH_MAX_BYTES)]
        if "--by" not in args:
            args += ["--by", "key"]
        keys = rng.randint(150, 400)
    return tuple(args), keys


@dataclass(frozen=True)
class OldGeneration:
    ends: dict[int, int]  # the old topic's log ends at the recreation
    keys: dict[int, dict[int, bytes]]  # partition -> offset -> key, as delivered
    stored: dict[int, int]  # the stored offsets at the recreation


class TrialEvents:
    """The event faults of one trial: injection, the operator's steps and the expectations."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        plan = trial.plan
        self.rng = random.Random(plan.seed * 104729 + 5)
        self.refill = self.rng.choice(("past", "below"))
        self.publish_topic = f"{trial.topic}-results" if "oversized-publish" in plan.faults else None
        self.skip = "skip" in plan.job_args  # --on-bad-message skip from the start
        # In about half the publishing trials (alone with the producer pause), the broker also
        # refuses the job's publishing for good once: rows set aside, then --retry-failed.
        self.refuse_publish = (
            self.publish_topic is not None
            and not {"topic-recreated", "poison-message"} & set(plan.faults)
            and self.rng.random() < 0.5
            and not plan.real_kafka  # the mock's push_request_errors makes the broker refuse
        )
        self.refusals = 0  # Produce errors pushed
        self.lock = threading.Lock()
        self.sent: dict[int, dict[int, bytes]] = collections.defaultdict(dict)
        self.old: OldGeneration | None = None
        self.refilled: dict[int, int] = {}  # the new topic's messages per partition, once refilled
        self.old_counted = 0
        self.old_keys: collections.Counter[str] = collections.Counter()
        self.reset_partitions: set[int] = set()  # the partitions reset into generation 1
        self.poison: set[tuple[int, int]] = set()
        self.awaiting: str | None = None  # "reset" (a recreation) or "skip" (a poison, with fail)
        self.extra_args: list[str] = []
        self._judged: set[int] = set()  # instances whose wrong line is already a failure

    # -- hooks of the runner -------------------------------------------------------------------
    def prepare(self) -> None:
        if self.publish_topic:
            self.trial.env.kafka.create_topic(self.publish_topic, 1)

    def instance_args(self) -> list[str]:
        args = ["--publish-topic", self.publish_topic] if self.publish_topic else []
        return args + self.extra_args

    def delivered(self, msg: Any) -> None:
        """Every acknowledged message of the trial's topic, by partition and offset."""
        if msg.topic() == self.trial.topic:
            with self.lock:
                self.sent[msg.partition()][msg.offset()] = msg.key() or b""

    def exit_reason(self, inst: Instance) -> str | None:
        """An exit with the line of an event this trial injected; a wrong line is a failure."""
        code = inst.process.returncode
        if code is None or code <= 0:
            return None
        # The job's own one-line error, not a range's REFUSED log line of the same event.
        tail = "\n".join(line for line in inst.log().splitlines()[-30:] if ": error: " in line)
        if self.old is not None and RECREATED_LINE in tail:
            return "topic-recreated"
        if self.old is not None and self.trial.plan.real_kafka and TOPIC_MISSING_LINE in tail:
            # A real broker deletes, then creates: a job that plans in between stops on the
            # missing topic (UnknownTopic), and is started again like a crashed one (seed 6101).
            return "topic-missing"
        if self.old is not None and any(line in tail for line in OUT_OF_LOG_LINES):
            # Refilled past, the line is still right if the job looked before the refill was in.
            seen = OUT_OF_LOG.search(tail)
            early = seen is not None and int(seen["end"]) < self.refilled.get(int(seen["partition"]), 0)
            if self.refill == "past" and not early and inst.number not in self._judged:
                self._judged.add(inst.number)
                self.trial.result.failures.append(
                    f"instance {inst.number} stopped with OffsetOutOfLog, but the new topic was "
                    f"refilled past the stored offsets (TopicRecreated expected): {inst.last_lines()}"
                )
            return "offset-out-of-log"
        if self.poison and BAD_MESSAGE_LINE in tail and "OverflowError" in tail:
            if self.skip and inst.number not in self._judged:
                self._judged.add(inst.number)
                self.trial.result.failures.append(
                    f"instance {inst.number} stopped on a bad message under --on-bad-message skip"
                )
            return "bad-message"
        return None

    def operator_due(self, alive: int) -> bool:
        return self.awaiting is not None and alive == 0 and self._stopped_for_operator()

    def _stopped_for_operator(self) -> bool:
        return any(
            not i.alive() and i.reported and self.exit_reason(i) in OPERATOR_EXITS
            for i in self.trial.instances
        )

    def settled(self) -> bool:
        """Nothing left for the catch-up: no operator step waiting, no outbox row pending."""
        if self.awaiting is not None:
            return False
        if self.publish_topic:
            with self.trial.env.connect() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM txn_outbox WHERE job = %s AND sent_at IS NULL AND failed_at IS NULL",
                    (self.trial.job,),
                ).fetchone()
            return row is not None and row[0] == 0
        return True

    # -- injection -----------------------------------------------------------------------------
    def inject_topic_recreated(self) -> bool:
        t = self.trial
        deadline = time.monotonic() + 30
        while True:  # something counted: a message to verify (few keys may leave partitions empty)
            stored = t._offsets()
            if any(stored.values()):
                break
            if time.monotonic() > deadline or t.window_over.is_set():
                return False
            time.sleep(0.2)
        t.pause_producing.set()
        if not t.producing_paused.wait(150):
            raise TimeoutError("the producer did not pause within 150s")
        marks = fetch_watermarks(client_config(t.env.kafka.bootstrap_servers), [t.topic])
        ends = {m.partition: m.high for m in marks}
        with self.lock:
            keys = {p: dict(self.sent.get(p, {})) for p in ends}
            self.sent = collections.defaultdict(dict)
        if any(len(keys[p]) != ends[p] for p in ends):
            raise RuntimeError(
                f"deliveries recorded { ({p: len(k) for p, k in keys.items()}) } != log ends {ends}"
            )
        self.old = OldGeneration(ends, keys, t._offsets())
        t.env.kafka.recreate_topic(t.topic, t.plan.partitions)
        if self.refill == "past":
            counts = {p: ends[p] + self.rng.randint(1, 50) for p in ends}
        else:
            counts = {p: self.rng.randint(0, max(0, self.old.stored.get(p, 0) - 1)) for p in ends}
        self.awaiting = "reset"
        self.refilled = counts
        self._send({p: [f"k{self.rng.randrange(t.plan.keys)}".encode()] * n for p, n in counts.items()})
        t.say(f"  recreated the topic, refilled {self.refill} the stored offsets: {counts}")
        return True

    def inject_poison_message(self) -> bool:
        t = self.trial
        n = self.rng.randint(1, 3)
        partitions = [self.rng.randrange(t.plan.partitions) for _ in range(n)]
        if not self.skip:
            self.awaiting = "skip"

        def on_delivery(err: Any, msg: Any) -> None:
            t._on_delivery(err, msg)
            if err is None:  # known before the job can read it
                self.poison.add((msg.partition(), msg.offset()))

        producer = Producer({"bootstrap.servers": t.env.kafka.bootstrap_servers, "log_level": 2})
        for p in partitions:
            producer.produce(
                t.topic,
                value=b"v",
                key=POISON_KEY,
                partition=p,
                timestamp=BEYOND_ANY_CALENDAR_MS,
                on_delivery=on_delivery,
            )
        if producer.flush(120) != 0:
            raise RuntimeError("the poison messages were not delivered in 120s")
        t.say(f"  poison messages at {sorted(self.poison)}")
        return bool(self.poison)

    def inject_publish_refused(self) -> bool:
        """With the trial's producer paused (its requests would take the error), send a
        burst of messages, then make the broker refuse the next 1-2 Produce requests for
        good: the job's publisher, publishing the burst's results, sets those rows aside
        and goes on. Waits (bounded) until one is set aside."""
        if not self.refuse_publish:
            return False
        t = self.trial
        t.pause_producing.set()
        try:
            if not t.producing_paused.wait(150):
                raise TimeoutError("the producer did not pause within 150s")
            keys = [f"k{self.rng.randrange(t.plan.keys)}".encode() for _ in range(300)]
            self._send({p: keys[p :: t.plan.partitions] for p in range(t.plan.partitions)})
            self.refusals = self.rng.randint(1, 2)
            assert isinstance(t.env.kafka, MockKafkaCluster)
            t.env.kafka.push_request_errors(PRODUCE_API, *[TOPIC_AUTHORIZATION_FAILED] * self.refusals)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not self._set_aside():
                time.sleep(0.2)
            t.env.kafka.clear_request_errors(PRODUCE_API)
            time.sleep(1.0)  # a delivery report of a refused request may come a moment later
        finally:
            t.pause_producing.clear()
        t.say(
            f"  publish refused for good ({self.refusals} requests): {len(self._set_aside())} rows set aside"
        )
        return True

    def _set_aside(self) -> list[tuple[int, str]]:
        t = self.trial
        with t.env.connect() as conn:
            rows = conn.execute(
                "SELECT id, failed_reason FROM txn_outbox WHERE job = %s AND failed_at IS NOT NULL ORDER BY id",
                (t.job,),
            ).fetchall()
        return [(int(i), str(r)) for i, r in rows]

    def _send(self, keys: dict[int, list[bytes]]) -> None:
        t = self.trial
        producer = Producer(
            {"bootstrap.servers": t.env.kafka.bootstrap_servers, "linger.ms": 5, "log_level": 2}
        )
        for p, partition_keys in keys.items():
            for key in partition_keys:
                while True:
                    try:
                        producer.produce(
                            t.topic, value=b"v", key=key, partition=p, on_delivery=t._on_delivery
                        )
                        break
                    except BufferError:
                        producer.poll(0.1)
        if producer.flush(120) != 0:
            raise RuntimeError("the refill was not delivered in 120s")

    # -- the operator ----------------------------------------------------------------------------
    def operate(self) -> None:
        """No instance runs, and the last ones stopped with an event's line: check what the
        stop left, then do what the line says."""
        t = self.trial
        stored = t._offsets()
        total, by_key = self._counted()
        failures = t.result.failures
        if self.awaiting == "reset" and self.old is not None:
            self._operate_reset(stored, total, by_key)
        elif self.awaiting == "skip":
            for p, off in self.poison:
                if stored.get(p, 0) > off:
                    failures.append(f"partition {p} committed to {stored[p]}, past the poison at {off}")
            expected_keys = self._kafka_keys(stored) if t.plan.counts_per_key else collections.Counter()
            self._compare("stopped on the poison", total, sum(stored.values()), by_key, expected_keys)
            self.extra_args += ["--on-bad-message", "skip"]
            t.result.events["operator-skip"] += 1
        t.say(f"  operator: {self.awaiting} done (stored {stored}, total {total})")
        self.awaiting = None

    def _operate_reset(self, stored: dict[int, int], total: int, by_key: collections.Counter[str]) -> None:
        """After a recreation: the dry run shows which partitions start a new generation; those
        are reset (the lines' commands), the others go on as they are.

        A partition that had counted nothing of the old log has nothing to verify (nor,
        on the mock, a topic ID), so the job counts the new log there in generation 0
        before another partition stops it. That is counted once and right; resetting it
        too (``--new-generation``) would count it twice. Every partition that counted
        something of the old log must be seen as recreated.
        """
        t, old, failures = self.trial, self.old, self.trial.result.failures
        assert old is not None
        plan = self._reset("--to-earliest")
        seen = {p for p in stored if f"{t.topic}/{p}: {stored[p]} -> 0, new generation 1" in plan.stdout}
        if plan.returncode != 0 or not seen or any(old.stored.get(p, 0) for p in stored if p not in seen):
            failures.append(
                f"txstore reset --to-earliest ({plan.returncode}) planned new generations for "
                f"partitions {sorted(seen)} of {stored} (at the recreation {old.stored}): "
                f"{(plan.stdout + plan.stderr)[-600:]}"
            )
        if any(not old.stored.get(p, 0) <= stored[p] <= old.ends[p] for p in seen):
            failures.append(f"old generation offsets {stored} outside {old.stored}..{old.ends}")
        old_keys = collections.Counter(
            k.decode() for p in seen for off, k in old.keys.get(p, {}).items() if off < stored[p]
        )
        new_keys = self._kafka_keys({p: off for p, off in stored.items() if p not in seen})
        self._compare("before the reset", total, sum(stored.values()), by_key, old_keys + new_keys)
        self.old_counted, self.old_keys, self.reset_partitions = sum(stored[p] for p in seen), old_keys, seen
        partitions = [a for p in sorted(seen) for a in ("--partition", str(p))]
        done = self._reset("--to-earliest", *partitions, "--execute")
        if done.returncode != 0 or done.stdout.count("new generation 1") != len(seen):
            failures.append(
                f"txstore reset --execute ({done.returncode}): {(done.stdout + done.stderr)[-600:]}"
            )
        t.result.events["operator-reset"] += 1
        t.pause_producing.clear()

    def _reset(self, *args: str) -> subprocess.CompletedProcess[str]:
        t = self.trial
        return subprocess.run(
            [
                sys.executable, "-m", "txstore.ops.cli", "reset", "--database-url", t.env.database_url,
                "--bootstrap-servers", t.env.kafka.bootstrap_servers, "--job", t.job, "--topic", t.topic, *args,
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def _counted(self) -> tuple[int, collections.Counter[str]]:
        t = self.trial
        with t.env.connect() as conn:
            row = conn.execute(
                "SELECT coalesce(sum(metric), 0) FROM txn_data WHERE job = %s AND topic = %s AND grain = 'topic'",
                (t.job, t.topic),
            ).fetchone()
            keys = conn.execute(
                "SELECT key, sum(metric) FROM txn_data WHERE job = %s AND topic = %s AND grain = %s GROUP BY key",
                (t.job, t.topic, t.key_grain),
            ).fetchall()
        return int(row[0]) if row else 0, collections.Counter({str(k): int(v) for k, v in keys})

    def _compare(
        self,
        what: str,
        total: int,
        expected: int,
        by_key: collections.Counter[str],
        expected_keys: collections.Counter[str],
    ) -> None:
        r = self.trial.result
        if total != expected:
            r.failures.append(f"{what}: total {total}, but the stored offsets cover {expected} messages")
            r.lost += max(0, expected - total)
            r.duplicated += max(0, total - expected)
        if self.trial.plan.counts_per_key and +by_key != +expected_keys:
            r.failures.append(f"{what}: per-key counts {dict(by_key)} differ from {dict(expected_keys)}")

    def _kafka_keys(self, until: dict[int, int]) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        conf = client_config(self.trial.env.kafka.bootstrap_servers)
        for p, end in until.items():
            if end:
                for batch in RangeReader(conf, OffsetRange(self.trial.topic, p, 0, end)):
                    counts.update((m.key() or b"").decode() for m in batch)
        return counts

    # -- the end ---------------------------------------------------------------------------------
    def produced(self, ends: dict[int, int]) -> int:
        """Every message the trial's topic held: the old topic's too."""
        return sum(ends.values()) + (sum(self.old.ends.values()) if self.old else 0)

    def expected_total(self, ends: dict[int, int]) -> int:
        return sum(ends.values()) + self.old_counted - len(self.poison)

    def expected_keys(self, kafka_keys: dict[str, int]) -> dict[str, int]:
        counts = collections.Counter(kafka_keys) + self.old_keys
        counts.pop(POISON_KEY.decode(), None)
        return dict(counts)

    def check(self) -> None:
        """What the events leave beyond totals: generations, bad messages, the outbox."""
        t = self.trial
        failures = t.result.failures
        with t.env.connect() as conn:
            generations = conn.execute(
                "SELECT part, generation FROM txn_offsets WHERE job = %s AND topic = %s", (t.job, t.topic)
            ).fetchall()
            bad = conn.execute(
                "SELECT part, off, generation FROM txn_bad_messages WHERE job = %s AND topic = %s",
                (t.job, t.topic),
            ).fetchall()
        want = {int(p): int(p in self.reset_partitions) for p, _ in generations}
        if dict((int(p), int(g)) for p, g in generations) != want:
            failures.append(f"generations {sorted(generations)}, expected {want}")
        if self.old:
            t.result.events["deleted-uncounted"] += sum(self.old.ends.values()) - self.old_counted
        found = {(int(p), int(o)) for p, o, _ in bad}
        if found != self.poison or len(bad) != len(self.poison):
            failures.append(f"txn_bad_messages holds {sorted(found)}, the poison is at {sorted(self.poison)}")
        if self.publish_topic:
            self._check_published()

    def _check_published(self) -> None:
        t = self.trial
        failures = t.result.failures
        assert self.publish_topic is not None
        set_aside = self._set_aside()
        if set_aside and not self.refusals:
            failures.append(f"outbox rows set aside though Kafka refused nothing: {set_aside[:3]}")
        elif set_aside:  # the operator, once the cause is gone
            if any("authoriz" not in reason.lower() for _, reason in set_aside):
                failures.append(f"rows set aside for another reason: {set_aside[:3]}")
            retried = subprocess.run(
                [
                    sys.executable, "-m", "txstore.ops.cli", "publish", "--database-url", t.env.database_url,
                    "--bootstrap-servers", t.env.kafka.bootstrap_servers, "--job", t.job, "--retry-failed",
                ],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if retried.returncode != 0:
                failures.append(
                    f"txstore publish --retry-failed ({retried.returncode}): {retried.stderr[-400:]}"
                )
            t.result.events["set-aside-retried"] += len(set_aside)
        with t.env.connect() as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE sent_at IS NULL AND failed_at IS NULL), "
                "count(*) FILTER (WHERE failed_at IS NOT NULL), count(*) FROM txn_outbox WHERE job = %s",
                (t.job,),
            ).fetchone()
        pending, set_aside, rows = row if row else (0, 0, 0)
        if pending or set_aside:
            failures.append(f"outbox: {pending} rows pending and {set_aside} set aside of {rows}")
        conf = client_config(t.env.kafka.bootstrap_servers)
        (marks,) = fetch_watermarks(conf, [self.publish_topic])
        parts: dict[str, set[int]] = collections.defaultdict(set)
        of: dict[str, int] = {}
        largest = 0
        for batch in RangeReader(conf, OffsetRange(self.publish_topic, 0, marks.low, marks.high)):
            for m in batch:
                size = len(m.value() or b"")
                largest = max(largest, size)
                pairs = m.headers() or []
                assert isinstance(pairs, list), pairs  # a consumed message's: (name, bytes) pairs
                headers = {k: v.decode() if isinstance(v, bytes) else v or "" for k, v in pairs}
                commit = headers.get("txstore-commit", "")
                parts[commit].add(int(headers.get("txstore-part", "0")))
                of[commit] = int(headers.get("txstore-parts", "0"))
        if largest > PUBLISH_MAX_BYTES:
            failures.append(f"a published message of {largest} bytes (at most {PUBLISH_MAX_BYTES})")
        broken = [c for c, got in parts.items() if got != set(range(1, of[c] + 1))]
        if broken:
            failures.append(f"{len(broken)} published commits lack parts, e.g. {broken[:3]}")
        if rows and not parts:
            failures.append(f"{rows} outbox rows but nothing published")
        t.result.injected["oversized-publish"] += sum(1 for c in of.values() if c > 1)
        t.result.events["published-parts"] += sum(len(p) for p in parts.values())
