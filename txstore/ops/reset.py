"""``txstore reset``: read what is stored and what Kafka holds, plan the moves, apply them.

Steps: :func:`plan_job_reset` reads the job's offsets and Kafka's watermarks, topic ID, the
message at each last-counted offset and (``--to-datetime``) the offsets for the time, and
plans the moves with the pure :func:`txstore.ops.reset_plan.plan_reset` (nothing changed);
:func:`apply_reset` applies them in one transaction, each statement conditional on the
offset the plan saw, while holding the job's reset lock (refused while the job runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from txstore.core.errors import KafkaUnavailable, TxstoreError, UnknownTopic
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import PartitionWatermarks
from txstore.kafka.admin import Admin
from txstore.kafka.client import BOOTSTRAP_ENV, fetch_watermarks
from txstore.kafka.list_offsets import offsets_for_timestamp
from txstore.kafka.topic_ids import fetch_topic_ids, messages_at_last_counted
from txstore.ops.reset_plan import ResetMove, ResetTarget, plan_forget, plan_reset
from txstore.postgres import store
from txstore.postgres.locks import lock_job_for_reset


def plan_job_reset(
    conn: psycopg.Connection,
    kafka_conf: Mapping[str, Any] | None,
    job: str,
    topic: str,
    partitions: Sequence[int] | None,
    target: ResetTarget,
    new_generation: bool = False,
) -> list[ResetMove]:
    """Read what is stored and what Kafka holds, and plan the reset (nothing is changed).

    To tell a recreated topic (a new generation, :mod:`txstore.ops.reset_plan`), Kafka
    is also asked for the topic's ID and for the message at each partition's
    last-counted offset, where the log can still hold it.
    """
    offsets, history = store.committed_state(conn, job, [topic])
    stored = {part: off for (_, part), off in offsets.items()}
    past = {part: h for (_, part), h in history.items()}
    watermarks = None
    time_offsets = None
    unanswered: set[int] = set()
    topic_id = None
    found: dict[int, Fingerprint | None] = {}
    if target.kind == "forget":
        watermarks, problem = forget_watermarks(kafka_conf, topic)
        return plan_forget(job, topic, partitions, stored, watermarks, problem)
    if kafka_conf:
        admin = Admin(kafka_conf)  # one client for every admin request of the plan
        watermarks = {w.partition: w for w in fetch_watermarks(kafka_conf, [topic], admin=admin)}
        topic_id = fetch_topic_ids(kafka_conf, [topic], admin=admin).get(topic)
        chosen = partitions or sorted(watermarks)
        at_last = messages_at_last_counted(
            kafka_conf, [(topic, p, past[p].last if p in past else None, watermarks.get(p)) for p in chosen]
        )
        found.update({p: at_last[(topic, p)] for p in chosen})
        if target.kind == "datetime":
            assert target.value is not None
            result = offsets_for_timestamp(
                kafka_conf, [(topic, p) for p in chosen], target.value, admin=admin
            )
            time_offsets = {p: o for (_, p), o in result.items()}
            unanswered = unanswered_time_lookups(kafka_conf, topic, time_offsets, watermarks, admin)
    return plan_reset(
        job,
        topic,
        partitions,
        stored,
        watermarks,
        target,
        time_offsets,
        past,
        topic_id,
        found,
        new_generation,
        unanswered,
    )


def forget_watermarks(
    kafka_conf: Mapping[str, Any] | None, topic: str
) -> tuple[dict[int, PartitionWatermarks] | None, str | None]:
    """For ``--forget``: the partitions Kafka has in ``topic`` (none if it has no such topic), or
    None and why it cannot be told (Kafka not given, or not answering)."""
    if kafka_conf is None:
        return None, f"Kafka not given (--bootstrap-servers or {BOOTSTRAP_ENV})"
    try:
        return {w.partition: w for w in fetch_watermarks(kafka_conf, [topic])}, None
    except UnknownTopic:
        return {}, None
    except KafkaUnavailable as e:
        return None, str(e)


def unanswered_time_lookups(
    kafka_conf: Mapping[str, Any],
    topic: str,
    time_offsets: Mapping[int, int],
    watermarks: Mapping[int, PartitionWatermarks],
    admin: Admin | None = None,
) -> set[int]:
    """The partitions with messages whose offsets-for-times answer was -1 (no message at or after
    the time) and that answer -1 for 1970 too: Kafka cannot look times up there (messages
    without timestamps, or a broker that does not implement it), so their -1 says nothing.
    ``admin``: the reset's client."""
    none_after = [
        p
        for p, o in time_offsets.items()
        if o < 0 and p in watermarks and watermarks[p].low < watermarks[p].high
    ]
    if not none_after:
        return set()
    since_1970 = offsets_for_timestamp(kafka_conf, [(topic, p) for p in none_after], 0, admin=admin)
    return {p for p in none_after if since_1970.get((topic, p), -1) < 0}


class ResetConflict(TxstoreError):
    """An offset changed between planning and applying a reset."""


def apply_reset(conn: psycopg.Connection, job: str, moves: Sequence[ResetMove]) -> None:
    """Apply the planned moves in one transaction, refusing while the job runs.

    Each statement is conditional on the offset and generation the plan
    showed, so a change since then rolls the whole reset back instead of
    overwriting it. A move into a new generation also forgets the old log's
    last message and stores the new topic ID (if known).
    """
    with conn.transaction():
        lock_job_for_reset(conn, job)
        for m in moves:
            key = {"job": job, "topic": m.topic, "part": m.partition, "old": m.old, "new": m.new}
            if m.new is None:
                cur = conn.execute(
                    "DELETE FROM txn_offsets WHERE job = %(job)s AND topic = %(topic)s AND part = %(part)s "
                    "AND off = %(old)s",
                    key,
                )
            elif m.old is None:
                cur = conn.execute(
                    "INSERT INTO txn_offsets (job, topic, part, off, generation) "
                    "SELECT %(job)s, %(topic)s, %(part)s, %(new)s, "
                    + store.first_generation_sql("%(job)s", "%(topic)s", "%(part)s")
                    + " ON CONFLICT DO NOTHING",
                    key,
                )
            elif m.new_generation is not None:
                cur = conn.execute(
                    "UPDATE txn_offsets SET off = %(new)s, generation = %(new_generation)s, "
                    "topic_id = %(topic_id)s, last_off = NULL, last_timestamp = NULL, last_digest = NULL, "
                    "lag_samples = '{}', updated_at = now() WHERE job = %(job)s AND topic = %(topic)s AND part = %(part)s "
                    "AND off = %(old)s AND generation = %(generation)s",
                    {
                        **key,
                        "generation": m.generation,
                        "new_generation": m.new_generation,
                        "topic_id": m.topic_id,
                    },
                )
            else:
                cur = conn.execute(
                    "UPDATE txn_offsets SET off = %(new)s, lag_samples = '{}', updated_at = now() WHERE job = %(job)s "
                    "AND topic = %(topic)s AND part = %(part)s AND off = %(old)s AND generation = %(generation)s",
                    {**key, "generation": m.generation},
                )
            if cur.rowcount != 1:
                raise ResetConflict(
                    f"job {job!r} {m.topic!r} partition {m.partition}: the stored offset changed since the "
                    "plan was made; nothing was changed, run the reset again"
                )
