"""A batch's log lines (txstore/report/batch_report.py): a line per range while a batch is small,
and for a batch of many partitions only the ranges that need a look, at INFO.

A job on 1,024 partitions wrote 1,024 INFO lines a batch, a batch every few seconds: about
50 ms (text) to 80 ms (JSON) of the driver's time each batch, and a log nobody reads. Routine
ranges (committed, nothing skipped) of a batch with more than ``RANGE_LINES_AT_INFO`` ranges go
to DEBUG (``--verbose``, or the ``txstore.ranges`` logger); refused, already committed and
skipping ranges stay at INFO or WARNING, and the batch line says how many range lines went to
DEBUG. Pure: no server.
"""

from __future__ import annotations

import json
import logging

import pytest

from txstore.core.ranges import OffsetRange
from txstore.kafka.bad_messages import BadOffset
from txstore.report.batch_report import RANGE_LINES_AT_INFO, BatchReport, log_batch
from txstore.report.logformat import formatter
from txstore.spark.ranges.range_task import ALREADY_COMMITTED, COMMITTED, REFUSED, RangeReport


def committed(partition: int) -> RangeReport:
    return RangeReport(OffsetRange("t", partition, 100, 120), COMMITTED, 20, 1.0, 2.0)


def batch(*ranges: RangeReport) -> BatchReport:
    return BatchReport(7, ranges, plan_ms=10.0, run_ms=100.0)


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_every_range_of_a_small_batch_has_its_line_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="txstore")
    log_batch("j", batch(*(committed(p) for p in range(RANGE_LINES_AT_INFO))))
    info = lines(caplog, logging.INFO)
    assert [x for x in info if x.startswith("range ")] == [
        f"range t/{p} 100 -> 120: 20 messages, 3 ms (read 1, commit 2), committed"
        for p in range(RANGE_LINES_AT_INFO)
    ]
    assert info[-1] == (
        f"job j batch 7: {RANGE_LINES_AT_INFO} ranges, {20 * RANGE_LINES_AT_INFO} messages, 110 ms "
        f"(plan 10, run 100; tasks read {RANGE_LINES_AT_INFO}, commit {2 * RANGE_LINES_AT_INFO})"
    )


def test_a_batch_of_many_ranges_logs_only_the_ranges_that_need_a_look_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="txstore")
    refused = RangeReport(OffsetRange("t", 3, 5, 9), REFUSED, 0, error="offset 5 is no longer in Kafka")
    again = RangeReport(OffsetRange("t", 4, 0, 10), ALREADY_COMMITTED, 10)
    skipping = RangeReport(
        OffsetRange("t", 5, 0, 10), COMMITTED, 9, bad_messages=(BadOffset("t", 5, 4, "bad"),), skipped=1
    )
    routine = [committed(p) for p in range(6, 6 + 1024)]
    log_batch("j", batch(refused, again, skipping, *routine))
    info = lines(caplog, logging.INFO)
    assert [x for x in info if x.startswith("range ")] == [
        "range t/3 5 -> 9: 0 messages, 0 ms (read 0, commit 0), REFUSED: offset 5 is no longer in Kafka",
        "range t/4 0 -> 10: 10 messages, 0 ms (read 0, commit 0), already committed",
        "range t/5 0 -> 10: 9 messages, 0 ms (read 0, commit 0), committed",
    ]
    [warning] = lines(caplog, logging.WARNING)
    assert warning.startswith("job j: range t/5 0 -> 10: skipped 1 message the aggregate failed on")
    assert info[-1].startswith("job j batch 7: 1027 ranges, 20499 messages, 110 ms")
    assert info[-1].endswith(
        ", 1 already committed; 1024 committed range lines at DEBUG (--verbose, or the txstore.ranges logger)"
    )
    assert not [x for x in info if x.startswith("range t/6 ")]


def test_the_routine_range_lines_of_a_big_batch_are_there_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="txstore")
    log_batch("j", batch(*(committed(p) for p in range(RANGE_LINES_AT_INFO + 1))))
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert [r.getMessage() for r in debug] == [
        f"range t/{p} 100 -> 120: 20 messages, 3 ms (read 1, commit 2), committed"
        for p in range(RANGE_LINES_AT_INFO + 1)
    ]
    assert {r.name for r in debug} == {"txstore.ranges"}


def test_a_json_log_of_a_big_batch_says_how_many_range_events_went_to_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="txstore")
    log_batch("j", batch(*(committed(p) for p in range(100))))
    json_format = formatter("json")
    events = [json.loads(json_format.format(r)) for r in caplog.records]
    assert [e["event"] for e in events] == ["batch"]
    assert events[0]["ranges"] == 100 and events[0]["range_lines_at_debug"] == 100
