"""The driver: plan a batch from the database and Kafka, run it on Spark, repeat.

A batch:

1. read the job's committed offsets from ``txn_offsets`` (never from Spark
   checkpoints);
2. ask Kafka for every partition's watermarks (after step 1, so that an
   offset another instance commits meanwhile is never above them);
3. give partitions without a row their starting offset (``INSERT .. ON
   CONFLICT DO NOTHING``, then re-read, so concurrent starters agree);
4. plan one range per partition with new data; none means no Spark job;
5. run one Spark task per range (read, aggregate, commit in one transaction);
6. log a line per range and a summary line; a refused range fails the batch.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from txstore import store
from txstore.db import connect
from txstore.errors import BatchFailed, DatabaseUnavailable, TxstoreError, first_line
from txstore.failpoints import FailPoints
from txstore.kafka import client_config, fetch_watermarks, offsets_for_timestamp
from txstore.locks import hold_job_lock
from txstore.migrate import check_schema
from txstore.mirror import GroupOffsetMirror
from txstore.ranges import (
    OffsetRange,
    PartitionWatermarks,
    TopicPartition,
    aged_out,
    limit_ranges,
    plan_ranges,
)
from txstore.spark import run_ranges, spark_failure_reason
from txstore.starting import StartingOffsets, resolve_starting_offsets
from txstore.task import ALREADY_COMMITTED, REFUSED, Aggregate, RangeReport, RangeTask

log = logging.getLogger("txstore")


@dataclass(frozen=True)
class JobSettings:
    """Everything a job needs; built from the shared command-line options or by hand."""

    job: str
    topics: tuple[str, ...]
    bootstrap_servers: str
    database_url: str
    starting_offsets: StartingOffsets = field(default_factory=StartingOffsets)
    kafka_options: Mapping[str, str] = field(default_factory=dict)
    interval: float | None = None  # None: one batch (--once)
    max_offsets_per_batch: int | None = None
    fail_on_data_loss: bool = True
    commit_to_kafka_group: str | None = None
    max_batch_failures: int = 3

    @property
    def kafka_conf(self) -> dict[str, Any]:
        return client_config(self.bootstrap_servers, self.kafka_options)


@dataclass(frozen=True)
class BatchReport:
    number: int
    ranges: tuple[RangeReport, ...]
    plan_ms: float
    run_ms: float

    @property
    def messages(self) -> int:
        return sum(r.messages for r in self.ranges)


class TransactionalJob:
    """Runs an aggregate over Kafka with exactly-once results in PostgreSQL."""

    def __init__(
        self,
        spark: Any,
        settings: JobSettings,
        aggregate: Aggregate,
        watermarks: Callable[
            [Mapping[str, Any], Sequence[str]], list[PartitionWatermarks]
        ] = fetch_watermarks,
    ) -> None:
        """``watermarks`` asks Kafka for the topics' partitions and offsets; tests may give their own."""
        self.spark = spark
        self.settings = settings
        self.aggregate = aggregate
        self.watermarks = watermarks
        self.failpoints = FailPoints.from_env()
        self.batches = 0
        self._conn: psycopg.Connection | None = None
        self._mirror: GroupOffsetMirror | None = None

    # -- driver database connection, reused across batches ------------------
    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.settings.database_url)
            check_schema(self._conn, self.settings.database_url)
            hold_job_lock(self._conn, self.settings.job)
        return self._conn

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None
        if self._mirror is not None:
            self._mirror.close()
            self._mirror = None

    def __enter__(self) -> TransactionalJob:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- planning ---------------------------------------------------------------
    def plan(self) -> list[OffsetRange]:
        """Steps 1-4: the ranges the next batch must commit (capped by ``max_offsets_per_batch``)."""
        s = self.settings
        try:
            conn = self._connection()
            committed, watermarks = self._state(conn)
            if self._start_new_partitions(conn, committed, watermarks) or self._skip_lost(
                conn, committed, watermarks
            ):
                committed, watermarks = self._state(conn)
            return limit_ranges(plan_ranges(s.job, committed, watermarks), s.max_offsets_per_batch)
        except psycopg.Error as e:
            self.close()
            raise DatabaseUnavailable(
                f"planning job {s.job!r} failed in PostgreSQL: {first_line(e)}"
            ) from None

    def _state(self, conn: psycopg.Connection) -> tuple[dict[TopicPartition, int], list[PartitionWatermarks]]:
        # Offsets first, watermarks after: then every legitimately committed
        # offset is at or below the log end we plan with, even while another
        # instance of the job commits in between.
        s = self.settings
        committed = store.committed_offsets(conn, s.job, s.topics)
        return committed, self.watermarks(s.kafka_conf, s.topics)

    def _start_new_partitions(
        self,
        conn: psycopg.Connection,
        committed: dict[TopicPartition, int],
        watermarks: list[PartitionWatermarks],
    ) -> bool:
        """Step 3; True if rows were created (or found created by another instance)."""
        s = self.settings
        new = [w for w in watermarks if w.key not in committed]
        started = {topic for topic, _ in committed}
        by_time = None
        if new and s.starting_offsets.timestamp_ms is not None:
            first_run = [w.key for w in new if w.topic not in started]
            by_time = offsets_for_timestamp(s.kafka_conf, first_run, s.starting_offsets.timestamp_ms)
        decisions = resolve_starting_offsets(
            s.starting_offsets, new, [w.key for w in watermarks], started, by_time
        )
        if not decisions:
            return False
        created = store.create_start_rows(conn, s.job, decisions)
        for d in decisions:
            if (d.topic, d.partition) in created:
                log.info("job %s: %s/%d starts at %s", s.job, d.topic, d.partition, d.reason)
            else:
                log.info("job %s: %s/%d was started by another instance", s.job, d.topic, d.partition)
        return True

    def _skip_lost(
        self,
        conn: psycopg.Connection,
        committed: dict[TopicPartition, int],
        watermarks: list[PartitionWatermarks],
    ) -> bool:
        """With ``fail_on_data_loss`` off: move past aged-out offsets, recording them.

        With it on, the planner refuses them instead (:class:`DataLoss`).
        """
        s = self.settings
        lost = [] if s.fail_on_data_loss else aged_out(committed, watermarks)
        if not lost:
            return False
        for r in store.record_lost_ranges(conn, s.job, lost):
            log.warning(
                "job %s: %s/%d: offsets %d -> %d (%d messages) aged out of Kafka before they were "
                "counted; skipped and recorded in txn_lost_ranges (--fail-on-data-loss false)",
                s.job,
                r.topic,
                r.partition,
                r.from_offset,
                r.until_offset,
                r.size,
            )
        return True

    # -- one batch --------------------------------------------------------------
    def run_batch(self) -> BatchReport:
        """Plan and run one batch; raise :class:`TxstoreError` if any range was refused."""
        started = time.perf_counter()
        ranges = self.plan()
        return self.execute(ranges, plan_ms=(time.perf_counter() - started) * 1000)

    def execute(self, ranges: list[OffsetRange], plan_ms: float = 0.0) -> BatchReport:
        """Step 5-6: one Spark task per planned range; no Spark job if there are none."""
        s = self.settings
        self.batches += 1
        number = self.batches
        started = time.perf_counter()
        task = RangeTask(s.job, s.database_url, s.kafka_conf, self.aggregate, self.failpoints)
        try:
            reports = run_ranges(self.spark, ranges, task, f"txstore {s.job} batch {number}")
        except TxstoreError:
            raise
        except Exception as e:
            if type(e).__name__ not in ("Py4JJavaError", "PythonException", "SparkException"):
                raise
            # Spark already retried the tasks; a later batch may still succeed.
            raise BatchFailed(
                f"job {s.job!r} batch {number} failed: {spark_failure_reason(e)}", transient=True
            ) from None
        report = BatchReport(number, tuple(reports), plan_ms, (time.perf_counter() - started) * 1000)
        self._log(report)
        if s.commit_to_kafka_group:
            self._mirror_offsets(report)
        refused = [r for r in report.ranges if r.outcome == REFUSED]
        if refused:
            # Messages that aged out after planning: with --fail-on-data-loss false the
            # next batch's planning records and skips them, so retrying helps.
            transient = not s.fail_on_data_loss and all(r.error_kind == "DataLoss" for r in refused)
            raise BatchFailed(
                refused[0].error or f"range {refused[0].range} was refused", transient=transient
            )
        return report

    def _mirror_offsets(self, report: BatchReport) -> None:
        """After the database commits: the same offsets to the Kafka group (``--commit-to-kafka-group``)."""
        s = self.settings
        assert s.commit_to_kafka_group is not None
        if self._mirror is None:
            self._mirror = GroupOffsetMirror(s.kafka_conf, s.commit_to_kafka_group)
        self._mirror.publish(
            {r.range.key: r.range.until_offset for r in report.ranges if r.outcome != REFUSED}
        )

    def _log(self, report: BatchReport) -> None:
        for r in report.ranges:
            log.info(
                "range %s: %d messages, %.0f ms (read %.0f, commit %.0f), %s",
                r.range,
                r.messages,
                r.read_ms + r.commit_ms,
                r.read_ms,
                r.commit_ms,
                r.outcome if r.outcome != REFUSED else f"REFUSED: {r.error}",
            )
        skipped = sum(1 for r in report.ranges if r.outcome == ALREADY_COMMITTED)
        log.info(
            "job %s batch %d: %d ranges, %d messages, %.0f ms (plan %.0f, run %.0f)%s",
            self.settings.job,
            report.number,
            len(report.ranges),
            report.messages,
            report.plan_ms + report.run_ms,
            report.plan_ms,
            report.run_ms,
            f", {skipped} already committed" if skipped else "",
        )

    # -- the loop ---------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """``--once``: one batch. ``--interval``: batches until ``stop`` is set.

        In interval mode a failed batch is retried at the next interval; the job
        gives up after ``max_batch_failures`` failures in a row. Errors that
        retrying cannot fix (bad settings, missing schema, refused ranges)
        stop it at once.
        """
        s = self.settings
        stop = stop or threading.Event()
        try:
            if s.interval is None:
                self.run_batch()
                return
            failures = 0
            while not stop.is_set():
                started = time.monotonic()
                try:
                    self.run_batch()
                    failures = 0
                except TxstoreError as e:
                    if not e.transient:
                        raise
                    failures += 1
                    if failures >= s.max_batch_failures:
                        raise
                    log.warning(
                        "job %s: batch failed (%d of %d in a row), retrying at the next interval: %s",
                        s.job,
                        failures,
                        s.max_batch_failures,
                        e,
                    )
                stop.wait(max(0.0, s.interval - (time.monotonic() - started)))
            log.info("job %s: stopped after %d batches", s.job, self.batches)
        finally:
            self.close()


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or the first Ctrl-C, so the current batch can finish.

    A second Ctrl-C interrupts at once.
    """
    stop = threading.Event()

    def handle(signum: int, frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("received %s: finishing the current batch, then stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop
