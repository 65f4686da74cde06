"""TransactionalSink: results and offset moves in one transaction.

For one range (per-range commits, one Spark task each) or for every range of
a batch (per-batch commits, on the driver), in one PostgreSQL transaction:

1. upsert the result deltas (``metric = metric + delta``), rows in a fixed
   order (:func:`~txstore.core.results.row_order`) so that concurrent
   transactions touching the same rows (every partition's task adds to the
   topic total) lock them in the same order and cannot deadlock; when the
   job publishes its results, the same statement writes the new totals to
   ``txn_outbox``, split into as many parts as keep each message under
   ``publish_max_bytes``, under an identity unique to the commit
   (:mod:`txstore.postgres.outbox` sends them to Kafka later);
2. ``UPDATE txn_offsets SET off = until WHERE job/topic/part AND off = from``
   (and the generation the range was planned in) for every range, in one
   statement, storing the fingerprint of each range's last message and the backlog
   the range started from (the last :data:`~txstore.postgres.store.LAG_SAMPLES` are kept);
3. every range's row updated: record the messages skipped as bad
   (``--on-bad-message skip``) in ``txn_bad_messages``, one statement, then COMMIT. Anything else: ROLLBACK, then read the
   stored offsets and raise the :class:`~txstore.core.errors.CommitConflict`
   that says why (:func:`classify_conflict`, :func:`classify_batch_conflict`).

Because the results only exist if each offset moved from exactly ``from`` to
exactly ``until``, no message is ever counted twice or skipped, whatever
Spark retries, speculates or loses.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from txstore.core.errors import AlreadyCommitted, CommitConflict, OffsetGap, OffsetOverlap
from txstore.core.failpoints import FailPoints
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange, TopicPartition
from txstore.core.results import TOPIC_TOTAL, Number, ResultKey, metric_text, row_order
from txstore.postgres.store import append_lag_sample, stored_offsets

if TYPE_CHECKING:
    from txstore.kafka.bad_messages import BadOffset

__all__ = [
    "PUBLISH_MAX_BYTES",
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

PUBLISH_MAX_BYTES = 512 * 1024
"""Default upper bound of one published message (payload, key and headers), half of Kafka's
default maximum message size (``message.max.bytes``, 1 MB)."""
_ENVELOPE_SLACK = 256  # per-message headers the publisher adds, Kafka's record framing

# The same upsert, plus the outbox rows holding each result's delta and new total: as
# many parts as needed to keep each message's results under %(budget)s bytes. Parts are
# cut by cumulative size in result order; a part holds the results whose running size
# ends in its slice of ``step`` bytes, so it stays under step + its first result's size,
# hence under the budget (a single result bigger than half the budget may overflow it,
# and publishing sets that message aside as too large).
# The coalesce() equalities make the join hashable; IS NOT DISTINCT FROM makes it exact.
_UPSERT_AND_OUTBOX = f"""
WITH d AS ({_DELTAS}),
up AS ({_UPSERT_BODY} RETURNING topic, grain, key, window_start, metric),
item AS (
  SELECT d.ord, jsonb_build_object(
             'topic', up.topic, 'grain', up.grain, 'key', up.key, 'window_start', up.window_start,
             'delta', d.metric, 'total', up.metric) AS body
  FROM up JOIN d
    ON d.topic = up.topic AND d.grain = up.grain
   AND coalesce(d.key, '') = coalesce(up.key, '')
   AND coalesce(d.window_start, '-infinity') = coalesce(up.window_start, '-infinity')
   AND d.key IS NOT DISTINCT FROM up.key AND d.window_start IS NOT DISTINCT FROM up.window_start),
sized AS (
  SELECT ord, body, octet_length(body::text) + 2 AS size FROM item),
running AS (
  SELECT ord, body, sum(size) OVER (ORDER BY ord) AS upto, max(size) OVER () AS biggest FROM sized),
cut AS (
  SELECT ord, body,
         dense_rank() OVER (ORDER BY (upto - 1) / greatest(%(budget)s::bigint - biggest,
                                                           %(budget)s::bigint / 2, 1)) AS part
  FROM running),
grouped AS (
  SELECT part, count(*) OVER () AS parts, jsonb_agg(body ORDER BY ord) AS results FROM cut GROUP BY part)
INSERT INTO txn_outbox (job, destination, dedup_key, headers, payload, part, parts)
SELECT %(job)s, %(destination)s, %(dedup_key)s || '/' || part, %(headers)s::jsonb,
       jsonb_build_object('job', %(job)s::text, 'commit', %(commit)s::text, 'part', part, 'parts', parts,
                          'ranges', %(ranges)s::jsonb, 'results', results),
       part, parts
