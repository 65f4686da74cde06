"""A batch's report and the log lines it gives: a line per range and a summary line.

With ``--log-format json`` each line is one JSON object whose fields carry the
same numbers (:mod:`txstore.report.logformat`), so a dashboard or an alert reads them
without parsing text.

Range lines go to the ``txstore.ranges`` logger. A batch of more than
:data:`RANGE_LINES_AT_INFO` ranges (a job on many partitions) logs at INFO only the
ranges that need a look (refused, already committed, messages skipped); its routine
ones (committed, nothing skipped) go to DEBUG, and the batch line says how many: a
job on 1,024 partitions would otherwise write 1,024 INFO lines a batch, 50-80 ms of
the driver's time each batch and a log nobody reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from txstore.kafka.bad_messages import describe_skipped
from txstore.report.logformat import fields
from txstore.spark.ranges.range_task import ALREADY_COMMITTED, COMMITTED, REFUSED, RangeReport

log = logging.getLogger("txstore")
range_log = logging.getLogger("txstore.ranges")

RANGE_LINES_AT_INFO = 16
"""A batch of at most this many ranges logs every range line at INFO; a bigger one logs its
routine ranges (committed, nothing skipped) at DEBUG."""


@dataclass(frozen=True)
class BatchReport:
    number: int
    ranges: tuple[RangeReport, ...]
    plan_ms: float
    run_ms: float
    commit_ms: float = 0.0  # per-batch commits: the driver's transaction (part of run_ms)
    range_times: bool = True  # False when the driver commits the batch: no range has times of its own

    @property
    def messages(self) -> int:
        return sum(r.messages for r in self.ranges)


def log_batch(job: str, report: BatchReport, skipped_by: str = "aggregate") -> None:
    """A line per range and a summary line; with ``--log-format json`` each is one JSON
    object whose fields carry the same numbers (:mod:`txstore.report.logformat`). ``skipped_by``:
    what skipped messages failed in (``"aggregate"``, or ``"transform"`` for an idempotent
    sink)."""
    if report.commit_ms:
        log.info(
            "job %s batch %d: committed per batch in %.0f ms",
            job,
            report.number,
            report.commit_ms,
            extra=fields(event="batch_commit", job=job, batch=report.number, commit_ms=_ms(report.commit_ms)),
        )
    timed = report.range_times
    routine = logging.DEBUG if len(report.ranges) > RANGE_LINES_AT_INFO else logging.INFO
    at_debug = 0
    for r in report.ranges:
        level = routine if r.outcome == COMMITTED and not r.skipped else logging.INFO
        if level == logging.DEBUG:
            at_debug += 1
        if range_log.isEnabledFor(level):
            _log_range(job, report, r, level, timed)
        if r.skipped and r.outcome == COMMITTED:
            n = r.skipped
            log.warning(
                "job %s: range %s: skipped %d message%s the %s failed on, recorded in txn_bad_messages: %s",
                job,
                r.range,
                n,
                "" if n == 1 else "s",
                skipped_by,
                describe_skipped(r.bad_messages, n),
            )
    _log_summary(job, report, at_debug)


def _log_range(job: str, report: BatchReport, r: RangeReport, level: int, timed: bool) -> None:
    outcome = r.outcome if r.outcome != REFUSED else f"REFUSED: {r.error}"
    times = f"{r.read_ms + r.commit_ms:.0f} ms (read {r.read_ms:.0f}, commit {r.commit_ms:.0f}), "
    range_log.log(
        level,
        "range %s: %d messages, %s%s",
        r.range,
        r.messages,
        times if timed else "",
        outcome,
        extra=fields(
            event="range",
            job=job,
            batch=report.number,
            topic=r.range.topic,
            partition=r.range.partition,
            **{"from": r.range.from_offset},
            until=r.range.until_offset,
            messages=r.messages,
            read_ms=_ms(r.read_ms) if timed else None,
            commit_ms=_ms(r.commit_ms) if timed else None,
            outcome=r.outcome,
            error=r.error,
        ),
    )


def _log_summary(job: str, report: BatchReport, at_debug: int) -> None:
    timed = report.range_times
    skipped = sum(1 for r in report.ranges if r.outcome == ALREADY_COMMITTED)
    read_ms = sum(r.read_ms for r in report.ranges)
    commit_ms = sum(r.commit_ms for r in report.ranges)
    outcome = (
        "failed" if any(r.outcome == REFUSED for r in report.ranges) else "ok" if report.ranges else "idle"
    )
    # Tasks' times summed where tasks commit; else the driver's commit of the whole batch.
    detail = (
        f"tasks read {read_ms:.0f}, commit {commit_ms:.0f}" if timed else f"commit {report.commit_ms:.0f}"
    )
    log.info(
        "job %s batch %d: %d ranges, %d messages, %.0f ms (plan %.0f, run %.0f; %s)%s%s",
        job,
        report.number,
        len(report.ranges),
        report.messages,
        report.plan_ms + report.run_ms,
        report.plan_ms,
        report.run_ms,
        detail,
        f", {skipped} already committed" if skipped else "",
        f"; {at_debug} committed range lines at DEBUG (--verbose, or the txstore.ranges logger)"
        if at_debug
        else "",
        extra=fields(
            event="batch",
            job=job,
            batch=report.number,
            ranges=len(report.ranges),
            messages=report.messages,
            ms=_ms(report.plan_ms + report.run_ms),
            plan_ms=_ms(report.plan_ms),
            run_ms=_ms(report.run_ms),
            read_ms=_ms(read_ms) if timed else None,
            commit_ms=_ms(commit_ms + report.commit_ms),
            already_committed=skipped,
            outcome=outcome,
            range_lines_at_debug=at_debug,
        ),
    )


def _ms(value: float) -> float:
    """Milliseconds for a JSON log field: to the microsecond, enough for timings."""
    return round(value, 3)
