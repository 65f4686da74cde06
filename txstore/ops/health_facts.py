"""What ``txstore status --check`` gathers for :mod:`txstore.core.health` to judge.

:func:`health_facts`: per partition a job stores an offset for (and per partition Kafka has in
its topics that it has no row for), a :class:`~txstore.core.health.PartitionFacts`: the row, the
job's lock (running or not), Kafka's watermarks and topic ID, the message at the last counted
offset (a recreated topic), and when the first message not counted was written
(:func:`first_unread_written`: a stalled job against an idle one's new messages). Kafka is asked
with the short timeout of ``txstore status``
(:data:`~txstore.ops.status.STATUS_KAFKA_TIMEOUT_SECONDS`): a broker that does not answer
leaves the Kafka facts unknown, never the command hanging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaException

from txstore.core.fingerprint import Fingerprint
from txstore.core.health import PartitionFacts
from txstore.core.ranges import PartitionHistory, PartitionWatermarks
from txstore.kafka.admin import one_client
from txstore.kafka.client import BOOTSTRAP_ENV
from txstore.kafka.first_messages import first_messages
from txstore.kafka.topic_ids import fetch_topic_ids, messages_at_last_counted
from txstore.ops.status import STATUS_KAFKA_TIMEOUT_SECONDS, ask_kafka, not_started
from txstore.postgres import store
from txstore.postgres.locks import job_running

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def health_facts(
    conn: psycopg.Connection,
    kafka_conf: Mapping[str, Any] | None,
    job: str | None = None,
    stall_after: timedelta | None = None,
) -> tuple[list[PartitionFacts], datetime]:
    """What :func:`txstore.core.health.evaluate` needs of every stored partition (of ``job``, or of
    all jobs), and the database's clock now (the one ``updated_at`` is written with).

    Kafka is asked for each topic's watermarks and topic ID, and for the message at each
    partition's last-counted offset where the log still holds it, as ``txstore reset``
    does to tell a recreated topic. A topic Kafka does not have leaves its partitions
    without watermarks; Kafka not answering (or not given) leaves them all unknown.

    Partitions Kafka has in those topics that a job has no row for (the topic gained
    partitions, or was recreated with more) are included with ``offset`` None: the job
    starts them at their log start.

    Where a running job has lag, the first message not counted is read too, for when it
    was written (``unread_since``, what tells STALL from an idle job's new messages); with
    ``stall_after`` given, only where the last commit is older (else it cannot be STALL).
    """
    rows = conn.execute(
        "SELECT job, topic, part, off, updated_at, generation, topic_id, last_off, last_timestamp, "
        "    last_digest, lag_samples, now() "
        "FROM txn_offsets WHERE %(job)s::text IS NULL OR job = %(job)s ORDER BY job, topic, part",
        {"job": job},
    ).fetchall()
    now = rows[0][-1] if rows else datetime.now(timezone.utc)
    conn.commit()
    subs = store.subscriptions(conn, job)
    client = one_client(kafka_conf or {})  # the check's one client, made when first asked
    kafka = ask_kafka(kafka_conf, subs, {r[1] for r in rows}, client)
    matched, marks = kafka.matched, kafka.marks
    running = {j: job_running(conn, j) for j in sorted({r[0] for r in rows} | set(matched))}
    problem = kafka.unavailable if kafka_conf else f"Kafka not given (--bootstrap-servers or {BOOTSTRAP_ENV})"
    # one request; a topic deleted since its log offsets leaves all without IDs this once
    topic_ids = (
        fetch_topic_ids(kafka_conf, kafka.answered, admin=client()) if kafka_conf and problem is None else {}
    )
    facts = []
    lasts = {
        (r[0], r[1], r[2]): Fingerprint(r[7], r[8], r[9]) if r[7] is not None and r[9] is not None else None
        for r in rows
    }
    at_last: dict[tuple[str, str, int], Fingerprint | None] = {}
    if problem is None and kafka_conf:  # one consumer per job for all its partitions (a thousand)
        for job_name in sorted({r[0] for r in rows}):
            wanted = [(t, p, last, marks.get((t, p))) for (j, t, p), last in lasts.items() if j == job_name]
            found_now = messages_at_last_counted(kafka_conf, wanted, STATUS_KAFKA_TIMEOUT_SECONDS)
            at_last.update({(job_name, t, p): f for (t, p), f in found_now.items()})
    new = not_started([(r[0], r[1], r[2]) for r in rows], marks, subs, matched) if problem is None else []
    unread: dict[tuple[str, str, int], datetime | None] = {}
    if problem is None and kafka_conf:  # one consumer per running job, as above
        for job_name in sorted(j for j, runs in running.items() if runs):
            reads = [
                (t, p, off, marks.get((t, p)))
                for j, t, p, off, updated, *_ in rows
                if j == job_name and (stall_after is None or now - updated > stall_after)
            ] + [(w.topic, w.partition, w.low, w) for j, w in new if j == job_name]
            when = first_unread_written(kafka_conf, reads)
            unread.update({(job_name, t, p): written for (t, p), written in when.items()})
    for j, topic, part, off, updated, generation, topic_id, _, _, _, samples, _ in rows:
        last = lasts[(j, topic, part)]
        w = marks.get((topic, part))
        found = at_last.get((j, topic, part))
        unread_since = unread.get((j, topic, part))
        facts.append(
            PartitionFacts(
                j,
                topic,
                part,
                off,
                updated,
                running[j],
                w,
                problem,
                PartitionHistory(generation, topic_id, last),
                topic_ids.get(topic),
                found,
                tuple(samples),
                unread_since,
            )
        )
    if problem is None and kafka_conf:
        for j, w in new:
            facts.append(
                PartitionFacts(
                    j,
                    w.topic,
                    w.partition,
                    None,
                    None,
                    running[j],
                    w,
                    topic_id=topic_ids.get(w.topic),
                    unread_since=unread.get((j, w.topic, w.partition)),
                )
            )
        facts.sort(key=lambda f: (f.job, f.topic, f.partition))
    return facts, now


def first_unread_written(
    conf: Mapping[str, Any],
    wanted: Sequence[tuple[str, int, int, PartitionWatermarks | None]],
    timeout: float = STATUS_KAFKA_TIMEOUT_SECONDS,
) -> dict[tuple[str, int], datetime | None]:
    """For each partition of one job (topic, partition, its offset, Kafka's watermarks), when the
    first message at or after the offset and below the log end was written, by its Kafka
    timestamp; None if there is no such message, it has no timestamp, or it was not read in
    ``timeout`` seconds. Read committed, like the job: an open or aborted transaction's messages
    are not the job's lag.

    Steps: read every partition whose log holds its offset from that offset, all in one
    assignment (:func:`~txstore.kafka.first_messages.first_messages`: one read per partition took
    46 s at 1,024); the time of each first message below the log end asked before. A partition
    that gave its end, an error or nothing is None: ``status`` never waits longer, nor fails for
    this."""
    found: dict[tuple[str, int], datetime | None] = {(t, p): None for t, p, _, _ in wanted}
    pending = {
        (t, p): (offset, marks.high)
        for t, p, offset, marks in wanted
        if marks is not None and marks.low <= offset < marks.high
    }
    try:
        answers = first_messages(conf, {key: offset for key, (offset, _) in pending.items()}, timeout)
    except (KafkaException, ValueError, TypeError):
        return found  # the consumer refused (its settings) or failed: nothing known
    for key, m in answers.items():
        offset = m.offset()
        if m.error() is None and offset is not None and offset < pending[key][1]:
            found[key] = _written(m)
    return found


def _written(message: Any) -> datetime | None:
    """When ``message`` was written, by its Kafka timestamp (None: it has none, or none a
    datetime can hold)."""
    kind, ms = message.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE:
        return None
    try:
        return _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return None
