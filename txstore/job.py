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
   :class:`~txstore.core.errors.BadMessage`, unless ``on_bad_message="skip"``:
   then it was recorded with the commit and is logged as a warning);
7. with ``publish_topic``, send the committed results pending in the
   outbox to Kafka (:mod:`txstore.postgres.outbox`), after every batch that did not
   fail, whether or not it had new data.

Where each part lives: settings in :mod:`txstore.settings` (re-exported
here), what it runs checked before the first batch in :mod:`txstore.query`, steps 1-4 in
:mod:`txstore.planning`, step 5 in one module per
execution mode (:mod:`txstore.modes`), everything Spark-facing in
:mod:`txstore.spark.ranges.tasks`, a batch's report and log lines in
:mod:`txstore.report.batch_report`; this module holds the driver's resources,
mirrors offsets, publishes, and loops.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from txstore.core.errors import (
    BadMessage,
    BatchFailed,
    DatabaseUnavailable,
    PermissionDenied,
    PublishFailed,
    TxstoreError,
    first_line,
)
from txstore.core.failpoints import FailPoints
from txstore.core.ranges import OffsetRange, PartitionWatermarks, TopicPartition
from txstore.kafka.bad_messages import SKIP
from txstore.kafka.client import Watermarks
from txstore.kafka.mirror import GroupOffsetMirror
from txstore.kafka.producers import close_producers
from txstore.kafka.topic_ids import TopicIds
from txstore.modes import Mode, bad_message
from txstore.modes.dataframe import DataFrameMode
from txstore.modes.idempotent import IdempotentMode
from txstore.modes.per_batch import DRIVER_COMMIT_ATTEMPTS, PerBatchMode
from txstore.modes.per_range import PerRangeMode
from txstore.modes.results_table import ResultsTableMode
from txstore.planning import Planner
from txstore.postgres import store
from txstore.postgres.driverdb import DriverConnection
from txstore.postgres.idempotent import MessageTransform
from txstore.postgres.outbox import OutboxPublisher, pending_count
from txstore.postgres.results.results_table import ResultsTable
from txstore.query import check_arguments, prepare_query
from txstore.report.batch_report import BatchReport, log_batch
from txstore.report.metrics import job_metrics
from txstore.settings import (
    COMMIT_MODES,
    IDEMPOTENT,
    MIN_PUBLISH_MAX_BYTES,
    PER_BATCH,
    PER_RANGE,
    SINKS,
    TRANSACTIONAL,
    DataFrameAggregate,
    JobSettings,
)
from txstore.spark.ranges.range_task import REFUSED, Aggregate
from txstore.spark.ranges.tasks import spark_failure_reason
from txstore.spark.source.pushdown import PartialCount

__all__ = [
    "COMMIT_MODES",
    "DRIVER_COMMIT_ATTEMPTS",
    "IDEMPOTENT",
    "MIN_PUBLISH_MAX_BYTES",
    "PER_BATCH",
    "PER_RANGE",
    "SINKS",
    "TRANSACTIONAL",
    "BatchReport",
    "DataFrameAggregate",
    "JobSettings",
    "TransactionalJob",
    "stop_on_signals",
]

log = logging.getLogger("txstore")


