"""TransactionalSink: results and offset moves in one transaction.

For one range (per-range commits, one Spark task each) or for every range of
a batch (per-batch commits, on the driver), in one PostgreSQL transaction:

1. upsert the result deltas (``metric = metric + delta``), rows in a fixed
   order (:func:`~txstore.results.row_order`) so that concurrent
   transactions touching the same rows (every partition's task adds to the
   topic total) lock them in the same order and cannot deadlock; when the
   job publishes its results, the same statement writes the new totals to
   ``txn_outbox`` (:mod:`txstore.outbox` sends them to Kafka later);
2. ``UPDATE txn_offsets SET off = until WHERE job/topic/part AND off = from``
   (and the generation the range was planned in) for every range, in one
   statement, storing the fingerprint of each range's last message;
3. every range's row updated: COMMIT. Anything else: ROLLBACK, then read the
   stored offsets and raise the :class:`~txstore.errors.CommitConflict`
   that says why (:func:`classify_conflict`, :func:`classify_batch_conflict`).

Because the results only exist if each offset moved from exactly ``from`` to
exactly ``until``, no message is ever counted twice or skipped, whatever
Spark retries, speculates or loses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from txstore.errors import AlreadyCommitted, CommitConflict, OffsetGap, OffsetOverlap
from txstore.failpoints import FailPoints
from txstore.fingerprint import Fingerprint
from txstore.ranges import OffsetRange, TopicPartition
from txstore.results import TOPIC_TOTAL, Number, ResultKey, metric_text, row_order
from txstore.store import stored_offsets

__all__ = [
    "TOPIC_TOTAL",
    "BatchDeltas",
    "ResultKey",
    "TransactionalSink",
    "classify_batch_conflict",
    "classify_conflict",
]

BatchDeltas = Mapping[tuple[str, ResultKey], Number]
"""Per-batch deltas: ``(topic, ResultKey) -> delta``."""

_DELTAS = """
SELECT * FROM unnest(%(topics)s::text[], %(grains)s::text[], %(keys)s::text[],
                     %(windows)s::timestamptz[], %(metrics)s::numeric[])
       WITH ORDINALITY AS d(topic, grain, key, window_start, metric, ord)
"""

_UPSERT_BODY = """
INSERT INTO txn_data (job, topic, grain, key, window_start, metric, updated_at)
SELECT %(job)s, d.topic, d.grain, d.key, d.window_start, d.metric, now() FROM d ORDER BY d.ord
ON CONFLICT (job, topic, grain, key, window_start)
DO UPDATE SET metric = txn_data.metric + EXCLUDED.metric, updated_at = EXCLUDED.updated_at
"""

_UPSERT = f"WITH d AS ({_DELTAS})\n{_UPSERT_BODY}"

# The same upsert, plus one outbox row holding each result's delta and new total.
# The coalesce() equalities make the join hashable; IS NOT DISTINCT FROM makes it exact.
_UPSERT_AND_OUTBOX = f"""
WITH d AS ({_DELTAS}),
up AS ({_UPSERT_BODY} RETURNING topic, grain, key, window_start, metric)
INSERT INTO txn_outbox (job, destination, dedup_key, headers, payload)
SELECT %(job)s, %(destination)s, %(dedup_key)s, %(headers)s::jsonb,
       jsonb_build_object(
         'job', %(job)s::text,
         'ranges', %(ranges)s::jsonb,
         'results', coalesce(jsonb_agg(jsonb_build_object(
             'topic', up.topic, 'grain', up.grain, 'key', up.key, 'window_start', up.window_start,
             'delta', d.metric, 'total', up.metric) ORDER BY d.ord), '[]'::jsonb))
FROM up JOIN d
  ON d.topic = up.topic AND d.grain = up.grain
 AND coalesce(d.key, '') = coalesce(up.key, '')
 AND coalesce(d.window_start, '-infinity') = coalesce(up.window_start, '-infinity')
 AND d.key IS NOT DISTINCT FROM up.key AND d.window_start IS NOT DISTINCT FROM up.window_start
