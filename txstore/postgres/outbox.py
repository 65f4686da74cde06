"""Publishing committed results to Kafka through the ``txn_outbox`` table.

The sink writes each commit's results to ``txn_outbox`` in the same
transaction as the offsets (:mod:`txstore.postgres.sink`), as many rows (parts) as
keep each message under ``--publish-max-bytes``, so a result is in the
outbox exactly when it is committed. Publishing is then at least once,
never lost, and every message carries a key unique to its commit and part
(``job/topic/partition/until/<commit>/<part>``; a redelivery repeats it),
with the commit, part and parts, and the outbox row id in headers, so
consumers can reassemble a commit and drop the rare redelivery:

1. lock a chunk of the job's pending rows, unsent and not set aside
   (``FOR UPDATE SKIP LOCKED``, so two publishers never send the same rows
   at the same time);
2. produce them with ``acks=all`` and idempotence on, checking every
   delivery report. A row Kafka refuses for a reason retrying cannot fix
   (too large, topic missing, not authorized:
   :func:`~txstore.kafka.producers.set_aside_reason`) is
   set aside and the rest keep flowing; on any other failure stop
   producing more;
3. flush (bounded by a timeout). Kafka applies a topic's ``max.message.bytes``
   to a whole record batch, so rows refused as too large in a batch of several
   are sent again each in a batch of its own (:func:`~txstore.kafka.producers.single_message_config`);
   only a row refused alone is set aside, with the size of its record batch
   (:func:`~txstore.kafka.producers.record_batch_bytes`), which is what the topic must accept;
4. mark exactly the delivered rows
   sent and the refused ones set aside (``failed_at``, ``failed_reason``,
   one warning saying what to run) and COMMIT; a passing failure raises
   :class:`PublishFailed` and the undelivered rows stay for the next attempt.

``txstore publish --job J --retry-failed`` puts set-aside rows back in line.
One producer per process and configuration is reused across batches and
closed cleanly at shutdown (:mod:`txstore.kafka.producers`, which also says which refusals set
a row aside: :func:`~txstore.kafka.producers.set_aside_reason`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from txstore.core.errors import KafkaUnavailable, PublishFailed
from txstore.kafka.admin import refusal
from txstore.kafka.producers import (
    SIZE_REFUSALS,
    TOPIC_REFUSALS,
    drop_producer,
    errors_of,
    producer_config,
    record_batch_bytes,
    set_aside_reason,
    shared_producer,
    single_message_config,
    too_large_for_producer_reason,
    too_large_reason,
)

log = logging.getLogger("txstore")

PUBLISH_TIMEOUT_SECONDS = 30.0
CHUNK_ROWS = 500
CHUNK_BYTES = 64 * 1024 * 1024  # a chunk holds at most about this much payload in memory
KEEP_SENT_DAYS = 7  # sent rows are kept this long for inspection, then deleted
PRUNE_EVERY_SECONDS = 3600.0

FLUSH_SLICE_SECONDS = 0.5  # how often a flush looks for a refused login or certificate


def pending_count(conn: psycopg.Connection, job: str) -> int:
    """The job's rows waiting to be published (unsent and not set aside)."""
    return outbox_counts(conn, job)[0]


def outbox_counts(conn: psycopg.Connection, job: str) -> tuple[int, int]:
    """The job's unsent rows: (pending, set aside)."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE failed_at IS NULL), count(*) FILTER (WHERE failed_at IS NOT NULL) "
        "FROM txn_outbox WHERE job = %s AND sent_at IS NULL",
        (job,),
    ).fetchone()
    conn.commit()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def retry_set_aside(conn: psycopg.Connection, job: str) -> int:
    """Put the job's set-aside rows back in line to be published; return how many."""
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE txn_outbox SET failed_at = NULL, failed_reason = NULL "
            "WHERE job = %s AND sent_at IS NULL AND failed_at IS NOT NULL",
            (job,),
        )
        count = cur.rowcount
    conn.commit()
    return count