FROM grouped ORDER BY part
"""

# A commit with no results at all still tells consumers the ranges were counted.
_EMPTY_OUTBOX = """
INSERT INTO txn_outbox (job, destination, dedup_key, headers, payload, part, parts)
VALUES (%(job)s, %(destination)s, %(dedup_key)s || '/1', %(headers)s::jsonb,
        jsonb_build_object('job', %(job)s::text, 'commit', %(commit)s::text, 'part', 1, 'parts', 1,
                           'ranges', %(ranges)s::jsonb, 'results', '[]'::jsonb), 1, 1)
"""

# Moves each offset from exactly `from` in the planned generation, stores the
# fingerprint of the range's last message (kept as it was if the range had none), and
# appends the backlog the range started from to the partition's last lag samples.
MOVE_OFFSETS = f"""
UPDATE txn_offsets o SET off = r.until_off, updated_at = now(),
    last_off = coalesce(r.last_off, o.last_off),
    last_timestamp = CASE WHEN r.last_off IS NULL THEN o.last_timestamp ELSE r.last_ts END,
    last_digest = coalesce(r.last_digest, o.last_digest),
    lag_samples = {append_lag_sample("o.lag_samples", "r.log_end", "r.from_off")}
FROM unnest(%(r_topics)s::text[], %(r_parts)s::int[], %(r_froms)s::bigint[], %(r_untils)s::bigint[],
            %(r_gens)s::int[], %(r_last_offs)s::bigint[], %(r_last_tss)s::bigint[], %(r_last_digests)s::text[],
            %(r_log_ends)s::bigint[])
     AS r(topic, part, from_off, until_off, generation, last_off, last_ts, last_digest, log_end)
WHERE o.job = %(job)s AND o.topic = r.topic AND o.part = r.part AND o.off = r.from_off
  AND o.generation = r.generation
"""


# Messages skipped with --on-bad-message skip, after the offsets moved (so the offset rows are
# locked by this transaction and their generation is the one the range was read in).
RECORD_BAD_MESSAGES = """
INSERT INTO txn_bad_messages (job, topic, part, generation, off, reason)
SELECT %(job)s, b.topic, b.part, coalesce(o.generation, 0), b.off, b.reason
FROM unnest(%(b_topics)s::text[], %(b_parts)s::int[], %(b_offs)s::bigint[], %(b_reasons)s::text[])
     AS b(topic, part, off, reason)
LEFT JOIN txn_offsets o ON o.job = %(job)s AND o.topic = b.topic AND o.part = b.part
ORDER BY b.topic, b.part, b.off
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
    rest would count its messages twice (:class:`OffsetOverlap`). Every range
    at its ``from``: an offset was reset to a new generation since the batch
    was planned (:class:`OffsetOverlap` too, for the first range).
    """
    off = [r for r in ranges if stored.get(r.key) != r.from_offset]
    conflicts = [classify_conflict(job, r, stored.get(r.key)) for r in off]
    if len(off) == len(ranges) and all(isinstance(c, AlreadyCommitted) for c in conflicts):
        return conflicts[0]
    for c in conflicts:
        if not isinstance(c, AlreadyCommitted):
            return c
    first = (off or ranges)[0]
    return OffsetOverlap(job, first, stored.get(first.key))


def _json_ranges(ranges: Sequence[OffsetRange]) -> str:
    return json.dumps(
        [
            {"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until_offset}
            for r in ranges
        ]
    )


def outbox_identity(job: str, ranges: Sequence[OffsetRange], commit: str) -> tuple[str, dict[str, str]]:
    """The dedup key prefix and Kafka headers of a commit's outbox rows.

    ``commit`` is unique per commit (a fresh UUID for each transaction that
    writes results: a retry that finds its range committed writes nothing),
    so a range counted again after ``txstore reset`` is a new identity that a
    key-compacted topic keeps. One range: ``job/topic/partition/until/commit``;
    a batch: ``job/batch/<hash of its ranges>/commit``, with the ranges in a
    header. Each row's key adds its part number (``/1``, ``/2``, ...), and is
    repeated exactly by a redelivery.
    """
    headers = {"txstore-job": job, "txstore-commit": commit}
    if len(ranges) == 1:
        r = ranges[0]
        headers.update(
            {
                "txstore-topic": r.topic,
                "txstore-partition": str(r.partition),
                "txstore-until": str(r.until_offset),
            }
        )
        return f"{job}/{r.topic}/{r.partition}/{r.until_offset}/{commit}", headers
    offsets = ",".join(
        f"{r.topic}/{r.partition}/{r.until_offset}" for r in sorted(ranges, key=lambda r: r.key)
    )
    headers["txstore-offsets"] = offsets
    digest = hashlib.sha256(offsets.encode()).hexdigest()[:32]
    return f"{job}/batch/{digest}/{commit}", headers


def outbox_params(
    job: str, destination: str, ranges: Sequence[OffsetRange], max_bytes: int
) -> dict[str, Any]:
    """Parameters of the outbox statements for one commit: identity, headers, ranges, and
    the bytes each part's results may take (``max_bytes`` less everything else in the message)."""
    commit = uuid.uuid4().hex
    dedup_key, headers = outbox_identity(job, ranges, commit)
    headers_json = json.dumps(headers)
    ranges_json = _json_ranges(ranges)
    envelope = json.dumps(
        {"job": job, "commit": commit, "part": 10**9, "parts": 10**9, "ranges": None, "results": []}
    )
    overhead = len(envelope) + len(ranges_json) + len(headers_json) + len(dedup_key) + 12 + _ENVELOPE_SLACK
    return {
        "destination": destination,
        "dedup_key": dedup_key,
        "commit": commit,
        "headers": headers_json,
        "ranges": ranges_json,
        "budget": max(max_bytes - overhead, 1),
    }


