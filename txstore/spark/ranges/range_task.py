"""What a Spark task does with each of its ranges: read, aggregate or store, commit.

Runs in a Spark Python worker. The task object is frozen and pickled to the
executors with everything it needs; the database connection is opened once
per worker process and reused by every task that worker runs.

Deterministic refusals (gap, overlap, aged-out data, a recreated topic) come back to the driver
as a report instead of an exception: retrying them cannot help, and the
driver turns them into one clear line. So does a message the aggregate (or
transform) fails on every time (:mod:`txstore.kafka.bad_messages` finds it), unless
it is to be skipped: then it is recorded with the range's commit. Transient
failures (a dropped connection, a broker timeout) raise, so Spark retries the
task; the retry reads the same range and either commits it or finds it
already committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import psycopg
from confluent_kafka import Message

from txstore.core.errors import (
    PRIVILEGE_HINT,
    AlreadyCommitted,
    BadMessage,
    CommitConflict,
    DatabaseUnavailable,
    DataLoss,
    OffsetGap,
    OffsetOverlap,
    TopicRecreated,
    committed_past_start,
    first_line,
)
from txstore.core.failpoints import FailPoints
from txstore.core.ranges import OffsetRange
from txstore.core.results import Number, ResultKey, add_metrics
from txstore.kafka.bad_messages import FAIL, SKIP, Aggregated, BadOffset, aggregate_range
from txstore.kafka.reader import RangeReader
from txstore.kafka.together import BufferedRange, read_together, together_candidates
from txstore.postgres.db import forget_worker_connection, redact, worker_connection
from txstore.postgres.idempotent import IdempotentSink, MessageTransform
from txstore.postgres.sink import PUBLISH_MAX_BYTES, TransactionalSink

Aggregate = Callable[[OffsetRange, Iterable[list[Message]]], Mapping[ResultKey, Number]]
"""Turns a range's messages (in batches) into result deltas keyed by :class:`ResultKey`."""

COMMITTED = "committed"
ALREADY_COMMITTED = "already committed"
REFUSED = "refused"
REPORTED_BAD_MESSAGES = 100
"""At most this many skipped messages travel back to the driver in a report (for its warning)."""


@dataclass(frozen=True)
class RangeReport:
    """What happened to one range; sent back to the driver for logging."""

    range: OffsetRange
    outcome: str
    messages: int = 0
    read_ms: float = 0.0
    commit_ms: float = 0.0
    error: str | None = None
    error_kind: str | None = None  # the error class name, e.g. "DataLoss"
    stale_plan: bool = False  # refused only because another writer committed past its start
    # Refused: the message it failed on. Committed: the messages skipped (--on-bad-message skip),
    # the first REPORTED_BAD_MESSAGES of them; `skipped` counts them all.
    bad_messages: tuple[BadOffset, ...] = ()
    skipped: int = 0


class _Counted(Protocol):
    """What read a range's messages (a RangeReader, or an :class:`Aggregated`): how many."""

    @property
    def messages(self) -> int: ...