@dataclass
class _Outcome:
    """What became of a chunk of rows: delivered ids, set-aside ids with their reasons, ids
    refused as too large in a record batch with others (sent again alone), and the first
    passing failure (which stops the chunk)."""

    delivered: list[int] = field(default_factory=list)
    set_aside: dict[int, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    topic_refused: bool = False
    too_large_in_batch: list[int] = field(default_factory=list)
    refusal: KafkaUnavailable | None = None  # Kafka refused the login or sent an untrusted certificate

    def refused(self, row_id: int, error: KafkaError, size_reason: str | None = None) -> None:
        """Row ``row_id`` refused with ``error``. A size refusal is set aside only with its
        ``size_reason`` (the row was alone in its batch, or never left the producer)."""
        reason = set_aside_reason(error.code())
        if reason is None:
            self.failures.append(f"{error.str()} ({error.name()})")
        elif error.code() in SIZE_REFUSALS and size_reason is None:
            self.too_large_in_batch.append(row_id)
        else:
            detail = size_reason if error.code() in SIZE_REFUSALS and size_reason else reason
            self.set_aside[row_id] = f"{detail}: {error.str()} ({error.name()})"
            self.topic_refused |= error.code() in TOPIC_REFUSALS


_Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class _Message:
    """One outbox row as the message that carries it."""

    topic: str
    key: bytes
    value: bytes
    headers: _Headers

    @property
    def batch_bytes(self) -> int:
        return record_batch_bytes(self.key, self.value, self.headers)


class OutboxPublisher:
    """Sends one job's unsent outbox rows to Kafka."""

    def __init__(
        self,
        kafka_conf: Mapping[str, Any],
        job: str,
        timeout: float = PUBLISH_TIMEOUT_SECONDS,
        chunk_rows: int = CHUNK_ROWS,
        chunk_bytes: int = CHUNK_BYTES,
        batch_bytes: int | None = None,
    ) -> None:
        """``batch_bytes``: the largest record batch to make of several messages (a job's
        ``--publish-max-bytes``, which its messages are sized for; :func:`~txstore.kafka.producers.producer_config`)."""
        self.conf = producer_config(kafka_conf, timeout, batch_bytes)
        self.job = job
        self.timeout = timeout
        self.chunk_rows = chunk_rows
        self.chunk_bytes = chunk_bytes
        self._pruned_at: float | None = None

    def publish_pending(self, conn: psycopg.Connection, retry_failed: bool = False) -> int:
        """Publish every pending row of the job; return how many were sent.

        Rows Kafka refuses for good are set aside (with one warning) and the
        rest go on. Raises :class:`PublishFailed` on the first passing failure;
        rows not confirmed by Kafka stay pending. ``retry_failed``: first put
        the set-aside rows back in line.
        """
        if retry_failed:
            count = retry_set_aside(conn, self.job)
            if count:
                log.info("job %s: retrying %d set-aside outbox rows", self.job, count)
        sent = 0
        while True:
            n, more = self._publish_chunk(conn)
            sent += n
            if not more:
                break
        if self._pruned_at is None or time.monotonic() - self._pruned_at > PRUNE_EVERY_SECONDS:
            self.prune_sent(conn)
        return sent

    def prune_sent(self, conn: psycopg.Connection, keep_days: float = KEEP_SENT_DAYS) -> int:
        """Delete the job's rows sent more than ``keep_days`` ago; return how many."""
        with conn.cursor() as cur:
            cur.execute(
                "DELETE FROM txn_outbox WHERE job = %s AND sent_at < now() - make_interval(secs => %s)",
                (self.job, keep_days * 86400),
            )
            deleted = cur.rowcount
        conn.commit()
        self._pruned_at = time.monotonic()
        return deleted

    def _lock_chunk(self, conn: psycopg.Connection) -> tuple[list[tuple[Any, ...]], bool]:
        """Lock and read the next pending rows, up to ``chunk_rows`` rows or about
        ``chunk_bytes`` of payload (a server-side cursor locks rows as they are
        fetched, so the rest stay free); return them and whether more may wait."""
        rows: list[tuple[Any, ...]] = []
        size = 0
        with conn.cursor(name="txstore_outbox_chunk") as fetch:
            fetch.execute(
                "SELECT id, destination, dedup_key, headers, payload::text, part, parts FROM txn_outbox "
                "WHERE job = %s AND sent_at IS NULL AND failed_at IS NULL ORDER BY id LIMIT %s "
                "FOR UPDATE SKIP LOCKED",
                (self.job, self.chunk_rows),
            )
            while len(rows) < self.chunk_rows and size < self.chunk_bytes:
                more = fetch.fetchmany(min(50, self.chunk_rows - len(rows)))
                if not more:
                    break
                rows += more
                size += sum(len(r[4]) for r in more)
        return rows, len(rows) == self.chunk_rows or size >= self.chunk_bytes

    def _publish_chunk(self, conn: psycopg.Connection) -> tuple[int, bool]:
        rows, more = self._lock_chunk(conn)
        if not rows:
            conn.rollback()
            return 0, False
        with conn.cursor() as cur:
            outcome = self._produce(rows)
            if outcome.delivered:
                cur.execute("UPDATE txn_outbox SET sent_at = now() WHERE id = ANY(%s)", (outcome.delivered,))
            if outcome.set_aside:
                cur.execute(
                    "UPDATE txn_outbox o SET failed_at = now(), failed_reason = r.reason "
                    "FROM unnest(%s::bigint[], %s::text[]) AS r(id, reason) WHERE o.id = r.id",
                    (list(outcome.set_aside), list(outcome.set_aside.values())),
                )
        conn.commit()
        destination = rows[0][1]
        if outcome.set_aside:
            self._warn_set_aside(destination, outcome.set_aside)
        if outcome.refusal is not None:
            raise outcome.refusal  # the rows not delivered stay pending, as after any failure
        if outcome.failures:
            raise PublishFailed(
                f"publishing results of job {self.job!r} to Kafka topic {destination!r} at "
                f"{self.conf.get('bootstrap.servers')} failed: {outcome.failures[0]}; "
                f"{len(rows) - len(outcome.delivered) - len(outcome.set_aside)} committed results stay in "
                f"txn_outbox and are sent by the next batch (or `txstore publish --job {self.job}`)"
            )
        log.info("job %s: published %d results to Kafka", self.job, len(outcome.delivered))
        return len(outcome.delivered), more

    def _warn_set_aside(self, destination: str, set_aside: Mapping[int, str]) -> None:
        ids = sorted(set_aside)
        shown = ", ".join(str(i) for i in ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        log.warning(
            "job %r: set aside %d outbox %s for Kafka topic %r (outbox %s %s): %s; later results are still "
            "published; fix the cause, then run `txstore publish --job %s --retry-failed`",
            self.job,
            len(ids),
            "row" if len(ids) == 1 else "rows",
            destination,
            "id" if len(ids) == 1 else "ids",
            shown,
            set_aside[ids[0]],
            self.job,
        )

    def _produce(self, rows: list[tuple[Any, ...]]) -> _Outcome:
        """Produce rows, set aside the ones Kafka refuses for good, stop at the first other
        failure, flush, send again alone the rows refused as too large in a batch; return what
        became of each."""
        producer = shared_producer(self.conf)
        errors = errors_of(self.conf)
        errors.clear()  # only this chunk's errors explain its failure
        outcome = _Outcome()
        messages: dict[int, _Message] = {}

        def report(row_id: int) -> Any:
            def on_delivery(error: KafkaError | None, message: Message) -> None:
                if error is None:
                    outcome.delivered.append(row_id)
                else:
                    outcome.refused(row_id, error)

            return on_delivery

        try:
            for row_id, destination, dedup_key, headers, payload, part, parts in rows:
                if outcome.failures:
                    break  # fail fast: the rest stay pending, in order
                message = messages[row_id] = _Message(
                    destination,
                    dedup_key.encode(),
                    payload.encode(),
                    [
                        *((k, str(v)) for k, v in headers.items()),
                        ("txstore-part", str(part)),
                        ("txstore-parts", str(parts)),
                        ("txstore-outbox-id", str(row_id)),
                    ],
                )
                try:
                    self._produce_one(producer, message, report(row_id))
                except KafkaException as e:
                    error = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                    if error is None or set_aside_reason(error.code()) is None:
                        raise
                    # refused before it left: larger than the producer's message.max.bytes, topic known bad
                    outcome.refused(
                        row_id, error, too_large_for_producer_reason(message.batch_bytes, self.conf)
                    )
                producer.poll(0)
            remaining = self._flush(producer, errors, outcome)
        except KafkaException as e:
            drop_producer(producer)  # a fatal producer error: start afresh next time
            outcome.failures.append(str(e.args[0].str() if e.args else e))
            remaining = 0
        if remaining and not outcome.failures:
            outcome.failures.append(f"{remaining} messages not confirmed within {self.timeout:g}s")
        if outcome.topic_refused or any("fatal" in f.lower() for f in outcome.failures):
            drop_producer(producer)
        if outcome.too_large_in_batch and not outcome.failures and outcome.refusal is None:
            self._send_alone(messages, outcome)
        return outcome

    def _send_alone(self, messages: Mapping[int, _Message], outcome: _Outcome) -> None:
        """Send each row Kafka refused as too large in a record batch with others in a batch of
        its own: one that fits the topic is delivered; one refused alone is set aside, with the
        size the topic must accept."""
        ids, outcome.too_large_in_batch = outcome.too_large_in_batch, []
        log.info(
            "job %s: %d outbox rows refused as too large in a record batch with others; sending each alone",
            self.job,
            len(ids),
        )
        conf = single_message_config(self.conf)
        producer = shared_producer(conf)
        errors = errors_of(conf)
        errors.clear()

        def report(row_id: int, size_reason: str) -> Any:
            def on_delivery(error: KafkaError | None, message: Message) -> None:
                if error is None:
                    outcome.delivered.append(row_id)
                else:
                    outcome.refused(row_id, error, size_reason)

            return on_delivery

        try:
            for row_id in ids:
                if outcome.failures:
                    break
                message = messages[row_id]
                self._produce_one(
                    producer, message, report(row_id, too_large_reason(message.topic, message.batch_bytes))
                )
                producer.poll(0)
            remaining = self._flush(producer, errors, outcome)
        except KafkaException as e:
            drop_producer(producer)
            outcome.failures.append(str(e.args[0].str() if e.args else e))
            remaining = 0
        if remaining and not outcome.failures:
            outcome.failures.append(f"{remaining} messages not confirmed within {self.timeout:g}s")
        if outcome.topic_refused or any("fatal" in f.lower() for f in outcome.failures):
            drop_producer(producer)

    def _flush(self, producer: Producer, errors: list[KafkaError], outcome: _Outcome) -> int:
        """Wait until every message is delivered or refused, up to the timeout; return how many
        are left. A login Kafka refuses, or a certificate this client does not trust, ends the
        wait at once, in the line planning gives (:func:`txstore.kafka.admin.refusal`): the
        producer's messages are purged and the producer dropped, and ``outcome.refusal`` says why."""
        deadline = time.monotonic() + self.timeout
        while True:
            remaining = int(producer.flush(max(min(FLUSH_SLICE_SECONDS, deadline - time.monotonic()), 0.0)))
            if not remaining or time.monotonic() >= deadline:
                return remaining
            refused = refusal(errors, str(self.conf.get("bootstrap.servers")), self.conf)
            if refused is not None:
                outcome.refusal = refused
                producer.purge()
                producer.poll(0)  # their reports (purged: a passing failure) before the producer goes
                drop_producer(producer)
                return 0

    def _produce_one(self, producer: Producer, message: _Message, on_delivery: Any) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                producer.produce(
                    message.topic,
                    message.value,
                    message.key,
                    headers=message.headers,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise KafkaException(KafkaError(KafkaError._QUEUE_FULL)) from None
                producer.poll(0.1)  # the local queue is full: let deliveries drain it
