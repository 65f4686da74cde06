"""IdempotentSink: per-message outputs stored under their Kafka offset (``--sink idempotent``).

For outputs that are one row per message rather than aggregates. Each
message is inserted under ``(job, topic, partition, offset)`` with
``ON CONFLICT DO NOTHING``, so a replay (task retry, speculation, an offset
reset, a second instance) never stores a message twice, even without the
offsets check. The offset is still tracked in ``txn_offsets``, in the same
transaction, so the job knows where to go on; it may move forward over a
range stored before, but never across a gap. Messages are stored under the
partition's generation (the range's, which the offset update checks): after
a recreated topic's reset starts a new generation, its messages never
collide with the old topic's under the same offsets:

1. insert the range's messages in chunks (one statement per chunk of about
   ``CHUNK_BYTES``, so 1 MiB messages do not pile up in memory);
2. ``UPDATE txn_offsets SET off = until WHERE ... AND from <= off < until``
   in the range's generation, with the last message's fingerprint;
3. one row updated: record the messages whose transform raised, if they are
   to be skipped (``--on-bad-message skip``), in ``txn_bad_messages``, then
   COMMIT (with ``fail``, such a message raises
   :class:`~txstore.core.errors.BadMessage` naming it, and nothing is stored). Otherwise ROLLBACK: an offset at or past
   ``until`` means the range was stored before (:class:`AlreadyCommitted`);
   below ``from`` is a gap (:class:`OffsetGap`); no row is an overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg
from confluent_kafka import Message

from txstore.core.errors import AlreadyCommitted, BadMessage
from txstore.core.failpoints import FailPoints
from txstore.core.fingerprint import fingerprint
from txstore.core.ranges import OffsetRange
from txstore.kafka.bad_messages import BadOffset, is_message_failure, reason_of
from txstore.postgres.sink import (
    RECORD_BAD_MESSAGES,
    bad_message_params,
    classify_conflict,
    require_transactions,
)
from txstore.postgres.store import append_lag_sample, stored_offsets

MessageTransform = Callable[[Message], "tuple[bytes | None, bytes | None] | None"]
"""A message's output ``(key, value)`` to store, or None to store nothing for it.

Without a transform the message's own key and value are stored.
"""

CHUNK_BYTES = 8 * 1024 * 1024

_INSERT = """
INSERT INTO txn_messages (job, topic, part, generation, off, key, value, timestamp)
SELECT %(job)s, %(topic)s, %(part)s, %(generation)s, m.off, m.key, m.value,
       -- whole seconds, then the milliseconds: exact integers (ms / 1000.0 is a float, microseconds
       -- off past about year 2255)
       to_timestamp(m.ts / 1000) + (m.ts %% 1000) * interval '1 millisecond'  -- NULL stays NULL
FROM unnest(%(offs)s::bigint[], %(keys)s::bytea[], %(values)s::bytea[], %(tss)s::bigint[])
     AS m(off, key, value, ts)
ON CONFLICT DO NOTHING
"""

_ADVANCE = f"""
UPDATE txn_offsets SET off = %(until)s, updated_at = now(),
    last_off = coalesce(%(last_off)s, last_off),
    last_timestamp = CASE WHEN %(last_off)s::bigint IS NULL THEN last_timestamp ELSE %(last_ts)s END,
    last_digest = coalesce(%(last_digest)s, last_digest),
    lag_samples = {append_lag_sample("lag_samples", "%(log_end)s::bigint", "%(from)s::bigint")}
WHERE job = %(job)s AND topic = %(topic)s AND part = %(part)s AND off >= %(from)s AND off < %(until)s
  AND generation = %(generation)s