"""

# Moves each offset from exactly `from` in the planned generation, and stores the
# fingerprint of the range's last message (kept as it was if the range had none).
_MOVE_OFFSETS = """
UPDATE txn_offsets o SET off = r.until_off, updated_at = now(),
    last_off = coalesce(r.last_off, o.last_off),
    last_timestamp = CASE WHEN r.last_off IS NULL THEN o.last_timestamp ELSE r.last_ts END,
    last_digest = coalesce(r.last_digest, o.last_digest)
FROM unnest(%(r_topics)s::text[], %(r_parts)s::int[], %(r_froms)s::bigint[], %(r_untils)s::bigint[],
            %(r_gens)s::int[], %(r_last_offs)s::bigint[], %(r_last_tss)s::bigint[], %(r_last_digests)s::text[])
     AS r(topic, part, from_off, until_off, generation, last_off, last_ts, last_digest)
WHERE o.job = %(job)s AND o.topic = r.topic AND o.part = r.part AND o.off = r.from_off
  AND o.generation = r.generation
"""


def classify_conflict(job: str, offset_range: OffsetRange, stored_offset: int | None) -> CommitConflict:
    """Name why the conditional update matched no row, from the offset found.

    - stored == until: the range was committed before (retry, speculation,
      lost acknowledgement) -> :class:`AlreadyCommitted`, harmless;
    - stored < from: committing would skip messages -> :class:`OffsetGap`;
    - anything else (inside or past the range, or no row) -> :class:`OffsetOverlap`.
    """
    if stored_offset is not None and stored_offset == offset_range.until_offset:
        return AlreadyCommitted(job, offset_range, stored_offset)
    if stored_offset is not None and stored_offset < offset_range.from_offset:
        return OffsetGap(job, offset_range, stored_offset)
    return OffsetOverlap(job, offset_range, stored_offset)


def classify_batch_conflict(
    job: str, ranges: Sequence[OffsetRange], stored: Mapping[TopicPartition, int | None]
) -> CommitConflict:
    """Why a batch's offset update did not match every range.

    Every range already at ``until``: the whole batch was committed before
    (:class:`AlreadyCommitted`). Otherwise the first range not at its
    ``from`` names the problem; one already committed while others are not
    means another writer committed part of the batch, so committing the
    rest would count its messages twice (:class:`OffsetOverlap`).
    """
    off = [r for r in ranges if stored.get(r.key) != r.from_offset]
    conflicts = [classify_conflict(job, r, stored.get(r.key)) for r in off]
    if len(off) == len(ranges) and all(isinstance(c, AlreadyCommitted) for c in conflicts):
        return conflicts[0]
    for c in conflicts:
        if not isinstance(c, AlreadyCommitted):
            return c
    return OffsetOverlap(job, off[0], stored.get(off[0].key))


def _json_ranges(ranges: Sequence[OffsetRange]) -> str:
    return json.dumps(
        [
            {"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
            for r in ranges
        ]
    )


def outbox_identity(job: str, ranges: Sequence[OffsetRange]) -> tuple[str, dict[str, str]]:
    """The stable dedup key and Kafka headers of the outbox row for a commit.

    One range: ``job/topic/partition/until``, which a redelivery repeats exactly.
    A batch: ``job/batch/<hash of its ranges>``, with the ranges in a header.
    """
    headers = {"txstore-job": job}
    if len(ranges) == 1:
        r = ranges[0]
        headers.update(
            {
                "txstore-topic": r.topic,
                "txstore-partition": str(r.partition),
                "txstore-until": str(r.until_offset),
            }
        )
        return f"{job}/{r.topic}/{r.partition}/{r.until_offset}", headers
    offsets = ",".join(
        f"{r.topic}/{r.partition}/{r.until_offset}" for r in sorted(ranges, key=lambda r: r.key)
    )
    headers["txstore-offsets"] = offsets
    digest = hashlib.sha256(offsets.encode()).hexdigest()[:32]
    return f"{job}/batch/{digest}", headers


class TransactionalSink:
    """Commits ranges for one job over one (reused) connection.

    ``publish_to``: also write each commit's results to ``txn_outbox`` for
    that Kafka topic, in the same transaction.
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        job: str,
        failpoints: FailPoints | None = None,
        publish_to: str | None = None,
    ) -> None:
        self.conn = conn
        self.job = job
        self.failpoints = failpoints or FailPoints()
        self.publish_to = publish_to

    def commit(
        self,
        offset_range: OffsetRange,
        deltas: Mapping[ResultKey, Number],
        attempt: int = 0,
        last: Fingerprint | None = None,
    ) -> None:
        """Commit one range's ``deltas`` and move its offset to ``until``, or change nothing and raise.

        ``last``: the fingerprint of the range's last message, stored beside the offset.
        Raises :class:`AlreadyCommitted`, :class:`OffsetGap` or
        :class:`OffsetOverlap` after rolling back.
        """
        topic = offset_range.topic
        lasts = {offset_range.key: last} if last is not None else {}
        self._commit([offset_range], {(topic, k): v for k, v in deltas.items()}, attempt, lasts)

    def commit_batch(
        self,
        ranges: Sequence[OffsetRange],
        deltas: BatchDeltas,
        attempt: int = 0,
        last: Mapping[TopicPartition, Fingerprint] | None = None,
    ) -> None:
        """Commit a whole batch: all its results and every range's offset move, or nothing.

        Ranges must be distinct partitions; ``last`` holds the fingerprint of each
        range's last message, where known. A batch committed before (a retry
        after a lost acknowledgement) raises :class:`AlreadyCommitted`.
        """
        if len({r.key for r in ranges}) != len(ranges):
            raise ValueError("a batch commit needs one range per partition")
        self._commit(list(ranges), deltas, attempt, last or {})

    def _commit(
        self,
        ranges: list[OffsetRange],
        deltas: BatchDeltas,
        attempt: int,
        last: Mapping[TopicPartition, Fingerprint],
    ) -> None:
        if not ranges:
            return
        rows = sorted(deltas.items(), key=lambda item: row_order(item[0]))
        lasts = [last.get(r.key) for r in ranges]
        params: dict[str, Any] = {
            "job": self.job,
            "r_topics": [r.topic for r in ranges],
            "r_parts": [r.partition for r in ranges],
            "r_froms": [r.from_offset for r in ranges],
            "r_untils": [r.until_offset for r in ranges],
            "r_gens": [r.generation for r in ranges],
            "r_last_offs": [f.offset if f else None for f in lasts],
            "r_last_tss": [f.timestamp if f else None for f in lasts],
            "r_last_digests": [f.digest if f else None for f in lasts],
            "topics": [t for (t, _), _ in rows],
            "grains": [k.grain for (_, k), _ in rows],
            "keys": [k.key for (_, k), _ in rows],
            "windows": [k.window_start for (_, k), _ in rows],
            "metrics": [metric_text(v) for _, v in rows],
        }
        upsert = None
        if self.publish_to:
            dedup_key, headers = outbox_identity(self.job, ranges)
            params.update(
                destination=self.publish_to,
                dedup_key=dedup_key,
                headers=json.dumps(headers),
                ranges=_json_ranges(ranges),
            )
            upsert = _UPSERT_AND_OUTBOX
        elif rows:
            upsert = _UPSERT
        conn = self.conn
        hit = self.failpoints.hit
        try:
            with conn.cursor() as cur:
                hit("before-upsert", attempt)
                if upsert:
                    cur.execute(upsert, params)
                hit("between-upsert-and-offsets", attempt)
                cur.execute(_MOVE_OFFSETS, params)
                if cur.rowcount == len(ranges):
                    hit("before-commit", attempt)
                    conn.commit()
                    hit("after-commit", attempt)
                    return
            conn.rollback()
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        stored = stored_offsets(conn, self.job, ranges)
        if len(ranges) == 1:
            raise classify_conflict(self.job, ranges[0], stored.get(ranges[0].key))
        raise classify_batch_conflict(self.job, ranges, stored)
