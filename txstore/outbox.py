"""Publishing committed results to Kafka through the ``txn_outbox`` table.

The sink writes each commit's results to ``txn_outbox`` in the same
transaction as the offsets (:mod:`txstore.sink`), so a result is in the
outbox exactly when it is committed. Publishing is then at least once,
never lost, and every message carries a stable dedup key
(``job/topic/partition/until``) as its Kafka key and in headers, plus the
outbox row id (``txstore-outbox-id``, unique per commit even after an
offset reset), so consumers can drop the rare redelivery:

1. lock a chunk of unsent rows of the job (``FOR UPDATE SKIP LOCKED``, so
   two publishers never send the same rows at the same time);
2. produce them with ``acks=all`` and idempotence on, checking every
   delivery report; on the first failure stop producing more;
3. flush (bounded by a timeout), then mark exactly the delivered rows
   sent and COMMIT; any failure raises :class:`PublishFailed` and the
   undelivered rows stay for the next attempt.

One producer per process and configuration is reused across batches and
closed cleanly at shutdown (:func:`close_producers`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from txstore.errors import PublishFailed

log = logging.getLogger("txstore")

PUBLISH_TIMEOUT_SECONDS = 30.0
CHUNK_ROWS = 500
KEEP_SENT_DAYS = 7  # sent rows are kept this long for inspection, then deleted
PRUNE_EVERY_SECONDS = 3600.0

_producers: dict[tuple[tuple[str, str], ...], Producer] = {}
_producers_lock = threading.Lock()


def producer_config(base: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Reliable producer settings; a user's ``--kafka-option`` may not weaken them."""
    return {
        "linger.ms": 5,
        **base,
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": int(timeout * 1000),
    }


def shared_producer(conf: Mapping[str, Any]) -> Producer:
    """The process's producer for ``conf``, created on first use."""
    key = tuple(sorted((k, str(v)) for k, v in conf.items()))
    with _producers_lock:
        producer = _producers.get(key)
        if producer is None:
            producer = _producers[key] = Producer(dict(conf))
        return producer


def _drop_producer(producer: Producer) -> None:
    with _producers_lock:
        for key, p in list(_producers.items()):
            if p is producer:
                del _producers[key]


def close_producers(timeout: float = 10.0) -> None:
    """Flush and close every shared producer (at shutdown)."""
    with _producers_lock:
        producers = list(_producers.values())
        _producers.clear()
    for producer in producers:
        try:
            producer.flush(timeout)
        finally:
            producer.close()


atexit.register(close_producers)


def pending_count(conn: psycopg.Connection, job: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM txn_outbox WHERE job = %s AND sent_at IS NULL", (job,)
    ).fetchone()
    conn.commit()
    return int(row[0]) if row else 0


class OutboxPublisher:
    """Sends one job's unsent outbox rows to Kafka."""

    def __init__(
        self,
        kafka_conf: Mapping[str, Any],
        job: str,
        timeout: float = PUBLISH_TIMEOUT_SECONDS,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        self.conf = producer_config(kafka_conf, timeout)
        self.job = job
        self.timeout = timeout
        self.chunk_rows = chunk_rows
        self._pruned_at: float | None = None

    def publish_pending(self, conn: psycopg.Connection) -> int:
        """Publish every unsent row of the job; return how many were sent.

        Raises :class:`PublishFailed` on the first failure; rows not
        confirmed by Kafka stay unsent.
        """
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

    def _publish_chunk(self, conn: psycopg.Connection) -> tuple[int, bool]:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT id, destination, dedup_key, headers, payload::text FROM txn_outbox "
                "WHERE job = %s AND sent_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                (self.job, self.chunk_rows),
            )
            rows = cur.fetchall()
            if not rows:
                conn.rollback()
                return 0, False
            delivered, failure = self._produce(rows)
            if delivered:
                cur.execute("UPDATE txn_outbox SET sent_at = now() WHERE id = ANY(%s)", (delivered,))
        conn.commit()
        if failure is not None:
            destination = rows[0][1]
            raise PublishFailed(
                f"publishing results of job {self.job!r} to Kafka topic {destination!r} at "
                f"{self.conf.get('bootstrap.servers')} failed: {failure}; {len(rows) - len(delivered)} "
                "committed results stay in txn_outbox and are sent by the next batch "
                f"(or `txstore publish --job {self.job}`)"
            )
        log.info("job %s: published %d results to Kafka", self.job, len(delivered))
        return len(delivered), len(rows) == self.chunk_rows

    def _produce(self, rows: list[tuple[Any, ...]]) -> tuple[list[int], str | None]:
        """Produce rows, fail fast, flush; return the delivered ids and the first failure."""
        producer = shared_producer(self.conf)
        delivered: list[int] = []
        failures: list[str] = []

        def report(row_id: int) -> Any:
            def on_delivery(error: KafkaError | None, message: Message) -> None:
                if error is None:
                    delivered.append(row_id)
                else:
                    failures.append(f"{error.str()} ({error.name()})")

            return on_delivery

        try:
            for row_id, destination, dedup_key, headers, payload in rows:
                if failures:
                    break  # fail fast: the rest stay unsent, in order
                self._produce_one(
                    producer,
                    destination,
                    dedup_key,
                    [*((k, str(v)) for k, v in headers.items()), ("txstore-outbox-id", str(row_id))],
                    payload,
                    report(row_id),
                )
                producer.poll(0)
            remaining = producer.flush(self.timeout)
        except KafkaException as e:
            _drop_producer(producer)  # a fatal producer error: start afresh next time
            failures.append(str(e.args[0].str() if e.args else e))
            remaining = 0
        if remaining and not failures:
            failures.append(f"{remaining} messages not confirmed within {self.timeout:g}s")
        if any("fatal" in f.lower() for f in failures):
            _drop_producer(producer)
        return delivered, failures[0] if failures else None

    def _produce_one(
        self,
        producer: Producer,
        topic: str,
        key: str,
        headers: list[tuple[str, str | bytes | None]],
        payload: str,
        on_delivery: Any,
    ) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                producer.produce(
                    topic, payload.encode(), key.encode(), headers=headers, on_delivery=on_delivery
                )
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise KafkaException(KafkaError(KafkaError._QUEUE_FULL)) from None
                producer.poll(0.1)  # the local queue is full: let deliveries drain it
