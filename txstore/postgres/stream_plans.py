"""``txn_stream_plans`` and ``txn_stream_reads``: a streaming job's planned micro-batch, handed
from its source to its sink, and what its reading tasks read.

The stream source (:mod:`txstore.spark.stream.stream_source`) plans each micro-batch's ranges and
stores them here (:func:`save_plan`, one row per job, replaced by the next plan, with an
identity and the reading task of each range); each reading task, once it has read its ranges
to their end, records a receipt (:func:`record_read`: the streaming query and micro-batch it
ran in, its Spark stage and partition, and per range the messages delivered and the last one's
fingerprint). The sink (:mod:`txstore.spark.stream.stream_sink`) commits exactly the planned ranges
(:func:`load_plan`), never offsets derived from the rows it received (``max(offset) + 1``
would skip a partition's aborted transactions' offsets and never see an empty partition), and
only once the receipts (:func:`load_reads`) prove that its own query's micro-batch read them
(:func:`~txstore.core.micro_batch.verify_micro_batch`): a plan left by a query that stopped,
or read by another query, is never committed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from txstore.core.errors import STREAM_PRIVILEGE_HINT, PermissionDenied, TxstoreError, first_line
from txstore.core.fingerprint import Fingerprint
from txstore.core.micro_batch import Piece, RangeRead, Receipt, StreamPlan
from txstore.core.ranges import OffsetRange

_SAVE_PLAN = """
INSERT INTO txn_stream_plans (job, start_offsets, end_offsets, ranges, planned_at, plan_id, tasks, committed_by)
VALUES (%(job)s, %(start)s, %(end)s, %(ranges)s, now(), %(plan_id)s, %(tasks)s, NULL)
ON CONFLICT (job) DO UPDATE SET start_offsets = EXCLUDED.start_offsets,
    end_offsets = EXCLUDED.end_offsets, ranges = EXCLUDED.ranges, planned_at = EXCLUDED.planned_at,
    plan_id = EXCLUDED.plan_id, tasks = EXCLUDED.tasks
"""

_RECORD_READ = """
INSERT INTO txn_stream_reads (job, plan_id, task, stage, spark_partition, query_id, run_id, batch_id, ranges)
VALUES (%(job)s, %(plan_id)s, %(task)s, %(stage)s, %(spark_partition)s, %(query_id)s, %(run_id)s,
    %(batch_id)s, %(ranges)s)
ON CONFLICT (job, plan_id, task, stage, spark_partition) DO UPDATE SET query_id = EXCLUDED.query_id,
    run_id = EXCLUDED.run_id, batch_id = EXCLUDED.batch_id, ranges = EXCLUDED.ranges, read_at = now()
"""


@contextmanager
def stream_privileges(job: str, doing: str) -> Iterator[None]:
    """A privilege the stream's role lacks, as one line naming the grants a stream needs
    (:class:`PermissionDenied`: restarting cannot grant it) instead of psycopg's error."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as e:
        raise PermissionDenied(
            f"job {job!r}: {doing}: PostgreSQL said {first_line(e)}; {STREAM_PRIVILEGE_HINT}"
        ) from None


def plan_identity(job: str, start: Mapping[str, Any], end: Mapping[str, Any]) -> str:
    """A plan's identity: the same micro-batch (a replay, a second planning) has the same one."""
    text = json.dumps([job, start, end], sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def tasks_of(
    ranges: Sequence[OffsetRange], tasks: Sequence[Sequence[OffsetRange]]
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], tuple[Piece, ...]]]:
    """Each range's reading task, and for a range cut into pieces (``minPartitions``) its pieces,
    ``(from, until, task)`` in offset order."""
    found: dict[tuple[str, int], list[Piece]] = {}
    for i, run in enumerate(tasks):
        for piece in run:
            found.setdefault(piece.key, []).append((piece.from_offset, piece.until_offset, i))
    whole = {r.key: (r.from_offset, r.until_offset) for r in ranges}
    task_of: dict[tuple[str, int], int] = {}
    pieces: dict[tuple[str, int], tuple[Piece, ...]] = {}
    for key, items in found.items():
        items.sort()
        if len(items) == 1 and items[0][:2] == whole.get(key):
            task_of[key] = items[0][2]
        else:
            pieces[key] = tuple(items)
            task_of[key] = items[0][2]
    return task_of, pieces


def ranges_json(
    ranges: Sequence[OffsetRange],
    task_of: Mapping[tuple[str, int], int] | None = None,
    pieces: Mapping[tuple[str, int], Sequence[Piece]] | None = None,
) -> str:
    return json.dumps(
        [
            {
                "topic": r.topic,
                "partition": r.partition,
                "from": r.from_offset,
                "until": r.until_offset,
                "generation": r.generation,
                "log_end": r.log_end,
                **({"task": task_of[r.key]} if task_of and r.key in task_of else {}),
                **({"pieces": [list(p) for p in pieces[r.key]]} if pieces and r.key in pieces else {}),
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
    tasks: Sequence[Sequence[OffsetRange]] = (),
) -> str:
    """Store the micro-batch ``start`` -> ``end`` (Spark's offsets), its planned ``ranges`` and the
    reading ``tasks`` they are cut into; forget the receipts of the job's earlier plans. Returns
    the plan's identity (:func:`plan_identity`), which the reading tasks name in their receipts."""
    plan_id = plan_identity(job, start, end)
    task_of, pieces = tasks_of(ranges, tasks)
    with conn.transaction():
        conn.execute(
            _SAVE_PLAN,
            {
                "job": job,
                "start": json.dumps(start, sort_keys=True),
                "end": json.dumps(end, sort_keys=True),
                "ranges": ranges_json(ranges, task_of, pieces),
                "plan_id": plan_id,
                "tasks": len(tasks),
            },
        )
        conn.execute("DELETE FROM txn_stream_reads WHERE job = %s AND plan_id <> %s", (job, plan_id))
    return plan_id


def load_plan(conn: psycopg.Connection, job: str) -> StreamPlan:
    """The job's last planned micro-batch; none planned is one line."""
    plan = last_plan(conn, job)
    if plan is None:
        raise TxstoreError(
            f"job {job!r}: no planned micro-batch in txn_stream_plans; the sink commits only batches "
            "read with readStream.format('txstore') and the same txstore.job"
        )
    return plan


def last_plan(conn: psycopg.Connection, job: str) -> StreamPlan | None:
    """The job's last planned micro-batch, or None if it has none (the source's commit and its
    checks: nothing planned, nothing to move)."""
    row = conn.execute(
        "SELECT plan_id, ranges, tasks, committed_by FROM txn_stream_plans WHERE job = %s", (job,)
    ).fetchone()
    conn.rollback()
    if row is None:
        return None
    plan_id, items, tasks, committed_by = row
    ranges = ranges_from_json(items)
    task_of = {(str(i["topic"]), int(i["partition"])): int(i["task"]) for i in items if "task" in i}
    pieces = {
        (str(i["topic"]), int(i["partition"])): tuple((int(a), int(b), int(t)) for a, b, t in i["pieces"])
        for i in items
        if i.get("pieces")
    }
    return StreamPlan(plan_id, tuple(ranges), int(tasks), task_of, committed_by, pieces)


SINK_COMMITTED = "txstore"
"""``committed_by``: the txstore sink moved the job's last micro-batch's offsets, with its results."""
CHECKPOINT_LED = "checkpoint"
"""``committed_by``: the source's commit moved them after Spark's sink (not txstore's) committed."""


def mark_committed(conn: psycopg.Connection, job: str, plan_id: str, by: str) -> None:
    """Note who moved the job's micro-batch offsets last (kept across plans)."""
    with conn.transaction():
        conn.execute(
            "UPDATE txn_stream_plans SET committed_by = %s WHERE job = %s AND plan_id = %s "
            "AND committed_by IS DISTINCT FROM %s",
            (by, job, plan_id, by),
        )


def _read_json(reads: Sequence[RangeRead]) -> str:
    return json.dumps(
        [
            {
                "topic": r.range.topic,
                "partition": r.range.partition,
                "from": r.range.from_offset,
                "until": r.range.until_offset,
                "messages": r.messages,
                "last": None if r.last is None else [r.last.offset, r.last.timestamp, r.last.digest],
            }
            for r in reads
        ]
    )


def record_read(conn: psycopg.Connection, job: str, plan_id: str, receipt: Receipt) -> None:
    """Store a reading task's receipt (a retried or speculated task stores the same one again)."""
    with conn.transaction():
        conn.execute(
            _RECORD_READ,
            {
                "job": job,
                "plan_id": plan_id,
                "task": receipt.task,
                "stage": receipt.stage,
                "spark_partition": receipt.spark_partition,
                "query_id": receipt.query_id,
                "run_id": receipt.run_id,
                "batch_id": receipt.batch_id,
                "ranges": _read_json(receipt.reads),
            },
        )


def load_reads(conn: psycopg.Connection, job: str, plan_id: str) -> list[Receipt]:
    """The receipts of the plan's reading tasks."""
    rows = conn.execute(
        "SELECT task, stage, spark_partition, query_id, batch_id, ranges, run_id FROM txn_stream_reads "
        "WHERE job = %s AND plan_id = %s ORDER BY task, stage, spark_partition",
        (job, plan_id),
    ).fetchall()
    conn.rollback()
    return [
        Receipt(
            int(task),
            int(stage),
            int(part),
            query_id,
            None if batch_id is None else int(batch_id),
            tuple(
                RangeRead(
                    OffsetRange(str(i["topic"]), int(i["partition"]), int(i["from"]), int(i["until"])),
                    int(i["messages"]),
                    None
                    if i["last"] is None
                    else Fingerprint(int(i["last"][0]), i["last"][1], str(i["last"][2])),
                )
                for i in items
            ),
            run_id,
        )
        for task, stage, part, query_id, batch_id, items, run_id in rows
    ]
