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

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from txstore.core.errors import KafkaUnavailable, TxstoreError, UnknownTopic
from txstore.core.fingerprint import Fingerprint
from txstore.core.health import PartitionFacts
from txstore.core.ranges import OffsetRange, PartitionHistory, PartitionWatermarks
from txstore.kafka.client import BOOTSTRAP_ENV, fetch_watermarks
from txstore.kafka.reader import RangeReader
from txstore.kafka.topic_ids import fetch_topic_ids, messages_at_last_counted
from txstore.ops.status import STATUS_KAFKA_TIMEOUT_SECONDS, not_started, one_admin, pattern_matches
from txstore.postgres import store
from txstore.postgres.locks import job_running

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
    now = rows[0][-1] if rows else datetime.now(UTC)
    conn.commit()
    subs = store.subscriptions(conn, job)
    admin = one_admin(kafka_conf)
    matched, unlisted = pattern_matches(kafka_conf, subs, admin)
    running = {j: job_running(conn, j) for j in sorted({r[0] for r in rows} | set(matched))}
    marks: dict[tuple[str, int], PartitionWatermarks] = {}
    topic_ids: dict[str, str] = {}
    problem = None if kafka_conf else f"Kafka not given (--bootstrap-servers or {BOOTSTRAP_ENV})"
    problem = unlisted or problem
    if kafka_conf and problem is None:
        answered: list[str] = []
        for topic in sorted({r[1] for r in rows} | {t for ts in matched.values() for t in ts}):
            try:
                for partition in fetch_watermarks(kafka_conf, [topic], STATUS_KAFKA_TIMEOUT_SECONDS, admin()):
                    marks[partition.key] = partition
            except UnknownTopic:
                continue
            except KafkaUnavailable as e:
                problem = str(e)
                break
            answered.append(topic)
        else:  # one request; a topic deleted since its log offsets leaves all without IDs this once
            topic_ids = fetch_topic_ids(kafka_conf, answered)
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
    for j, topic, part, off, updated, generation, topic_id, _, _, _, samples, _ in rows:
        last = lasts[(j, topic, part)]
        w = marks.get((topic, part))
        found = at_last.get((j, topic, part))
        unread_since = None
        if (
            problem is None
            and kafka_conf
            and running[j]
            and (stall_after is None or now - updated > stall_after)
        ):
            unread_since = first_unread_written(kafka_conf, topic, part, off, w)
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
        for j, w in not_started([(r[0], r[1], r[2]) for r in rows], marks, subs, matched):
            unread_since = (
                first_unread_written(kafka_conf, w.topic, w.partition, w.low, w) if running[j] else None
            )
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
                    unread_since=unread_since,
                )
            )
        facts.sort(key=lambda f: (f.job, f.topic, f.partition))
    return facts, now


def first_unread_written(
    conf: Mapping[str, Any],
    topic: str,
    partition: int,
    offset: int,
    marks: PartitionWatermarks | None,
    timeout: float = STATUS_KAFKA_TIMEOUT_SECONDS,
) -> datetime | None:
    """When the first message at or after ``offset`` (below the log end) was written, by its
    Kafka timestamp; None if there is no such message, it has no timestamp, or it cannot be
    read in ``timeout`` seconds. Read committed, like the job: an open or aborted
    transaction's messages are not the job's lag."""
    if marks is None or not marks.low <= offset < marks.high:
        return None
    reader = RangeReader(
        conf,
        OffsetRange(topic, partition, offset, marks.high),
        batch_size=1,
        idle_timeout=timeout,
        pause_gc=False,
    )
    try:
        for batch in reader:
            kind, ms = batch[0].timestamp()
            if kind == TIMESTAMP_NOT_AVAILABLE:
                return None
            return _EPOCH + timedelta(milliseconds=ms)
    except (TxstoreError, OverflowError):
        return None
    return None
