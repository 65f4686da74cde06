"""The ``aborted-transactions`` fault kind (real Kafka only): a transactional producer beside the
trial's plain one, committing some transactions and aborting others.

Each transaction writes 1-60 keyed messages to random partitions, stays open for up to a
second (the partitions' last stable offset stays below it meanwhile, so a job planning then
must stop there), waits until every message is in the log, then commits or (40%) aborts.
Aborted messages stay in the log, and every transaction ends with a control marker: both take
offsets, and neither may ever be counted. The expected count is the plain producer's messages
plus the committed transactions' messages; the stored offsets must still reach the log ends.

Outcomes are recorded by partition and offset from the delivery reports. A commit or abort
that fails retriably is tried again; one that needs an abort is aborted. When the producer
fails fatally (say the broker was killed under it) the transaction's outcome is not known to
the producer: its messages are kept as uncertain, a new producer with the same
``transactional.id`` fences the old one (Kafka then aborts the transaction unless its commit
was already decided), and the check takes Kafka's read-committed view for those messages only.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

ABORT_SHARE = 0.4
OPERATION_SECONDS = 60.0  # one commit, abort or flush, at most (a killed broker restarts in ~10 s)
TRANSACTION_TIMEOUT_MS = 30_000  # a transaction its producer abandoned is aborted this soon


class TransactionalTraffic:
    """Transactions committed and aborted on ``topic`` until ``stop`` is set."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        partitions: int,
        keys: int,
        rng: random.Random,
        stop: threading.Event,
        say: Callable[[str], None],
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.partitions = partitions
        self.keys = keys
        self.rng = rng
        self.stop = stop
        self.say = say
        self.transactional_id = f"{topic}-txn"
        # partition -> offset -> key, by the transaction's known outcome
        self.committed: dict[int, dict[int, bytes]] = collections.defaultdict(dict)
        self.aborted: dict[int, dict[int, bytes]] = collections.defaultdict(dict)
        self.uncertain: dict[int, dict[int, bytes]] = collections.defaultdict(dict)
        self.transactions: collections.Counter[str] = collections.Counter()
        self.delivery_errors: list[str] = []
        self.problems: list[str] = []

    def _producer(self) -> Producer:
        """A producer that has taken over ``transactional.id`` (fencing any earlier one), retried
        while the broker is away."""
        deadline = time.monotonic() + 2 * OPERATION_SECONDS
        while True:
            producer = Producer(
                {
                    "bootstrap.servers": self.bootstrap_servers,
                    "transactional.id": self.transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "linger.ms": 5,
                    "message.timeout.ms": TRANSACTION_TIMEOUT_MS,  # librdkafka: at most the transaction's
                    "log_level": 2,
                }
            )
            try:
                producer.init_transactions(OPERATION_SECONDS)
                return producer
            except KafkaException as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"init_transactions kept failing: {e.args[0]}") from None
                time.sleep(0.5)

    def run(self) -> None:
        """Until ``stop``: one transaction after another; each ends (committed, aborted or
        fenced) before the next begins, and before this returns."""
        producer = self._producer()
        while not self.stop.is_set():
            written: dict[tuple[int, int], bytes] = {}
            failed: list[str] = []

            def on_delivery(
                err: Any,
                msg: Any,
                written: dict[tuple[int, int], bytes] = written,
                failed: list[str] = failed,
            ) -> None:
                if err is None:
                    written[(msg.partition(), msg.offset())] = msg.key() or b""
                else:
                    failed.append(str(err))

            # The first two commit and abort, so that a short window has one of each.
            started = sum(self.transactions.values())
            abort = started == 1 or (started > 1 and self.rng.random() < ABORT_SHARE)
            producer.begin_transaction()
            for _ in range(self.rng.randint(1, 60)):
                key = f"k{self.rng.randrange(self.keys)}".encode()
                partition = self.rng.randrange(self.partitions)
                producer.produce(
                    self.topic, value=b"t", key=key, partition=partition, on_delivery=on_delivery
                )
            self.stop.wait(self.rng.uniform(0.0, 1.0))  # open: the last stable offset waits below it
            outcome = self._end(producer, abort, failed)
            if outcome == "fenced":
                self._record(self.uncertain, written)
                producer = self._producer()  # fences the old producer: Kafka ends its transaction
            else:
                self._record(self.committed if outcome == "committed" else self.aborted, written)
            self.transactions[outcome] += 1
            self.delivery_errors += failed
        producer.flush(OPERATION_SECONDS)

    def _end(self, producer: Producer, abort: bool, failed: list[str]) -> str:
        """Commit or abort the open transaction: "committed", "aborted", or "fenced" (unknown)."""
        deadline = time.monotonic() + OPERATION_SECONDS
        if producer.flush(OPERATION_SECONDS) != 0 or failed:
            abort = True  # a message that was not delivered: the transaction cannot commit
        while True:
            try:
                if abort:
                    producer.abort_transaction(OPERATION_SECONDS)
                    return "aborted"
                producer.commit_transaction(OPERATION_SECONDS)
                return "committed"
            except KafkaException as e:
                error = e.args[0]
                fatal = not isinstance(error, KafkaError) or error.fatal()
                if not fatal and error.txn_requires_abort() and not abort:
                    abort = True
                    continue
                if not fatal and error.retriable() and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                self.problems.append(f"{'abort' if abort else 'commit'} failed: {error}")
                return "fenced"

    @staticmethod
    def _record(into: dict[int, dict[int, bytes]], written: dict[tuple[int, int], bytes]) -> None:
        for (partition, offset), key in written.items():
            into[partition][offset] = key

    # -- the check --------------------------------------------------------------------------------
    def count(self, outcome: dict[int, dict[int, bytes]]) -> int:
        return sum(len(offsets) for offsets in outcome.values())

    def judge(self, visible: dict[int, dict[int, bytes]]) -> tuple[int, list[str]]:
        """Given Kafka's read-committed messages (partition -> offset -> key): how many of them
        are this producer's, and what contradicts the outcomes recorded."""
        failures = []
        hidden = [(p, o) for p, offs in self.committed.items() for o in offs if o not in visible.get(p, {})]
        shown = [(p, o) for p, offs in self.aborted.items() for o in offs if o in visible.get(p, {})]
        if hidden:
            failures.append(
                f"{len(hidden)} messages of committed transactions not readable, e.g. {hidden[:3]}"
            )
        if shown:
            failures.append(f"{len(shown)} messages of aborted transactions readable, e.g. {shown[:3]}")
        settled = sum(1 for p, offs in self.uncertain.items() for o in offs if o in visible.get(p, {}))
        return self.count(self.committed) + settled, failures
