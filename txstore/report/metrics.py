"""Prometheus metrics for a job (``--metrics-port``): what the driver saw, served at ``/metrics``.

Steps:

1. :func:`job_metrics` opens the HTTP port before the first batch (a port in
   use is :class:`~txstore.core.errors.MetricsPortInUse`, one line, exit 2) and
   registers the job's metrics in its OWN :class:`CollectorRegistry`, so
   tests and several jobs in one process never collide on the global one;
2. the driver calls :meth:`JobMetrics.planned` after each plan (the backlog
   per partition the plan saw: log end minus committed offset),
   :meth:`JobMetrics.batch_finished` after each batch that ran (ok, idle, or
   refused ranges), :meth:`JobMetrics.batch_failed` after one that raised,
   and :meth:`JobMetrics.outbox_pending` after publishing;
3. :meth:`JobMetrics.close` stops the server.

Without ``--metrics-port`` the driver holds a :class:`NoMetrics`, whose
methods do nothing: no registry, no thread, no port.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from txstore.core.errors import MetricsPortInUse
from txstore.core.ranges import TopicPartition
from txstore.spark.ranges.range_task import ALREADY_COMMITTED, COMMITTED, REFUSED, RangeReport

OK = "ok"
FAILED = "failed"
IDLE = "idle"
CONFLICT_KINDS = {"OffsetGap": "gap", "OffsetOverlap": "overlap"}
"""A refused range's ``error_kind`` -> ``txstore_commit_conflicts_total{kind}`` (plus already_committed)."""

# 10 ms .. 10 min, about three buckets a decade.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class NoMetrics:
    """The driver's metrics when ``--metrics-port`` is not given: every call does nothing."""

    enabled = False

    @property
    def port(self) -> int:
        """The port served (0: none)."""
        return 0

    def planned(self, backlog: Mapping[TopicPartition, int]) -> None:
        pass

    def batch_finished(self, ranges: Iterable[RangeReport], seconds: float, driver_commit_ms: float) -> None:
        pass

    def batch_failed(self, seconds: float, conflict: str | None = None) -> None:
        pass

    def outbox_pending(self, pending: int) -> None:
        pass

    def close(self) -> None:
        pass


