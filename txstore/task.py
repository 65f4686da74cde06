"""What one Spark task does with one range: read, aggregate, commit.

Runs in a Spark Python worker. The task object is frozen and pickled to the
executors with everything it needs; the database connection is opened once
per worker process and reused by every task that worker runs.

Deterministic refusals (gap, overlap, aged-out data) come back to the driver
as a report instead of an exception: retrying them cannot help, and the
driver turns them into one clear line. Transient failures (a dropped
connection, a broker timeout) raise, so Spark retries the task; the retry
reads the same range and either commits it or finds it already committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Message

from txstore.db import forget_worker_connection, redact, worker_connection
from txstore.errors import (
    AlreadyCommitted,
    DatabaseUnavailable,
    DataLoss,
    OffsetGap,
    OffsetOverlap,
    first_line,
)
from txstore.failpoints import FailPoints
from txstore.kafka import RangeReader
from txstore.ranges import OffsetRange
from txstore.sink import ResultKey, TransactionalSink

Aggregate = Callable[[OffsetRange, Iterable[list[Message]]], Mapping[ResultKey, int]]
"""Turns a range's messages (in batches) into result deltas keyed by ``(key, window_start)``."""

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


def task_attempt() -> int:
    """The Spark attempt number of the running task (0 outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return int(context.attemptNumber()) if context is not None else 0


@dataclass(frozen=True)
class RangeTask:
    job: str
    database_url: str
    kafka_conf: Mapping[str, Any]
    aggregate: Aggregate
    failpoints: FailPoints = field(default_factory=FailPoints)

    def __call__(self, ranges: Iterable[OffsetRange]) -> Iterator[RangeReport]:
        attempt = task_attempt()
        for offset_range in ranges:
            yield self.run(offset_range, attempt)

    def run(self, offset_range: OffsetRange, attempt: int = 0) -> RangeReport:
        started = time.perf_counter()
        reader = RangeReader(self.kafka_conf, offset_range)
        try:
            deltas = self.aggregate(offset_range, reader)
        except DataLoss as e:
            return RangeReport(offset_range, REFUSED, reader.messages, error=str(e), error_kind="DataLoss")
        read_done = time.perf_counter()
        try:
            conn = worker_connection(self.database_url)
            TransactionalSink(conn, self.job, self.failpoints).commit(offset_range, deltas, attempt)
            outcome = COMMITTED
        except AlreadyCommitted:
            outcome = ALREADY_COMMITTED
        except (OffsetGap, OffsetOverlap) as e:
            return RangeReport(
                offset_range, REFUSED, reader.messages, error=str(e), error_kind=type(e).__name__
            )
        except psycopg.Error as e:
            forget_worker_connection(self.database_url)
            raise DatabaseUnavailable(
                f"committing {offset_range} for job {self.job!r} failed at "
                f"{redact(self.database_url)}: {first_line(e)}; nothing was committed for this range"
            ) from None
        finished = time.perf_counter()
        return RangeReport(
            offset_range,
            outcome,
            reader.messages,
            read_ms=(read_done - started) * 1000,
            commit_ms=(finished - read_done) * 1000,
        )