"""


def _rows(
    batch: list[Message], transform: MessageTransform | None, on_error: Callable[[Message, Exception], None]
) -> Iterator[tuple[int, bytes | None, bytes | None, int | None]]:
    """The rows to store; a message whose transform raises goes to ``on_error``, which raises
    or lets the rest of the batch go on (one ``try`` per batch, not per message)."""
    messages = iter(batch)
    while True:
        m = None
        try:
            for m in messages:
                out = (m.key(), m.value()) if transform is None else transform(m)
                if out is None:
                    continue
                ts_type, ts = m.timestamp()
                yield m.offset(), out[0], out[1], ts if ts_type else None  # type: ignore[misc]
            return
        except Exception as e:
            if m is None or not is_message_failure(e):
                raise
            on_error(m, e)


class IdempotentSink:
    """Stores ranges of messages for one job over one (reused) connection."""

    def __init__(self, conn: psycopg.Connection, job: str, failpoints: FailPoints | None = None) -> None:
        require_transactions(conn, "IdempotentSink")
        self.conn = conn
        self.job = job
        self.failpoints = failpoints or FailPoints()
        self.skipped: tuple[BadOffset, ...] = ()  # the last store()'s messages skipped as bad

    def store(
        self,
        offset_range: OffsetRange,
        batches: Iterable[list[Message]],
        transform: MessageTransform | None = None,
        attempt: int = 0,
        skip_bad: bool = False,
    ) -> int:
        """Insert-or-ignore the range's messages and move its offset; return the rows offered.

        A message whose ``transform`` raises an ordinary exception raises
        :class:`BadMessage`, or with ``skip_bad`` is left out and recorded in
        ``txn_bad_messages`` in the same transaction (see :attr:`skipped`).
        Raises :class:`AlreadyCommitted` (nothing to do), :class:`OffsetGap` or
        :class:`OffsetOverlap` after rolling back.
        """
        params: dict[str, Any] = {
            "job": self.job,
            "topic": offset_range.topic,
            "part": offset_range.partition,
            "from": offset_range.from_offset,
            "until": offset_range.until_offset,
            "generation": offset_range.generation,
            "log_end": offset_range.log_end,
        }
        conn = self.conn
        hit = self.failpoints.hit
        offered = 0
        bad: list[BadOffset] = []
        self.skipped = ()

        def on_error(m: Message, error: Exception) -> None:
            offset = m.offset()
            assert offset is not None
            if not skip_bad:
                raise BadMessage(
                    self.job,
                    offset_range.topic,
                    offset_range.partition,
                    offset,
                    reason_of(error),
                    "transform",
                ) from None
            bad.append(BadOffset(offset_range.topic, offset_range.partition, offset, reason_of(error)))

        try:
            with conn.cursor() as cur:
                hit("before-upsert", attempt)
                chunk: list[tuple[int, bytes | None, bytes | None, int | None]] = []
                size = 0
                last_message = None
                for batch in batches:
                    if batch:
                        last_message = batch[-1]
                    for row in _rows(batch, transform, on_error):
                        chunk.append(row)
                        size += len(row[1] or b"") + len(row[2] or b"") + 64
                        if size >= CHUNK_BYTES:
                            self._insert(cur, params, chunk)
                            offered += len(chunk)
                            chunk, size = [], 0
                if chunk:
                    self._insert(cur, params, chunk)
                    offered += len(chunk)
                hit("between-upsert-and-offsets", attempt)
                last = fingerprint(last_message) if last_message is not None else None
                params.update(
                    last_off=last.offset if last else None,
                    last_ts=last.timestamp if last else None,
                    last_digest=last.digest if last else None,
                )
                cur.execute(_ADVANCE, params)
                if cur.rowcount == 1:
                    if bad:
                        cur.execute(RECORD_BAD_MESSAGES, bad_message_params(self.job, bad))
                    hit("before-commit", attempt)
                    conn.commit()
                    hit("after-commit", attempt)
                    self.skipped = tuple(bad)
                    return offered
            conn.rollback()
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        stored = stored_offsets(conn, self.job, [offset_range])[offset_range.key]
        if stored is not None and stored >= offset_range.until_offset:
            raise AlreadyCommitted(self.job, offset_range, stored)
        raise classify_conflict(self.job, offset_range, stored)

    @staticmethod
    def _insert(
        cur: psycopg.Cursor[Any],
        params: dict[str, Any],
        chunk: list[tuple[int, bytes | None, bytes | None, int | None]],
    ) -> None:
        offs, keys, values, tss = zip(*chunk, strict=True)
        cur.execute(
            _INSERT,
            {**params, "offs": list(offs), "keys": list(keys), "values": list(values), "tss": list(tss)},
        )
