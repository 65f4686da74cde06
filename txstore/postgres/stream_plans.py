"""``txn_stream_plans``: a streaming job's planned micro-batch, handed from its source to its sink.

The stream source (:mod:`txstore.spark.stream_source`) plans each micro-batch's ranges and
stores them here (:func:`save_plan`, one row per job, replaced by the next plan); the sink
(:mod:`txstore.spark.stream_sink`) commits exactly those ranges (:func:`load_plan`), never
offsets derived from the rows it received (``max(offset) + 1`` would skip a partition's
aborted transactions' offsets and never see an empty partition). Spark plans a micro-batch
only after the previous one committed, so the row the sink reads is its batch's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from txstore.core.errors import TxstoreError
from txstore.core.ranges import OffsetRange

_SAVE_PLAN = """
INSERT INTO txn_stream_plans (job, start_offsets, end_offsets, ranges, planned_at)
VALUES (%(job)s, %(start)s, %(end)s, %(ranges)s, now())
ON CONFLICT (job) DO UPDATE SET start_offsets = EXCLUDED.start_offsets,
    end_offsets = EXCLUDED.end_offsets, ranges = EXCLUDED.ranges, planned_at = EXCLUDED.planned_at
"""


def ranges_json(ranges: Sequence[OffsetRange]) -> str:
    return json.dumps(
        [
            {
                "topic": r.topic,
                "partition": r.partition,
                "from": r.from_offset,
                "until": r.until_offset,
                "generation": r.generation,
                "log_end": r.log_end,
            }
            for r in ranges
        ]
    )


def ranges_from_json(items: Sequence[Mapping[str, Any]]) -> list[OffsetRange]:
    return [
        OffsetRange(
            i["topic"],
            int(i["partition"]),
            int(i["from"]),
            int(i["until"]),
            None,
            int(i["generation"]),
            None if i["log_end"] is None else int(i["log_end"]),
        )
        for i in items
    ]


def save_plan(
    conn: psycopg.Connection,
    job: str,
    start: Mapping[str, Any],
    end: Mapping[str, Any],
    ranges: Sequence[OffsetRange],
) -> None:
    """Store the micro-batch ``start`` -> ``end`` (Spark's offsets) and its planned ``ranges``."""
    with conn.transaction():
        conn.execute(
            _SAVE_PLAN,
            {
                "job": job,
                "start": json.dumps(start, sort_keys=True),
                "end": json.dumps(end, sort_keys=True),
                "ranges": ranges_json(ranges),
            },
        )


def load_plan(conn: psycopg.Connection, job: str) -> list[OffsetRange]:
    """The ranges of the job's last planned micro-batch; none planned is one line."""
    row = conn.execute("SELECT ranges FROM txn_stream_plans WHERE job = %s", (job,)).fetchone()
    conn.rollback()
    if row is None:
        raise TxstoreError(
            f"job {job!r}: no planned micro-batch in txn_stream_plans; the sink commits only batches "
            "read with readStream.format('txstore') and the same txstore.job"
        )
    return ranges_from_json(row[0])