class JobMetrics(NoMetrics):
    """A job's metrics in their own registry, optionally served over HTTP (:func:`job_metrics`)."""

    enabled = True

    def __init__(self, job: str, *, outbox: bool = False, bad_messages: bool = False) -> None:
        # Imported here, not above: Spark tasks import this module (through the txstore package)
        # and the workers need not have prometheus_client (README: what workers need).
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.job = job
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self._server: Any = None
        self._messages = Counter(
            "txstore_messages", "Messages committed by this process", ["job", "topic"], registry=registry
        )
        self._batches = Counter(
            "txstore_batches", "Batches by outcome (ok, failed, idle)", ["job", "outcome"], registry=registry
        )
        self._batch_seconds = Histogram(
            "txstore_batch_duration_seconds",
            "A batch's planning and run time",
            ["job"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._commit_seconds = Histogram(
            "txstore_commit_duration_seconds",
            "Commit transactions (each range's in a task, or the driver's per-batch commit)",
            ["job"],
            buckets=COMMIT_BUCKETS,
            registry=registry,
        )
        self._lag = Gauge(
            "txstore_lag_messages",
            "Log end minus committed offset, as the last plan saw it",
            ["job", "topic", "partition"],
            registry=registry,
        )
        self._partitions = Gauge(
            "txstore_topic_partitions",
            "Partitions of each topic the last plan covered: the job's topics (a --topic-pattern "
            "job's: those it matches and holds now)",
            ["job", "topic"],
            registry=registry,
        )
        self._planned: set[TopicPartition] = set()
        self._last_commit = Gauge(
            "txstore_last_commit_timestamp_seconds",
            "When this process last committed a range (Unix time)",
            ["job"],
            registry=registry,
        )
        self._conflicts = Counter(
            "txstore_commit_conflicts",
            "Commits refused by the offset check (already_committed, gap, overlap)",
            ["job", "kind"],
            registry=registry,
        )
        for kind in ("already_committed", *CONFLICT_KINDS.values()):
            self._conflicts.labels(job, kind)
        for outcome in (OK, FAILED, IDLE):
            self._batches.labels(job, outcome)
        self._batch_seconds.labels(job)
        self._commit_seconds.labels(job)
        self._pending = (
            Gauge("txstore_outbox_pending", "Outbox rows not yet sent", ["job"], registry=registry)
            if outbox
            else None
        )
        self._bad = (
            Counter(
                "txstore_bad_messages",
                "Messages skipped and recorded in txn_bad_messages",
                ["job"],
                registry=registry,
            )
            if bad_messages
            else None
        )
        if self._bad is not None:
            self._bad.labels(job)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``host:port`` in a daemon thread; raise :class:`MetricsPortInUse`."""
        from prometheus_client import start_http_server

        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise MetricsPortInUse(
                f"job {self.job!r}: cannot serve metrics on {host}:{port}: {e.strerror or e}; "
                "pick a free port with --metrics-port (or stop what holds it)"
            ) from None

    @property
    def port(self) -> int:
        """The port actually served (useful with ``--metrics-port 0``)."""
        return int(self._server.server_address[1]) if self._server is not None else 0

    def planned(self, backlog: Mapping[TopicPartition, int]) -> None:
        """The plan's backlog per partition, and the partitions per topic it covered (the topics a
        ``--topic-pattern`` job holds now); a partition or topic the plan no longer covers (a
        topic forgotten after it was deleted) leaves the metrics."""
        per_topic: dict[str, int] = {}
        for (topic, partition), lag in backlog.items():
            self._lag.labels(self.job, topic, str(partition)).set(lag)
            per_topic[topic] = per_topic.get(topic, 0) + 1
        for topic, partition in self._planned - set(backlog):
            self._lag.remove(self.job, topic, str(partition))
        for topic, count in per_topic.items():
            self._partitions.labels(self.job, topic).set(count)
        for topic in {t for t, _ in self._planned} - set(per_topic):
            self._partitions.remove(self.job, topic)
        self._planned = set(backlog)

    def batch_finished(self, ranges: Iterable[RangeReport], seconds: float, driver_commit_ms: float) -> None:
        """After a batch ran: its ranges' reports, its duration, the driver's commit milliseconds
        (per-batch commits; 0 when each range committed in a task)."""
        job = self.job
        ranges = list(ranges)
        committed = False
        for r in ranges:
            if r.outcome == COMMITTED:
                committed = True
                if r.messages:
                    self._messages.labels(job, r.range.topic).inc(r.messages)
                if not driver_commit_ms and r.commit_ms:
                    self._commit_seconds.labels(job).observe(r.commit_ms / 1000)
                if self._bad is not None and r.skipped:
                    self._bad.labels(job).inc(r.skipped)
            elif r.outcome == ALREADY_COMMITTED:
                self._conflicts.labels(job, "already_committed").inc()
            elif r.outcome == REFUSED and r.error_kind in CONFLICT_KINDS:
                self._conflicts.labels(job, CONFLICT_KINDS[r.error_kind]).inc()
        if driver_commit_ms:
            self._commit_seconds.labels(job).observe(driver_commit_ms / 1000)
        if committed:
            self._last_commit.labels(job).set(time.time())
        refused = any(r.outcome == REFUSED for r in ranges)
        outcome = FAILED if refused else OK if ranges else IDLE
        self._batches.labels(job, outcome).inc()
        self._batch_seconds.labels(job).observe(seconds)

    def batch_failed(self, seconds: float, conflict: str | None = None) -> None:
        """After a batch that raised; ``conflict``: a refused driver-side commit's error class name."""
        if conflict in CONFLICT_KINDS:
            self._conflicts.labels(self.job, CONFLICT_KINDS[conflict]).inc()
        self._batches.labels(self.job, FAILED).inc()
        self._batch_seconds.labels(self.job).observe(seconds)

    def outbox_pending(self, pending: int) -> None:
        if self._pending is not None:
            self._pending.labels(self.job).set(pending)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def job_metrics(
    job: str,
    port: int | None,
    host: str = "127.0.0.1",
    *,
    outbox: bool = False,
    bad_messages: bool = False,
) -> NoMetrics:
    """The driver's metrics: served on ``host:port``, or with ``port`` None a :class:`NoMetrics`."""
    if port is None:
        return NoMetrics()
    metrics = JobMetrics(job, outbox=outbox, bad_messages=bad_messages)
    metrics.serve(port, host)
    return metrics
