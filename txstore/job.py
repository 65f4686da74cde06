"""The driver: plan a batch from the database and Kafka, run it on Spark, repeat.

A batch:

1. read the job's committed offsets from ``txn_offsets`` (never from Spark
   checkpoints);
2. ask Kafka for every partition's watermarks (after step 1, so that an
   offset another instance commits meanwhile is never above them);
3. give partitions without a row their starting offset (``INSERT .. ON
   CONFLICT DO NOTHING``, then re-read, so concurrent starters agree);
4. plan one range per partition with new data; none means no Spark job;
5. per-range commits (the default): Spark tasks read, aggregate and
   commit each range in its own transaction (a task may run several ranges). Per-batch commits: tasks
   (one per range, or per piece with ``min_partitions``) aggregate, a
   driver collects and sums the deltas, and commits all results and every
   range's offset move in one transaction. ``sink="idempotent"``: tasks
   store each message under its offset instead of aggregating;
6. log a line per range and a summary line; a refused range fails the batch
   (a message the aggregate fails on stops the job with
   :class:`~txstore.errors.BadMessage`, unless ``on_bad_message="skip"``:
   then it was recorded with the commit and is logged as a warning);
7. with ``publish_topic``, send the committed results pending in the
   outbox to Kafka (:mod:`txstore.outbox`), after every batch that did not
   fail, whether or not it had new data.
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
from txstore.badmessages import FAIL, ON_BAD_MESSAGE, SKIP, BadOffset, describe_skipped
from txstore.db import connect
from txstore.errors import (
    PRIVILEGE_HINT,
    AlreadyCommitted,
    BadMessage,
    BatchFailed,
    ConfigError,
    DatabaseUnavailable,
    OffsetGap,
    OffsetOverlap,
    PermissionDenied,
    TxstoreError,
    committed_past_start,
    first_line,
)
from txstore.failpoints import FailPoints, InjectedFailure
from txstore.idempotent import MessageTransform
from txstore.kafka import (
    Watermarks,
    client_config,
    fixed_option_problem,
    offsets_for_timestamp,
    topic_name_problem,
)
from txstore.locks import hold_job_lock
from txstore.migrate import check_schema
from txstore.mirror import GroupOffsetMirror
from txstore.outbox import OutboxPublisher, close_producers
from txstore.ranges import (
    OffsetRange,
    PartitionHistory,
    PartitionWatermarks,
    TopicPartition,
    aged_out,
    limit_ranges,
    plan_ranges,
    split_ranges,
)
from txstore.sink import PUBLISH_MAX_BYTES, TransactionalSink
from txstore.spark import (
    BatchResult,
    aggregate_batch,
    dataframe_deltas,
    job_description,
    read_ranges,
    run_ranges,
    spark_failure_reason,
)
from txstore.starting import StartingOffsets, resolve_starting_offsets
from txstore.task import (
    ALREADY_COMMITTED,
    COMMITTED,
    REFUSED,
    REPORTED_BAD_MESSAGES,
    Aggregate,
    MessageTask,
    RangeReport,
    RangeTask,
)
from txstore.topic_ids import TopicIds

PER_RANGE = "per-range"
PER_BATCH = "per-batch"
TRANSACTIONAL = "transactional"
IDEMPOTENT = "idempotent"
COMMIT_MODES = (PER_RANGE, PER_BATCH)
SINKS = (TRANSACTIONAL, IDEMPOTENT)
DRIVER_COMMIT_ATTEMPTS = 3
MIN_PUBLISH_MAX_BYTES = 4096  # room for a commit's identity, ranges and some results per message

DataFrameAggregate = Callable[[Any], Any]
"""A DataFrame with Spark's Kafka-source columns -> a DataFrame of deltas
(``topic``, ``metric``, optional ``key``, ``window_start``, ``grain``)."""

log = logging.getLogger("txstore")


@dataclass(frozen=True)
class JobSettings:
    """Everything a job needs; built from the shared command-line options or by hand."""

    job: str
    topics: tuple[str, ...]
    bootstrap_servers: str
    database_url: str = field(repr=False)  # holds the password
    starting_offsets: StartingOffsets = field(default_factory=StartingOffsets)
    kafka_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold passwords
    interval: float | None = None  # None: one batch (--once)
    max_offsets_per_batch: int | None = None
    fail_on_data_loss: bool = True
    commit_to_kafka_group: str | None = None
    max_batch_failures: int = 3
    commit: str = PER_RANGE  # or PER_BATCH: one driver-side transaction per batch
    min_partitions: int | None = None  # per-batch only: at least this many Spark tasks
    sink: str = TRANSACTIONAL  # or IDEMPOTENT: store each message under its offset
    publish_topic: str | None = None  # also publish committed results to this Kafka topic
    publish_max_bytes: int = PUBLISH_MAX_BYTES  # split a commit's results into messages of at most this
    on_bad_message: str = FAIL  # or SKIP: record messages the aggregate fails on, count the rest

    def __post_init__(self) -> None:
        for topic in self.topics:
            problem = topic_name_problem(topic)
            if problem:
                raise ConfigError(problem)
        problem = fixed_option_problem(self.kafka_options)
        if problem:
            raise ConfigError(problem)
        if self.commit not in COMMIT_MODES:
            raise ConfigError(f"--commit must be one of {', '.join(COMMIT_MODES)}, got {self.commit!r}")
        if self.sink not in SINKS:
            raise ConfigError(f"--sink must be one of {', '.join(SINKS)}, got {self.sink!r}")
        if self.on_bad_message not in ON_BAD_MESSAGE:
            raise ConfigError(
                f"--on-bad-message must be one of {', '.join(ON_BAD_MESSAGE)}, got {self.on_bad_message!r}"
            )
        if self.min_partitions is not None and (self.min_partitions < 1 or self.commit != PER_BATCH):
            raise ConfigError(
                "--min-partitions needs --commit per-batch and a number of at least 1 "
                "(per-range commits are one task per Kafka partition)"
            )
        if self.publish_max_bytes < MIN_PUBLISH_MAX_BYTES:
            raise ConfigError(
                f"--publish-max-bytes must be at least {MIN_PUBLISH_MAX_BYTES}, got {self.publish_max_bytes}"
            )
        if self.sink == IDEMPOTENT and (self.commit != PER_RANGE or self.publish_topic):
            raise ConfigError(
                "--sink idempotent stores messages range by range; it takes neither --commit per-batch "
                "nor --publish-topic"
            )

    @property
    def kafka_conf(self) -> dict[str, Any]:
        return client_config(self.bootstrap_servers, self.kafka_options)


@dataclass(frozen=True)
class BatchReport:
    number: int
    ranges: tuple[RangeReport, ...]
    plan_ms: float
    run_ms: float
    commit_ms: float = 0.0  # per-batch commits: the driver's transaction (part of run_ms)

    @property
    def messages(self) -> int:
        return sum(r.messages for r in self.ranges)


class TransactionalJob:
    """Runs an aggregate over Kafka with exactly-once results in PostgreSQL."""

    def __init__(
        self,
        spark: Any,
        settings: JobSettings,
        aggregate: Aggregate | None = None,
        *,
        dataframe_aggregate: DataFrameAggregate | None = None,
        transform: MessageTransform | None = None,
        watermarks: Callable[[Mapping[str, Any], Sequence[str]], list[PartitionWatermarks]] | None = None,
    ) -> None:
        """Give ``aggregate`` (plain Python over a range's messages) or ``dataframe_aggregate``
        (a DataFrame transformation; always commits per batch). With ``settings.sink ==
        "idempotent"`` give neither, or a ``transform`` choosing what to store per message.

        ``watermarks`` asks Kafka for the topics' partitions and offsets; tests may give their own.
        By default one Kafka admin client is kept for the job's life (planning an
        idle batch then costs a few round trips, not a new client).
        """
        if settings.sink == IDEMPOTENT:
            if aggregate is not None or dataframe_aggregate is not None:
                raise ConfigError("an idempotent sink stores messages; give a transform, not an aggregate")
        elif (aggregate is None) == (dataframe_aggregate is None):
            raise ConfigError("give exactly one of aggregate and dataframe_aggregate")
        elif transform is not None:
            raise ConfigError("transform is for the idempotent sink (settings.sink='idempotent')")
        if dataframe_aggregate is not None and settings.on_bad_message == SKIP:
            raise ConfigError(
                "--on-bad-message skip needs a Python aggregate: a DataFrame aggregate fails inside Spark SQL, "
                "where txstore cannot tell which message it failed on"
            )
        self.spark = spark
        self.settings = settings
        self.aggregate = aggregate
        self.dataframe_aggregate = dataframe_aggregate
        self.transform = transform
        self._own_watermarks: Watermarks | None = None
        self._topic_ids_source: TopicIds | None = None  # asked only with the job's own Kafka clients
        if watermarks is None:
            watermarks = self._own_watermarks = Watermarks()
            self._topic_ids_source = TopicIds()
        self.watermarks = watermarks
        self.failpoints = FailPoints.from_env()
        self.batches = 0
        self._conn: psycopg.Connection | None = None
        self._mirror: GroupOffsetMirror | None = None
        self._publisher = (
            OutboxPublisher(settings.kafka_conf, settings.job) if settings.publish_topic else None
        )
        self._history: dict[TopicPartition, PartitionHistory] = {}

    @property
    def commits_per_batch(self) -> bool:
        return self.settings.commit == PER_BATCH or self.dataframe_aggregate is not None

    # -- driver database connection, reused across batches ------------------
    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.settings.database_url)
            check_schema(self._conn, self.settings.database_url)
            hold_job_lock(self._conn, self.settings.job)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None

    def close(self) -> None:
        self._drop_connection()
        if self._mirror is not None:
            self._mirror.close()
            self._mirror = None
        if self._publisher is not None:
            close_producers()
        if self._own_watermarks is not None:
            self._own_watermarks.close()
        if self._topic_ids_source is not None:
            self._topic_ids_source.close()

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
            # Both steps, always: a batch may start new partitions and skip aged-out offsets at once.
            started = self._start_new_partitions(conn, committed, watermarks)
            skipped = self._skip_lost(conn, committed, watermarks)
            if started or skipped:
                committed, watermarks = self._state(conn)
            topic_ids = self._topic_ids(conn)
            ranges = plan_ranges(s.job, committed, watermarks, self._history, topic_ids)
            return limit_ranges(ranges, s.max_offsets_per_batch)
        except psycopg.errors.InsufficientPrivilege as e:
            self.close()
            raise PermissionDenied(
                f"planning job {s.job!r}: PostgreSQL said {first_line(e)}; {PRIVILEGE_HINT}"
            ) from None
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
        committed, self._history = store.committed_state(conn, s.job, s.topics)
        return committed, self.watermarks(s.kafka_conf, s.topics)

    def _topic_ids(self, conn: psycopg.Connection) -> dict[str, str]:
        """Kafka's topic IDs where it reports them (asked with the job's own admin client only),
        stored in the rows that have none yet, so a later recreation is seen."""
        if self._topic_ids_source is None:
            return {}
        s = self.settings
        ids = self._topic_ids_source(s.kafka_conf, s.topics)
        unknown = {
            t: i
            for t, i in ids.items()
            if any(k[0] == t and not h.topic_id for k, h in self._history.items())
        }
        if unknown:
            store.record_topic_ids(conn, s.job, unknown)
        return ids

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
        self.failpoints.hit("after-plan")
        return self.execute(ranges, plan_ms=(time.perf_counter() - started) * 1000)

    def execute(self, ranges: list[OffsetRange], plan_ms: float = 0.0) -> BatchReport:
        """Steps 5-7: run the planned ranges; no Spark job if there are none."""
        s = self.settings
        self.batches += 1
        number = self.batches
        started = time.perf_counter()
        description = f"txstore {s.job} batch {number}"
        commit_ms = 0.0
        try:
            if self.commits_per_batch:
                reports, commit_ms = self._run_per_batch(ranges, description)
            elif s.sink == IDEMPOTENT:
                store = MessageTask(
                    s.job, s.database_url, s.kafka_conf, self.transform, self.failpoints, s.on_bad_message
                )
                reports = run_ranges(self.spark, ranges, store, description)
            else:
                assert self.aggregate is not None
                task = RangeTask(
                    s.job,
                    s.database_url,
                    s.kafka_conf,
                    self.aggregate,
                    self.failpoints,
                    s.publish_topic,
                    s.publish_max_bytes,
                    s.on_bad_message,
                )
                reports = run_ranges(self.spark, ranges, task, description)
        except TxstoreError:
            raise
        except Exception as e:
            if type(e).__name__ not in ("Py4JJavaError", "PythonException", "SparkException"):
                raise
            # Spark already retried the tasks; a later batch may still succeed, unless a
            # DataFrame's reader found the topic recreated.
            reason = spark_failure_reason(e)
            raise BatchFailed(
                f"job {s.job!r} batch {number} failed: {reason}",
                transient=not reason.startswith("TopicRecreated: "),
            ) from None
        report = BatchReport(
            number, tuple(reports), plan_ms, (time.perf_counter() - started) * 1000, commit_ms
        )
        self._log(report)
        if s.commit_to_kafka_group:
            self._mirror_offsets(report)
        refused = [r for r in report.ranges if r.outcome == REFUSED]
        bad = [b for r in refused if r.error_kind == BadMessage.__name__ for b in r.bad_messages]
        if bad:  # retrying cannot help, whatever else was refused
            raise self._bad_message(min(bad))
        if refused:
            # Messages that aged out after planning: with --fail-on-data-loss false the
            # next batch's planning records and skips them, so retrying helps.
            transient = not s.fail_on_data_loss and all(r.error_kind == "DataLoss" for r in refused)
            raise BatchFailed(
                refused[0].error or f"range {refused[0].range} was refused",
                transient=transient,
                replan=all(r.stale_plan for r in refused),
            )
        if self._publisher is not None:
            self.publish()
        return report

    def _bad_message(self, bad: BadOffset) -> BadMessage:
        stage = "transform" if self.settings.sink == IDEMPOTENT else "aggregate"
        return BadMessage(self.settings.job, bad.topic, bad.partition, bad.offset, bad.reason, stage)

    def publish(self) -> int:
        """Send the job's committed, pending results to ``publish_topic``; return how many.

        Runs after every successful batch, even one with nothing new: what is
        pending is read from the database (one query on the partial pending
        index when nothing is), never remembered in memory, so rows committed
        by a batch that failed afterwards, or by another instance, go out at
        the next batch.
        """
        assert self._publisher is not None
        try:
            return self._publisher.publish_pending(self._connection())
        except psycopg.Error as e:
            self._drop_connection()
            raise DatabaseUnavailable(
                f"reading the outbox of job {self.settings.job!r} failed: {first_line(e)}"
            ) from None

    # -- per-batch commits --------------------------------------------------------
    def _run_per_batch(self, ranges: list[OffsetRange], description: str) -> tuple[list[RangeReport], float]:
        """Aggregate across all partitions on Spark, then commit the batch from the driver."""
        s = self.settings
        if not ranges:
            return [], 0.0
        pieces = split_ranges(ranges, s.min_partitions)
        if self.dataframe_aggregate is not None:
            with job_description(self.spark, description):
                # No fingerprint is recorded here (Spark plans the DataFrame); ranges are still verified.
                frame = self.dataframe_aggregate(read_ranges(self.spark, pieces, s.kafka_conf, s.job))
                result = BatchResult(dataframe_deltas(frame), {r.key: r.size for r in ranges})
        else:
            assert self.aggregate is not None
            skip = s.on_bad_message == SKIP
            result = aggregate_batch(
                self.spark, pieces, s.kafka_conf, self.aggregate, description, skip, s.job
            )
        if result.refused:  # a recreated topic: nothing is committed
            return [
                RangeReport(r, REFUSED, error=result.refused.get(r.key), error_kind="TopicRecreated")
                for r in ranges
                if r.key in result.refused
            ], 0.0
        deltas, messages, bad = result.deltas, result.messages, result.bad
        if bad and s.on_bad_message != SKIP:
            raise self._bad_message(bad[0])  # nothing was committed
        started = time.perf_counter()
        outcome = self._commit_batch(ranges, deltas, bad, result.last)
        commit_ms = (time.perf_counter() - started) * 1000
        skipped = {r.key: [b for b in bad if (b.topic, b.partition) == r.key] for r in ranges} if bad else {}
        reports = [
            RangeReport(r, outcome, messages.get(r.key, 0))
            if outcome != COMMITTED or not skipped.get(r.key)
            else RangeReport(
                r,
                outcome,
                messages.get(r.key, 0),
                bad_messages=tuple(skipped[r.key][:REPORTED_BAD_MESSAGES]),
                skipped=len(skipped[r.key]),
            )
            for r in ranges
        ]
        return reports, commit_ms

    def _commit_batch(
        self,
        ranges: list[OffsetRange],
        deltas: Any,
        bad: Sequence[BadOffset] = (),
        last: Mapping[TopicPartition, Any] | None = None,
    ) -> str:
        """Commit on the driver; if the connection drops, commit again on a new one.

        A commit whose acknowledgement was lost is then found already
        committed; one that did not happen commits now. Gaps and overlaps
        roll back everything and stop the job.
        """
        s = self.settings
        for attempt in range(DRIVER_COMMIT_ATTEMPTS):
            try:
                sink = TransactionalSink(
                    self._connection(), s.job, self.failpoints, s.publish_topic, s.publish_max_bytes
                )
                sink.commit_batch(ranges, deltas, attempt, bad, last)
                return COMMITTED
            except AlreadyCommitted:
                if attempt == 0:
                    log.warning("job %s: this batch was already committed by another instance", s.job)
                return ALREADY_COMMITTED
            except (OffsetGap, OffsetOverlap) as e:
                raise BatchFailed(str(e), transient=False, replan=committed_past_start(e)) from None
            except (psycopg.OperationalError, InjectedFailure) as e:
                self._drop_connection()
                if attempt + 1 == DRIVER_COMMIT_ATTEMPTS:
                    raise DatabaseUnavailable(
                        f"committing job {s.job!r} batch {self.batches} failed: {first_line(e)}; "
                        "nothing or all of it was committed, and the next batch plans from what was"
                    ) from None
                log.warning(
                    "job %s: batch commit interrupted (%s); committing again, a commit that landed "
                    "is recognised as already committed",
                    s.job,
                    first_line(e),
                )
        raise AssertionError("unreachable")

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
        if report.commit_ms:
            log.info(
                "job %s batch %d: committed per batch in %.0f ms",
                self.settings.job,
                report.number,
                report.commit_ms,
            )
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
            if r.skipped and r.outcome == COMMITTED:
                n = r.skipped
                log.warning(
                    "job %s: range %s: skipped %d message%s the %s failed on, recorded in txn_bad_messages: %s",
                    self.settings.job,
                    r.range,
                    n,
                    "" if n == 1 else "s",
                    "transform" if self.settings.sink == IDEMPOTENT else "aggregate",
                    describe_skipped(r.bad_messages, n),
                )
        skipped = sum(1 for r in report.ranges if r.outcome == ALREADY_COMMITTED)
        log.info(
            "job %s batch %d: %d ranges, %d messages, %.0f ms (plan %.0f, run %.0f; tasks read %.0f, "
            "commit %.0f)%s",
            self.settings.job,
            report.number,
            len(report.ranges),
            report.messages,
            report.plan_ms + report.run_ms,
            report.plan_ms,
            report.run_ms,
            sum(r.read_ms for r in report.ranges),
            sum(r.commit_ms for r in report.ranges),
            f", {skipped} already committed" if skipped else "",
        )

    # -- the loop ---------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """``--once``: one batch. ``--interval``: batches until ``stop`` is set.

        In interval mode a failed batch is retried at the next interval; the job
        gives up after ``max_batch_failures`` failures in a row. Errors that
        retrying cannot fix (bad settings, missing schema, gaps) stop it at
        once. A batch refused only because its plan went stale (another
        instance committed part of it) is planned again at once, also with
        ``--once``.
        """
        s = self.settings
        stop = threading.Event() if stop is None else stop
        try:
            if s.interval is None:
                for attempt in range(1, s.max_batch_failures + 1):
                    try:
                        self.run_batch()
                        return
                    except BatchFailed as e:
                        if not e.replan or attempt == s.max_batch_failures:
                            raise
                        log.warning("job %s: %s; planning again", s.job, e)
                return
            interval = s.interval
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
                    if isinstance(e, BatchFailed) and e.replan:
                        log.warning("job %s: %s; planning again", s.job, e)
                        continue
                    log.warning(
                        "job %s: batch failed (%d of %d in a row), retrying at the next interval: %s",
                        s.job,
                        failures,
                        s.max_batch_failures,
                        e,
                    )
                self.failpoints.hit("between-batches")
                stop.wait(max(0.0, interval - (time.monotonic() - started)))
            log.info("job %s: stopped after %d batches", s.job, self.batches)
        finally:
            self.close()


def stop_on_signals(stop: threading.Event | None = None) -> threading.Event:
    """An event set by SIGTERM or the first Ctrl-C, so the current batch can finish.

    A second Ctrl-C interrupts at once. Pass the event again to reinstall the handlers.
    """
    stop = threading.Event() if stop is None else stop

    def handle(signum: int, frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("received %s: finishing the current batch, then stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop
