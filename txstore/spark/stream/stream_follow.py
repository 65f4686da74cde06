"""The stream source's commit: ``txn_offsets`` follows Spark's checkpoint when the query's sink
is not txstore's.

With ``writeStream.format("txstore")`` a micro-batch's offsets are in PostgreSQL with its
results before Spark commits it. Any other sink (Spark's file sink, ``foreachBatch``, a
console) moves nothing, so the source moves them at Spark's commit
(:meth:`FollowsCheckpoint.commit`): from the planned starts to the planned ends, with the last
messages' fingerprints the reading tasks recorded, as one conditional update
(:class:`~txstore.postgres.sink.TransactionalSink`), and notes the job as checkpoint-led in
``txn_stream_plans``. ``txstore status``, lag and the next micro-batch's checks then follow the
query; the guarantee is the sink's own (Spark's file sink: exactly once through its log;
``foreachBatch``: at least once).

Spark commits a micro-batch after it planned the next one, and a query may stop in between: a
restart then finds the checkpoint one micro-batch ahead of ``txn_offsets``.
:meth:`FollowsCheckpoint._caught_up` recognises that case (a checkpoint-led plan whose ends are
the new start) and moves the offsets then, so the alignment check passes.

:class:`FollowsCheckpoint` is a mixin of :class:`~txstore.spark.stream.stream_source.TxstoreStreamReader`
(over :class:`~txstore.spark.stream.stream_session.PlanningSession`, whose connection it uses).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from txstore.core.errors import AlreadyCommitted
from txstore.core.failpoints import FailPoints
from txstore.core.fingerprint import Fingerprint
from txstore.core.micro_batch import StreamPlan
from txstore.core.ranges import OffsetRange, TopicPartition
from txstore.postgres import store
from txstore.postgres.sink import TransactionalSink
from txstore.postgres.stream_plans import (
    CHECKPOINT_LED,
    SINK_COMMITTED,
    last_plan,
    load_reads,
    mark_committed,
)
from txstore.spark.runtime.worker_log import worker_info_to_stderr
from txstore.spark.stream.stream_offsets import offsets_map
from txstore.spark.stream.stream_session import PlanningSession, again_on_a_new_session

log = logging.getLogger("txstore")


class FollowsCheckpoint(PlanningSession):
    """The source's ``commit`` and what it moves (see the module docstring)."""

    @again_on_a_new_session
    def commit(self, end: Mapping[str, Any]) -> None:
        """Spark's commit of a micro-batch its sink committed (Spark calls it while it starts the
        next one).

        With the txstore sink the offsets are in PostgreSQL already, with the results. With any
        other sink (Spark's file sink, ``foreachBatch``, a console) nothing moved them: the source
        moves them now, from the planned starts to the planned ends with the last messages'
        fingerprints (:meth:`_follow_checkpoint`), so that ``txstore status``, lag and the next
        micro-batch's check follow the query. The guarantee is then the sink's own (Spark's file
        sink: exactly once through its log; ``foreachBatch``: at least once).
        """
        job = self.options.job
        conn = self._db()
        plan = last_plan(conn, job)
        if plan is None:
            return  # nothing planned: nothing to move
        if {r.key: r.until_offset for r in plan.ranges} != offsets_map(end) or not plan.reading:
            return  # another micro-batch's end (a restart's first commit), or nothing read
        stored = store.committed_offsets(conn, job, sorted({r.topic for r in plan.reading}))
        if all(stored.get(r.key) == r.from_offset for r in plan.reading):
            self._follow_checkpoint(conn, plan)
        elif plan.committed_by != SINK_COMMITTED and all(
            stored.get(r.key) == r.until_offset for r in plan.reading
        ):
            mark_committed(conn, job, plan.plan_id, SINK_COMMITTED)

    def _awaiting_spark_commit(self, conn: psycopg.Connection) -> dict[TopicPartition, tuple[int, int]]:
        """The job's last planned micro-batch, start and end per partition (none: empty): with a
        sink other than txstore's, its offsets move only when Spark commits it, at the planning of
        the next micro-batch, so an idle query's start may be its end until then."""
        plan = last_plan(conn, self.options.job)
        if plan is None:
            return {}
        return {r.key: (r.from_offset, r.until_offset) for r in plan.ranges}

    def _follow_checkpoint(self, conn: psycopg.Connection, plan: StreamPlan) -> None:
        """Move a micro-batch's offsets that a sink other than txstore's wrote (Spark committed it),
        as one conditional update, and note the job as checkpoint-led."""
        job = self.options.job
        last: dict[TopicPartition, Fingerprint] = {}
        latest: dict[TopicPartition, int] = {}  # the piece the last message is from (minPartitions)
        for receipt in load_reads(conn, job, plan.plan_id):
            for read in receipt.reads:
                key = read.range.key
                if read.last is not None and read.range.from_offset >= latest.get(key, -1):
                    last[key], latest[key] = read.last, read.range.from_offset
        try:
            TransactionalSink(conn, job, FailPoints()).commit_batch(list(plan.reading), {}, last=last)
        except AlreadyCommitted:
            return
        mark_committed(conn, job, plan.plan_id, CHECKPOINT_LED)
        if plan.committed_by != CHECKPOINT_LED:
            worker_info_to_stderr()
            log.info(
                "job %s: the query's sink is not txstore's: txn_offsets now follows Spark's checkpoint "
                "(each micro-batch's offsets move when Spark commits it; the sink's own guarantee holds)",
                job,
            )

    def _caught_up(self, conn: psycopg.Connection, planned: Sequence[OffsetRange]) -> bool:
        """Whether the micro-batch starts where a checkpoint-led job's last micro-batch ended and
        that one was moved now (Spark committed it, but stopped before the source's commit)."""
        job = self.options.job
        plan = last_plan(conn, job)
        if plan is None or plan.committed_by != CHECKPOINT_LED or not plan.reading:
            return False
        ends = {r.key: r.until_offset for r in plan.ranges}
        if any(ends.get(r.key, r.from_offset) != r.from_offset for r in planned):
            return False
        stored = store.committed_offsets(conn, job, sorted({r.topic for r in plan.reading}))
        if not all(stored.get(r.key) == r.from_offset for r in plan.reading):
            return False
        self._follow_checkpoint(conn, plan)
        return True
