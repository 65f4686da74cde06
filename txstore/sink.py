"""TransactionalSink: a range's results and its offset move in one transaction.

For each range, in one PostgreSQL transaction:

1. upsert the range's result deltas (``metric = metric + delta``), rows in a
   fixed order so that concurrent transactions touching the same rows (every
   partition's task adds to the topic total) lock them in the same order and
   cannot deadlock;
2. ``UPDATE txn_offsets SET off = until WHERE job/topic/part AND off = from``;
3. exactly one row updated: COMMIT. Anything else: ROLLBACK, then read the
   stored offset and raise the :class:`~txstore.errors.CommitConflict` that
   says why (:func:`classify_conflict`).

Because the results only exist if the offset moved from exactly ``from`` to
exactly ``until``, no message is ever counted twice or skipped, whatever
Spark retries, speculates or loses.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import psycopg

from txstore.errors import AlreadyCommitted, CommitConflict, OffsetGap, OffsetOverlap
from txstore.failpoints import FailPoints
from txstore.ranges import OffsetRange

ResultKey = tuple[str | None, datetime | None]
"""``(key, window_start)`` of a ``txn_data`` row; ``(None, None)`` is the topic total."""

TOPIC_TOTAL: ResultKey = (None, None)

_UPSERT = """
INSERT INTO txn_data (job, topic, key, window_start, metric, updated_at)
SELECT %(job)s, %(topic)s, d.key, d.window_start, d.metric, now()
FROM unnest(%(keys)s::text[], %(windows)s::timestamptz[], %(metrics)s::bigint[])
     WITH ORDINALITY AS d(key, window_start, metric, ord)
ORDER BY d.ord
ON CONFLICT (job, topic, key, window_start)
DO UPDATE SET metric = txn_data.metric + EXCLUDED.metric, updated_at = EXCLUDED.updated_at
"""

_MOVE_OFFSET = """
UPDATE txn_offsets SET off = %(until)s, updated_at = now()
WHERE job = %(job)s AND topic = %(topic)s AND part = %(part)s AND off = %(from)s
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


def _sort_key(item: tuple[ResultKey, int]) -> tuple[bool, str, bool, datetime]:
    (key, window), _ = item
    return (key is not None, key or "", window is not None, window or datetime.min)


class TransactionalSink:
    """Commits ranges for one job over one (reused) connection."""

    def __init__(self, conn: psycopg.Connection, job: str, failpoints: FailPoints | None = None) -> None:
        self.conn = conn
        self.job = job
        self.failpoints = failpoints or FailPoints()

    def commit(self, offset_range: OffsetRange, deltas: Mapping[ResultKey, int], attempt: int = 0) -> None:
        """Commit ``deltas`` and move the offset to ``until``, or change nothing and raise.

        Raises :class:`AlreadyCommitted`, :class:`OffsetGap` or
        :class:`OffsetOverlap` after rolling back.
        """
        rows = sorted(((k, v) for k, v in deltas.items()), key=_sort_key)
        params = {
            "job": self.job,
            "topic": offset_range.topic,
            "part": offset_range.partition,
            "from": offset_range.from_offset,
            "until": offset_range.until_offset,
        }
        conn = self.conn
        hit = self.failpoints.hit
        try:
            with conn.cursor() as cur:
                hit("before-upsert", attempt)
                if rows:
                    cur.execute(
                        _UPSERT,
                        {
                            **params,
                            "keys": [k for (k, _), _ in rows],
                            "windows": [w for (_, w), _ in rows],
                            "metrics": [v for _, v in rows],
                        },
                    )
                hit("between-upsert-and-offsets", attempt)
                cur.execute(_MOVE_OFFSET, params)
                moved = cur.rowcount
                if moved == 1:
                    hit("before-commit", attempt)
                    conn.commit()
                    hit("after-commit", attempt)
                    return
            conn.rollback()
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        raise classify_conflict(self.job, offset_range, self._stored_offset(offset_range))

    def _stored_offset(self, offset_range: OffsetRange) -> int | None:
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT off FROM txn_offsets WHERE job = %s AND topic = %s AND part = %s",
                (self.job, offset_range.topic, offset_range.partition),
            )
            row = cur.fetchone()
        self.conn.rollback()
        return None if row is None else int(row[0])