class TransactionalJob:
    """Runs an aggregate over Kafka with exactly-once results in PostgreSQL.

    Planning is :class:`~txstore.planning.Planner`'s, how a batch runs is its
    mode's (:mod:`txstore.modes`); the job holds the driver's resources
    (database connection, Kafka clients, outbox publisher), logs each batch
    (:mod:`txstore.report.batch_report`), mirrors offsets, publishes, and loops.
    """

    def __init__(
        self,
        spark: Any,
        settings: JobSettings,
        aggregate: Aggregate | None = None,
        *,
        dataframe_aggregate: DataFrameAggregate | None = None,
        transform: MessageTransform | None = None,
        results_table: ResultsTable | None = None,
        read_columns: Sequence[str] | None = None,
        push_down_counts: bool = True,
        watermarks: Callable[[Mapping[str, Any], Sequence[str]], list[PartitionWatermarks]] | None = None,
    ) -> None:
        """Give ``aggregate`` (plain Python over a range's messages) or ``dataframe_aggregate``
        (a DataFrame transformation; always commits per batch). With ``settings.sink ==
        "idempotent"`` give neither, or a ``transform`` choosing what to store per message.

        ``results_table``: merge the ``dataframe_aggregate``'s rows into a table of your own
        (:class:`~txstore.postgres.results.results_table.ResultsTable`: its key and each column's merge rule),
        checked against the table and the query before the first batch reads anything.

        ``read_columns``: the Kafka-source columns the ``dataframe_aggregate`` uses (say
        ``("topic",)`` for counts per topic, ``("key", "timestamp")`` for windows per key).
        Only those are built and handed to Spark; Spark cannot prune the columns of a Python
        reader itself, and a query over ``topic`` alone then skips every key, value and
        header. The query is checked against them before the first batch reads anything:
        a column left out is one line (:class:`ConfigError`). Default: the columns Spark's
        optimized plan of the query uses, found once before the first batch
        (:mod:`txstore.spark.source.used_columns`; all of them when the plan cannot tell). Declare all
        of them to read every column.

        ``push_down_counts``: a ``dataframe_aggregate`` that is only counts grouped by
        Kafka-source columns (``df.groupBy("topic", "key").count()``) is counted in part by
        the tasks that read the messages, with pyarrow, so Spark gets about one row per group and
        task instead of one per message (:mod:`txstore.spark.source.pushdown`: found once before the
        first batch and kept only if the result's columns are the same). False: run the
        aggregate as written.

        ``watermarks`` asks Kafka for the topics' partitions and offsets; tests may give their own.
        By default one Kafka admin client is kept for the job's life (planning an
        idle batch then costs a few round trips, not a new client).
        """
        read_columns = check_arguments(
            settings, aggregate, dataframe_aggregate, transform, results_table, read_columns
        )
        # First, so a port in use stops the job before it opens anything else (exit 2).
        self.metrics = job_metrics(
            settings.job,
            settings.metrics_port,
            settings.metrics_host,
            outbox=settings.publish_topic is not None,
            bad_messages=settings.on_bad_message == SKIP,
        )
        self.spark = spark
        self.settings = settings
        self.aggregate = aggregate
        self.dataframe_aggregate = dataframe_aggregate
        self.transform = transform
        self.results_table = results_table
        self.read_columns: Sequence[str] | None = read_columns
        self.push_down_counts = push_down_counts
        self.pushdown: PartialCount | None = None  # found by check_query
        self._query_checked = False
        self._results_types: dict[str, str] | None = None  # the table's column types, once checked
        self._own_watermarks: Watermarks | None = None
        self._topic_ids_source: TopicIds | None = None  # asked only with the job's own Kafka clients
        if watermarks is None:
            watermarks = self._own_watermarks = Watermarks()
            self._topic_ids_source = TopicIds(self._own_watermarks.admin_for)  # one client for both
        self.watermarks = watermarks
        self.planner = Planner(
            settings,
            watermarks,
            self._topic_ids_source,
            self._own_watermarks.topic_names if self._own_watermarks is not None else None,
        )
        self.failpoints = FailPoints.from_env()
        self.batches = 0
        self._db = DriverConnection(settings.database_url, settings.job)
        self._mirror: GroupOffsetMirror | None = None
        self._mirrored: dict[TopicPartition, int] = {}  # the offsets the group has from this job
        self._publisher = (
            OutboxPublisher(settings.kafka_conf, settings.job, batch_bytes=settings.publish_max_bytes)
            if settings.publish_topic
            else None
        )

    @property
    def commits_per_batch(self) -> bool:
        return self.settings.commit == PER_BATCH or self.dataframe_aggregate is not None

    # -- driver resources -------------------------------------------------------
    def _connection(self) -> psycopg.Connection:
        return self._db.get()

    def _drop_connection(self) -> None:
        self._db.drop()

    def close(self) -> None:
        """Stop serving metrics and release every client (the job's end)."""
        self.metrics.close()
        self._release_clients()

    def _release_clients(self) -> None:
        """Drop the database connection and Kafka clients; the next batch opens them again."""
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
        try:
            ranges = self.planner.plan(self._connection)
        except (PermissionDenied, DatabaseUnavailable):
            self._release_clients()  # metrics keep being served: --interval retries
            raise
        self.metrics.planned(self.planner.backlog)
        return ranges

    def check_query(self) -> None:
        """Before the first batch reads anything: refuse a results table the query's rows cannot
        merge into (:class:`~txstore.core.errors.ResultsTableInvalid`, every problem one line), and a
        ``dataframe_aggregate`` that needs a column ``read_columns`` leaves out
        (:class:`ConfigError`); choose the columns to read and the counts to push down
        (:func:`txstore.query.prepare_query`)."""
        if self._query_checked:
            return
        if self.dataframe_aggregate is not None:
            prepared = prepare_query(
                self.spark,
                self._connection(),
                self.settings,
                self.dataframe_aggregate,
                self.results_table,
                self.read_columns,
                self.push_down_counts,
            )
            self.read_columns, self.pushdown = prepared.read_columns, prepared.pushdown
            self._results_types = prepared.results_types
        self._query_checked = True

    # -- one batch --------------------------------------------------------------
    def mode(self, number: int) -> Mode:
        """How this job runs a batch (:mod:`txstore.modes`)."""
        s = self.settings
        if self.results_table is not None:
            assert self.dataframe_aggregate is not None and self._results_types is not None
            return ResultsTableMode(
                self.spark,
                s,
                self.dataframe_aggregate,
                self.results_table,
                self._results_types,
                self.failpoints,
                self._db,
                number,
                self.read_columns,
                self.pushdown,
            )
        if self.dataframe_aggregate is not None:
            return DataFrameMode(
                self.spark,
                s,
                self.dataframe_aggregate,
                self.failpoints,
                self._db,
                number,
                self.read_columns,
                self.pushdown,
            )
        if s.sink == IDEMPOTENT:
            return IdempotentMode(self.spark, s, self.transform, self.failpoints)
        assert self.aggregate is not None
        if s.commit == PER_BATCH:
            return PerBatchMode(self.spark, s, self.aggregate, self.failpoints, self._db, number)
        return PerRangeMode(self.spark, s, self.aggregate, self.failpoints)

    def run_batch(self) -> BatchReport:
        """Plan and run one batch; raise :class:`TxstoreError` if any range was refused."""
        started = time.perf_counter()
        try:
            self.check_query()
            ranges = self.plan()
        except TxstoreError:
            self.metrics.batch_failed(time.perf_counter() - started)
            raise
        self.failpoints.hit("after-plan")
        return self.execute(ranges, plan_ms=(time.perf_counter() - started) * 1000)

    def execute(self, ranges: list[OffsetRange], plan_ms: float = 0.0) -> BatchReport:
        """Steps 5-7: run the planned ranges; no Spark job if there are none."""
        s = self.settings
        self.check_query()  # once; run_batch did it already, before planning
        self.batches += 1
        number = self.batches
        started = time.perf_counter()
        description = f"txstore {s.job} batch {number}"
        mode = self.mode(number)
        try:
            reports, commit_ms = mode.run(ranges, description)
        except TxstoreError as e:
            conflict = e.conflict if isinstance(e, BatchFailed) else None
            self.metrics.batch_failed(plan_ms / 1000 + time.perf_counter() - started, conflict)
            raise
        except Exception as e:
            self.metrics.batch_failed(plan_ms / 1000 + time.perf_counter() - started)
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
            number,
            tuple(reports),
            plan_ms,
            (time.perf_counter() - started) * 1000,
            commit_ms,
            range_times=mode.tasks_commit,
        )
        log_batch(s.job, report, skipped_by="transform" if s.sink == IDEMPOTENT else "aggregate")
        self.metrics.batch_finished(report.ranges, (report.plan_ms + report.run_ms) / 1000, report.commit_ms)
        if s.commit_to_kafka_group:
            self._mirror_offsets()
        refused = [r for r in report.ranges if r.outcome == REFUSED]
        bad = [b for r in refused if r.error_kind == BadMessage.__name__ for b in r.bad_messages]
        if bad:  # retrying cannot help, whatever else was refused
            raise bad_message(s, min(bad))
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
            try:
                sent = self._publisher.publish_pending(self._connection())
            except PublishFailed:  # what still waits is then the number to watch
                self._outbox_pending()
                raise
            self._outbox_pending()
            return sent
        except psycopg.Error as e:
            self._drop_connection()
            raise DatabaseUnavailable(
                f"reading the outbox of job {self.settings.job!r} failed: {first_line(e)}"
            ) from None

    def _outbox_pending(self) -> None:
        if self.metrics.enabled:
            self.metrics.outbox_pending(pending_count(self._connection(), self.settings.job))

    def _mirror_offsets(self) -> None:
        """After the database commits: the same offsets to the Kafka group (``--commit-to-kafka-group``).

        Every partition the job stores, read back from the database, not only the batch's
        ranges: a partition started at its end (``latest``, a start time past the end) or
        found empty has an offset but no range, and Kafka's tools would show it without one.
        Only offsets that changed since the last mirror are sent. Never fatal.
        """
        s = self.settings
        assert s.commit_to_kafka_group is not None
        if self._mirror is None:
            self._mirror = GroupOffsetMirror(s.kafka_conf, s.commit_to_kafka_group)
        try:
            conn = self._connection()
            stored = store.committed_offsets(conn, s.job, list(self.planner.topics))
            conn.commit()
        except psycopg.Error as e:
            self._drop_connection()
            log.warning(
                "could not mirror offsets to Kafka group %r: reading them failed: %s (the database "
                "stays correct)",
                s.commit_to_kafka_group,
                first_line(e),
            )
            return
        changed = {k: o for k, o in stored.items() if self._mirrored.get(k) != o}
        if self._mirror.publish(changed):
            self._mirrored.update(changed)

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