def task_attempt() -> int:
    """The Spark attempt number of the running task (0 outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return int(context.attemptNumber()) if context is not None else 0


@dataclass(frozen=True)
class TaskRun:
    """Where the running task runs: its Spark stage and partition, and (in a streaming query) the
    query's id, the micro-batch and the query's run (Spark's task properties
    ``sql.streaming.queryId``, ``streaming.sql.batchId`` and ``spark.jobGroup.id``, which a
    streaming query sets to its run's id; None outside a stream)."""

    stage: int
    partition: int
    query_id: str | None
    batch_id: int | None
    run_id: str | None = None


def task_run() -> TaskRun:
    """The running task's :class:`TaskRun` (all zero and None outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return TaskRun(0, 0, None, None)
    batch = context.getLocalProperty("streaming.sql.batchId")
    return TaskRun(
        int(context.stageId()),
        int(context.partitionId()),
        context.getLocalProperty("sql.streaming.queryId"),
        None if batch is None else int(batch),
        context.getLocalProperty("spark.jobGroup.id"),  # a streaming query's job group is its run's id
    )


def _refused(offset_range: OffsetRange, messages: int, error: Exception) -> RangeReport:
    bad = (
        (BadOffset(error.topic, error.partition, error.offset, error.reason),)
        if isinstance(error, BadMessage)
        else ()
    )
    return RangeReport(
        offset_range,
        REFUSED,
        messages,
        error=str(error),
        error_kind=type(error).__name__,
        stale_plan=isinstance(error, CommitConflict) and committed_past_start(error),
        bad_messages=bad,
    )


def _bad_message(job: str, offset_range: OffsetRange, found: Aggregated) -> RangeReport:
    """The range's refusal for the first message its aggregate fails on (``--on-bad-message fail``)."""
    b = found.bad[0]
    return _refused(
        offset_range, found.messages, BadMessage(job, b.topic, b.partition, b.offset, b.reason, "aggregate")
    )


def _commit_in_worker(
    job: str,
    database_url: str,
    parts: Sequence[tuple[OffsetRange, _Counted]],
    commit: Callable[[psycopg.Connection], None],
    started: float,
    read_done: float | None = None,
) -> list[RangeReport]:
    """Run ``commit`` (of one range, or several in one transaction) on the worker's
    connection and turn its outcome into a report per range."""
    try:
        commit(worker_connection(database_url))
        outcome = COMMITTED
    except AlreadyCommitted:
        outcome = ALREADY_COMMITTED
    except (OffsetGap, OffsetOverlap, DataLoss, BadMessage, TopicRecreated) as e:
        return [_refused(r, reader.messages, e) for r, reader in parts]
    except psycopg.errors.InsufficientPrivilege as e:
        # The transaction was rolled back; retrying cannot grant the privilege.
        return [
            RangeReport(
                r,
                REFUSED,
                reader.messages,
                error=f"committing {r} for job {job!r}: PostgreSQL said {first_line(e)}; "
                f"nothing was committed for this range; {PRIVILEGE_HINT}",
                error_kind="PermissionDenied",
            )
            for r, reader in parts
        ]
    except psycopg.Error as e:
        forget_worker_connection(database_url)
        where = parts[0][0] if len(parts) == 1 else f"{len(parts)} ranges from {parts[0][0]}"
        raise DatabaseUnavailable(
            f"committing {where} for job {job!r} failed at "
            f"{redact(database_url)}: {first_line(e)}; nothing was committed for this range"
        ) from None
    finished = time.perf_counter()
    read_done = finished if read_done is None else read_done
    share = 1000 / len(parts)  # a shared transaction's time, split so that sums stay right
    return [
        RangeReport(
            r,
            outcome,
            reader.messages,
            read_ms=(read_done - started) * share,
            commit_ms=(finished - read_done) * share,
        )
        for r, reader in parts
    ]


@dataclass(frozen=True)
class RangeTask:
    """Aggregate a range, then commit its deltas and offset move in one transaction."""

    job: str
    database_url: str = field(repr=False)  # holds the password
    kafka_conf: Mapping[str, Any] = field(repr=False)  # may hold SASL or key passwords
    aggregate: Aggregate
    failpoints: FailPoints = field(default_factory=FailPoints)
    publish_to: str | None = None
    publish_max_bytes: int = PUBLISH_MAX_BYTES
    on_bad_message: str = FAIL

    def __call__(self, ranges: Iterable[OffsetRange]) -> Iterator[RangeReport]:
        attempt = task_attempt()
        ranges = list(ranges)
        if len(ranges) == 1:
            yield self.run(ranges[0], attempt)
        else:
            yield from self.run_together(ranges, attempt)

    def _aggregate(
        self, offset_range: OffsetRange, read: BufferedRange | None = None
    ) -> Aggregated | RangeReport:
        """The range's deltas, or its refusal (aged-out data, a bad message with ``fail``); from
        ``read`` if it was read together with others (:func:`~txstore.kafka.together.read_together`)."""
        reader = read if read is not None else RangeReader(self.kafka_conf, offset_range, job=self.job)
        try:
            found = aggregate_range(self.aggregate, reader, self.on_bad_message == SKIP)
        except (DataLoss, TopicRecreated) as e:
            return _refused(offset_range, reader.messages, e)
        if found.bad and self.on_bad_message != SKIP:
            return _bad_message(self.job, offset_range, found)
        return found

    def run(self, offset_range: OffsetRange, attempt: int = 0) -> RangeReport:
        started = time.perf_counter()
        found = self._aggregate(offset_range)
        if isinstance(found, RangeReport):
            return found
        return self._commit_alone(offset_range, found, attempt, started, time.perf_counter())

    def _commit_alone(
        self,
        offset_range: OffsetRange,
        found: Aggregated,
        attempt: int,
        started: float,
        read_done: float,
    ) -> RangeReport:
        def commit(conn: psycopg.Connection) -> None:
            sink = TransactionalSink(conn, self.job, self.failpoints, self.publish_to, self.publish_max_bytes)
            sink.commit(offset_range, found.deltas, attempt, found.bad, found.last)

        parts = [(offset_range, found)]
        report = _commit_in_worker(self.job, self.database_url, parts, commit, started, read_done)[0]
        return _with_skipped(report, found.bad)

    def run_together(self, ranges: Sequence[OffsetRange], attempt: int = 0) -> list[RangeReport]:
        """A task's several ranges (many partitions): aggregate each, commit all in one transaction.

        One transaction instead of one per range, because for small ranges the
        commit is most of the cost. If it is refused for anything but "all
        already committed" (another writer committed some of them), each range
        is committed alone instead, so each gets its own exact outcome. Small
        ranges are read on one consumer at once (:func:`~txstore.kafka.together.read_together`:
        for a few messages a range, the broker's round trips are most of the read).
        """
        started = time.perf_counter()
        reports: list[RangeReport] = []
        read: list[tuple[OffsetRange, Aggregated]] = []
        together = read_together(self.kafka_conf, together_candidates(ranges), self.job)
        for offset_range in ranges:
            found = self._aggregate(offset_range, together.get(offset_range.key))
            if isinstance(found, RangeReport):
                reports.append(found)
            else:
                read.append((offset_range, found))
        read_done = time.perf_counter()
        if not read:
            return reports
        combined: dict[tuple[str, ResultKey], Number] = {}
        for offset_range, found in read:
            for k, v in found.deltas.items():
                address = (offset_range.topic, k)
                combined[address] = add_metrics(combined.get(address, 0), v)
        bad = [b for _, found in read for b in found.bad]
        conflict = False

        def commit(conn: psycopg.Connection) -> None:
            nonlocal conflict
            sink = TransactionalSink(conn, self.job, self.failpoints, self.publish_to, self.publish_max_bytes)
            try:
                last = {r.key: found.last for r, found in read if found.last is not None}
                sink.commit_batch([r for r, _ in read], combined, attempt, bad, last)
            except (OffsetGap, OffsetOverlap):
                conflict = True  # nothing was written; sort it out range by range

        parts = [(r, found) for r, found in read]
        committed = _commit_in_worker(self.job, self.database_url, parts, commit, started, read_done)
        if not conflict:
            return reports + [
                _with_skipped(report, found.bad) for report, (_, found) in zip(committed, read, strict=True)
            ]
        return reports + [self._commit_alone(r, found, attempt, started, read_done) for r, found in read]


@dataclass(frozen=True)
class MessageTask:
    """Store a range's messages idempotently (``--sink idempotent``), streaming them into one transaction."""

    job: str
    database_url: str = field(repr=False)  # holds the password
    kafka_conf: Mapping[str, Any] = field(repr=False)  # may hold SASL or key passwords
    transform: MessageTransform | None = None
    failpoints: FailPoints = field(default_factory=FailPoints)
    on_bad_message: str = FAIL

    def __call__(self, ranges: Iterable[OffsetRange]) -> Iterator[RangeReport]:
        attempt = task_attempt()
        for offset_range in ranges:
            yield self.run(offset_range, attempt)

    def run(self, offset_range: OffsetRange, attempt: int = 0) -> RangeReport:
        started = time.perf_counter()
        reader = RangeReader(self.kafka_conf, offset_range, job=self.job)
        skipped: tuple[BadOffset, ...] = ()

        def commit(conn: psycopg.Connection) -> None:
            nonlocal skipped
            sink = IdempotentSink(conn, self.job, self.failpoints)
            sink.store(offset_range, reader, self.transform, attempt, skip_bad=self.on_bad_message == SKIP)
            skipped = sink.skipped

        report = _commit_in_worker(self.job, self.database_url, [(offset_range, reader)], commit, started)[0]
        return _with_skipped(report, skipped)


def _with_skipped(report: RangeReport, bad: tuple[BadOffset, ...]) -> RangeReport:
    """A committed range's report, naming the messages skipped as bad (the driver logs them)."""
    if not bad or report.outcome != COMMITTED:
        return report
    return replace(report, bad_messages=bad[:REPORTED_BAD_MESSAGES], skipped=len(bad))