def require_transactions(conn: psycopg.Connection, who: str) -> None:
    """Refuse an autocommit connection: each statement would commit on its own, so
    results could land without their offset move, and a rollback would undo nothing."""
    if conn.autocommit:
        raise ValueError(
            f"{who} needs a connection with autocommit off: results and offsets must commit in "
            "one transaction (open it with txstore.postgres.db.connect(url), not autocommit=True)"
        )


class TransactionalSink:
    """Commits ranges for one job over one (reused) connection.

    ``publish_to``: also write each commit's results to ``txn_outbox`` for
    that Kafka topic, in the same transaction and statement as the upsert,
    split into parts of at most ``publish_max_bytes`` per message.
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        job: str,
        failpoints: FailPoints | None = None,
        publish_to: str | None = None,
        publish_max_bytes: int = PUBLISH_MAX_BYTES,
    ) -> None:
        require_transactions(conn, "TransactionalSink")
        self.conn = conn
        self.job = job
        self.failpoints = failpoints or FailPoints()
        self.publish_to = publish_to
        self.publish_max_bytes = publish_max_bytes

    def commit(
        self,
        offset_range: OffsetRange,
        deltas: Mapping[ResultKey, Number],
        attempt: int = 0,
        bad: Sequence[BadOffset] = (),
        last: Fingerprint | None = None,
    ) -> None:
        """Commit one range's ``deltas`` and move its offset to ``until``, or change nothing and raise.

        ``bad``: messages skipped as bad, recorded in ``txn_bad_messages`` in the same transaction.
        ``last``: the fingerprint of the range's last message, stored beside the offset.
        Raises :class:`AlreadyCommitted`, :class:`OffsetGap` or
        :class:`OffsetOverlap` after rolling back.
        """
        topic = offset_range.topic
        lasts = {offset_range.key: last} if last is not None else {}
        self._commit([offset_range], {(topic, k): v for k, v in deltas.items()}, attempt, bad, lasts)

    def commit_batch(
        self,
        ranges: Sequence[OffsetRange],
        deltas: BatchDeltas,
        attempt: int = 0,
        bad: Sequence[BadOffset] = (),
        last: Mapping[TopicPartition, Fingerprint] | None = None,
    ) -> None:
        """Commit a whole batch: all its results and every range's offset move, or nothing.

        Ranges must be distinct partitions; ``last`` holds the fingerprint of each
        range's last message, where known. A batch committed before (a retry
        after a lost acknowledgement) raises :class:`AlreadyCommitted`.
        """
        if len({r.key for r in ranges}) != len(ranges):
            raise ValueError("a batch commit needs one range per partition")
        self._commit(list(ranges), deltas, attempt, bad, last or {})

    def _commit(
        self,
        ranges: list[OffsetRange],
        deltas: BatchDeltas,
        attempt: int,
        bad: Sequence[BadOffset],
        last: Mapping[TopicPartition, Fingerprint],
    ) -> None:
        if not ranges:
            return
        rows = sorted(deltas.items(), key=lambda item: row_order(item[0]))
        params: dict[str, Any] = {
            **move_offsets_params(self.job, ranges, last),
            "topics": [t for (t, _), _ in rows],
            "grains": [k.grain for (_, k), _ in rows],
            "keys": [k.key for (_, k), _ in rows],
            "windows": [k.window_start for (_, k), _ in rows],
            "metrics": [metric_text(v) for _, v in rows],
        }
        upsert = None
        if self.publish_to:
            params.update(outbox_params(self.job, self.publish_to, ranges, self.publish_max_bytes))
            upsert = _UPSERT_AND_OUTBOX if rows else _EMPTY_OUTBOX
        elif rows:
            upsert = _UPSERT

        def upsert_rows(cur: psycopg.Cursor[Any]) -> None:
            if upsert:
                cur.execute(upsert, params)

        commit_if_offsets_move(
            self.conn, self.job, ranges, params, self.failpoints, attempt, bad, write=upsert_rows
        )


def commit_if_offsets_move(
    conn: psycopg.Connection,
    job: str,
    ranges: Sequence[OffsetRange],
    params: Mapping[str, Any],
    failpoints: FailPoints,
    attempt: int,
    bad: Sequence[BadOffset],
    write: Callable[[psycopg.Cursor[Any]], None],
    then: Callable[[psycopg.Cursor[Any]], None] | None = None,
) -> None:
    """The conditional commit every sink of results and offsets shares, in one transaction:

    1. ``write`` the results (the upsert, or a results table's rows copied to a temporary table);
    2. move every range's offset from exactly ``from`` (:data:`MOVE_OFFSETS` with ``params``,
       :func:`move_offsets_params` and anything else ``write`` needs);
    3. only if every range's row moved: record the messages skipped as ``bad``, ``then`` (a
       results table's merge, which must not run for a batch whose offsets did not move), COMMIT;
    4. otherwise ROLLBACK, read the stored offsets and raise the
       :class:`~txstore.core.errors.CommitConflict` saying why (:func:`classify_conflict` for one
       range, :func:`classify_batch_conflict` for several).

    An error anywhere rolls back (unless the connection is gone) and propagates. The fail
    points (``before-upsert``, ``between-upsert-and-offsets``, ``before-commit``,
    ``after-commit``) are hit between the steps, for the chaos tests.
    """
    hit = failpoints.hit
    try:
        with conn.cursor() as cur:
            hit("before-upsert", attempt)
            write(cur)
            hit("between-upsert-and-offsets", attempt)
            cur.execute(MOVE_OFFSETS, params)
            if cur.rowcount == len(ranges):
                if bad:
                    cur.execute(RECORD_BAD_MESSAGES, bad_message_params(job, bad))
                if then is not None:
                    then(cur)
                hit("before-commit", attempt)
                conn.commit()
                hit("after-commit", attempt)
                return
        conn.rollback()
    except BaseException:
        if not conn.closed:
            conn.rollback()
        raise
    stored = stored_offsets(conn, job, ranges)
    if len(ranges) == 1:
        raise classify_conflict(job, ranges[0], stored.get(ranges[0].key))
    raise classify_batch_conflict(job, ranges, stored)


def move_offsets_params(
    job: str, ranges: Sequence[OffsetRange], last: Mapping[TopicPartition, Fingerprint] | None = None
) -> dict[str, Any]:
    """Parameters of :data:`MOVE_OFFSETS`: every range's move, and its last message's fingerprint."""
    lasts = [(last or {}).get(r.key) for r in ranges]
    return {
        "job": job,
        "r_topics": [r.topic for r in ranges],
        "r_parts": [r.partition for r in ranges],
        "r_froms": [r.from_offset for r in ranges],
        "r_untils": [r.until_offset for r in ranges],
        "r_gens": [r.generation for r in ranges],
        "r_log_ends": [r.log_end for r in ranges],
        "r_last_offs": [f.offset if f else None for f in lasts],
        "r_last_tss": [f.timestamp if f else None for f in lasts],
        "r_last_digests": [f.digest if f else None for f in lasts],
    }


def bad_message_params(job: str, bad: Sequence[BadOffset]) -> dict[str, Any]:
    return {
        "job": job,
        "b_topics": [b.topic for b in bad],
        "b_parts": [b.partition for b in bad],
        "b_offs": [b.offset for b in bad],
        "b_reasons": [b.reason for b in bad],
    }
