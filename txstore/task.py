"""What a Spark task does with each of its ranges: read, aggregate or store, commit.

Runs in a Spark Python worker. The task object is frozen and pickled to the
executors with everything it needs; the database connection is opened once
per worker process and reused by every task that worker runs.

Deterministic refusals (gap, overlap, aged-out data, a recreated topic) come back to the driver
as a report instead of an exception: retrying them cannot help, and the
driver turns them into one clear line. Transient failures (a dropped
connection, a broker timeout) raise, so Spark retries the task; the retry
reads the same range and either commits it or finds it already committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Message

from txstore.db import forget_worker_connection, redact, worker_connection
from txstore.errors import (
    PRIVILEGE_HINT,
    AlreadyCommitted,
    CommitConflict,
    DatabaseUnavailable,
    DataLoss,
    OffsetGap,
    OffsetOverlap,
    TopicRecreated,
    committed_past_start,
    first_line,
)
from txstore.failpoints import FailPoints
from txstore.idempotent import IdempotentSink, MessageTransform
from txstore.kafka import RangeReader
from txstore.ranges import OffsetRange
from txstore.results import Number, ResultKey, add_metrics
from txstore.sink import TransactionalSink

Aggregate = Callable[[OffsetRange, Iterable[list[Message]]], Mapping[ResultKey, Number]]
"""Turns a range's messages (in batches) into result deltas keyed by :class:`ResultKey`."""

COMMITTED = "committed"
ALREADY_COMMITTED = "already committed"
REFUSED = "refused"


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


def task_attempt() -> int:
    """The Spark attempt number of the running task (0 outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return int(context.attemptNumber()) if context is not None else 0


def _refused(offset_range: OffsetRange, reader: RangeReader, error: Exception) -> RangeReport:
    return RangeReport(
        offset_range,
        REFUSED,
        reader.messages,
        error=str(error),
        error_kind=type(error).__name__,
        stale_plan=isinstance(error, CommitConflict) and committed_past_start(error),
    )


def _commit_in_worker(
    job: str,
    database_url: str,
    parts: Sequence[tuple[OffsetRange, RangeReader]],
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
    except (OffsetGap, OffsetOverlap, DataLoss, TopicRecreated) as e:
        return [_refused(r, reader, e) for r, reader in parts]
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

    def __call__(self, ranges: Iterable[OffsetRange]) -> Iterator[RangeReport]:
        attempt = task_attempt()
        ranges = list(ranges)
        if len(ranges) == 1:
            yield self.run(ranges[0], attempt)
        else:
            yield from self.run_together(ranges, attempt)

    def run(self, offset_range: OffsetRange, attempt: int = 0) -> RangeReport:
        started = time.perf_counter()
        reader = RangeReader(self.kafka_conf, offset_range, job=self.job)
        try:
            deltas = self.aggregate(offset_range, reader)
        except (DataLoss, TopicRecreated) as e:
            return _refused(offset_range, reader, e)
        return self._commit_alone(offset_range, reader, deltas, attempt, started, time.perf_counter())

    def _commit_alone(
        self,
        offset_range: OffsetRange,
        reader: RangeReader,
        deltas: Mapping[ResultKey, Number],
        attempt: int,
        started: float,
        read_done: float,
    ) -> RangeReport:
        def commit(conn: psycopg.Connection) -> None:
            sink = TransactionalSink(conn, self.job, self.failpoints, self.publish_to)
            sink.commit(offset_range, deltas, attempt, reader.last)

        parts = [(offset_range, reader)]
        return _commit_in_worker(self.job, self.database_url, parts, commit, started, read_done)[0]

    def run_together(self, ranges: Sequence[OffsetRange], attempt: int = 0) -> list[RangeReport]:
        """A task's several ranges (many partitions): aggregate each, commit all in one transaction.

        One transaction instead of one per range, because for small ranges the
        commit is most of the cost. If it is refused for anything but "all
        already committed" (another writer committed some of them), each range
        is committed alone instead, so each gets its own exact outcome.
        """
        started = time.perf_counter()
        reports: list[RangeReport] = []
        read: list[tuple[OffsetRange, RangeReader, Mapping[ResultKey, Number]]] = []
        for offset_range in ranges:
            reader = RangeReader(self.kafka_conf, offset_range, job=self.job)
            try:
                read.append((offset_range, reader, self.aggregate(offset_range, reader)))
            except (DataLoss, TopicRecreated) as e:
                reports.append(_refused(offset_range, reader, e))
        read_done = time.perf_counter()
        if not read:
            return reports
        combined: dict[tuple[str, ResultKey], Number] = {}
        for offset_range, _, deltas in read:
            for k, v in deltas.items():
                address = (offset_range.topic, k)
                combined[address] = add_metrics(combined.get(address, 0), v)
        conflict = False

        def commit(conn: psycopg.Connection) -> None:
            nonlocal conflict
            sink = TransactionalSink(conn, self.job, self.failpoints, self.publish_to)
            try:
                last = {r.key: reader.last for r, reader, _ in read if reader.last is not None}
                sink.commit_batch([r for r, _, _ in read], combined, attempt, last)
            except (OffsetGap, OffsetOverlap):
                conflict = True  # nothing was written; sort it out range by range

        parts = [(r, reader) for r, reader, _ in read]
        together = _commit_in_worker(self.job, self.database_url, parts, commit, started, read_done)
        if not conflict:
            return reports + together
        return reports + [
            self._commit_alone(r, reader, deltas, attempt, started, read_done) for r, reader, deltas in read
        ]


@dataclass(frozen=True)
class MessageTask:
    """Store a range's messages idempotently (``--sink idempotent``), streaming them into one transaction."""

    job: str
    database_url: str = field(repr=False)  # holds the password
    kafka_conf: Mapping[str, Any] = field(repr=False)  # may hold SASL or key passwords
    transform: MessageTransform | None = None
    failpoints: FailPoints = field(default_factory=FailPoints)

    def __call__(self, ranges: Iterable[OffsetRange]) -> Iterator[RangeReport]:
        attempt = task_attempt()
        for offset_range in ranges:
            yield self.run(offset_range, attempt)

    def run(self, offset_range: OffsetRange, attempt: int = 0) -> RangeReport:
        started = time.perf_counter()
        reader = RangeReader(self.kafka_conf, offset_range, job=self.job)

        def commit(conn: psycopg.Connection) -> None:
            sink = IdempotentSink(conn, self.job, self.failpoints)
            sink.store(offset_range, reader, self.transform, attempt)

        return _commit_in_worker(self.job, self.database_url, [(offset_range, reader)], commit, started)[0]
