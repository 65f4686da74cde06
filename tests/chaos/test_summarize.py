"""Rebuilding a run's summary from its trial lines (a run cut off before its summary)."""

from __future__ import annotations

import pytest

from tests.chaos.__main__ import main, summarize
from tests.chaos.runner import Summary, TrialPlan, TrialResult


def result(
    seed: int, produced: int, counted: int, injected: dict[str, int], failure: str = ""
) -> TrialResult:
    r = TrialResult(TrialPlan.generate(seed), produced=produced, counted=counted, seconds=31.0)
    r.lost, r.duplicated = max(0, produced - counted), max(0, counted - produced)
    r.injected.update(injected)
    r.events.update({"failed-task-attempts": seed % 7, "stopped": 1})
    if failure:
        r.failures.append(failure)
    return r


def test_the_summary_of_printed_trial_lines_equals_the_runs_own() -> None:
    results = [
        result(2000, 100, 100, {"kill-driver": 1, "fp-after-plan": 3}),
        result(2001, 50, 49, {"kafka-down": 1}, failure="offsets {0: 3} differ; from the log ends {0: 4}"),
        result(2002, 70, 70, {}),
    ]
    own = Summary(seed=2000)
    for r in results:
        own.add(r)
    noise = ["trial 1/3 seed 2000: faults kill-driver; 2 partitions", "  instance 1 started (python)"]
    rebuilt = summarize([*noise, *("  " + r.line() for r in results), "%3|librdkafka noise"])
    assert rebuilt.line() == own.line()
    assert "lost 1" in rebuilt.line() and "failed trials: 2001" in rebuilt.line()


def test_a_failure_quoting_several_lines_is_one_line_and_old_broken_lines_still_count_as_failed() -> None:
    """Seed 4017's failure quoted a reset plan: its line broke in four and the summary left the
    trial out (and its lost and duplicated counts)."""
    plan = "reset plan:\n  t/0: 34 -> 0\n  t/1: 1516 -> 0, new generation 1"
    failed = result(4017, 7747, 5929, {"topic-recreated": 1}, failure=plan)
    failed.lost, failed.duplicated = 1483, 1483
    ok = result(4018, 10, 10, {})
    assert "\n" not in failed.line()
    broken = ("  " + failed.line().replace(" / ", "\n")).split("\n")
    old_output = [*broken, "  logs: /tmp/x", "  " + ok.line()]
    for lines in (old_output, ["  " + failed.line(), "  " + ok.line()]):
        rebuilt = summarize(lines)
        assert "failed trials: 4017" in rebuilt.line()
        assert "lost 1483, duplicated 1483" in rebuilt.line()
        assert len(rebuilt.results) == 2


def test_a_real_kafka_summary_lists_the_real_brokers_kinds_and_not_the_mocks_own() -> None:
    own = Summary(seed=6000, kafka="real")
    own.add(result(6000, 80, 80, {"kafka-killed-mid-read": 1, "aborted-transactions": 1}))
    line = own.line()
    assert "(seed 6000, real Kafka)" in line
    assert "kafka-killed-mid-read=1 kafka-killed-mid-commit=0 aborted-transactions=1" in line
    assert "kafka-request-errors" not in line and "topic-recreated" not in line
    mock = Summary(seed=6000)
    mock.add(result(6000, 80, 80, {}))
    assert "kafka-request-errors=0" in mock.line() and "aborted-transactions" not in mock.line()


def test_connect_on_real_kafka_is_refused_in_one_line() -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--kafka", "real", "--connect", "--trials", "1"])
    assert stopped.value.code == 2
