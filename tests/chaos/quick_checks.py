"""What every CI chaos subset (test_chaos_quick.py, test_chaos_stream_quick.py) asserts of its trials."""

from __future__ import annotations

from tests.chaos.runner import Summary


def assert_every_message_counted_once(summary: Summary, lines: list[str]) -> str:
    """Print the trials' lines and summary (the report, also returned for later assertions) and
    assert that no trial failed and none lost or counted twice a message."""
    report = "\n".join([*lines, summary.line()])
    print(report)
    assert [r.plan.seed for r in summary.failed] == [], report
    assert sum(r.lost for r in summary.results) == 0, report
    assert sum(r.duplicated for r in summary.results) == 0, report
    return report
