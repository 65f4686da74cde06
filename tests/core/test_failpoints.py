"""TXSTORE_FAILPOINTS: parsing, and what each action and condition does when hit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from txstore.core.failpoints import (
    DRIVER_NAMES,
    EXIT_STATUS,
    TASK_NAMES,
    FailPoint,
    FailPoints,
    InjectedFailure,
)


def test_every_part_of_the_syntax_parses() -> None:
    points = FailPoints.parse(
        " before-upsert , after-commit:raise@first, before-commit:exit@0.25,"
        "between-upsert-and-offsets:sleep=1.5@0.5, after-plan:exit, between-batches@1"
    )
    assert points.points == (
        FailPoint("before-upsert"),
        FailPoint("after-commit", "raise", first_attempt_only=True),
        FailPoint("before-commit", "exit", probability=0.25),
        FailPoint("between-upsert-and-offsets", "sleep", probability=0.5, sleep_seconds=1.5),
        FailPoint("after-plan", "exit"),
        FailPoint("between-batches", "raise", probability=1.0),
    )
    assert FailPoints.parse("") == FailPoints() == FailPoints.parse(" , ")
    assert {"after-plan", "between-batches", "spark-started"} == DRIVER_NAMES
    assert {
        "before-upsert",
        "between-upsert-and-offsets",
        "before-commit",
        "after-commit",
        "after-first-range",  # a stream source's task, once it read its first range
    } == TASK_NAMES


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("nowhere", "names: after-commit, after-first-range, after-plan, before-commit"),
        ("after-commit:explode", "actions: raise, exit, sleep=SECONDS"),
        ("after-commit:sleep=soon", "expected a number from 0 to 3600, got 'soon'"),
        ("after-commit@second", "expected a number from 0 to 1, got 'second'"),
        ("after-commit@1.5", "expected a number from 0 to 1, got '1.5'"),
        ("after-commit@-0.1", "expected a number from 0 to 1, got '-0.1'"),
    ],
)
def test_a_malformed_fail_point_is_refused_with_the_expected_form(text: str, hint: str) -> None:
    with pytest.raises(ValueError, match="TXSTORE_FAILPOINTS: cannot parse") as raised:
        FailPoints.parse(text)
    assert hint in str(raised.value)
    assert "NAME[:ACTION][@WHEN]" in str(raised.value)


def test_unset_fail_points_do_nothing_anywhere() -> None:
    none = FailPoints()
    for name in sorted(TASK_NAMES | DRIVER_NAMES):
        none.hit(name, attempt=0)


def test_first_fires_on_a_first_attempt_only() -> None:
    points = FailPoints.parse("after-commit@first")
    points.hit("after-commit", attempt=1)
    points.hit("before-commit", attempt=0)
    with pytest.raises(InjectedFailure, match="fail point after-commit"):
        points.hit("after-commit", attempt=0)


def test_a_probability_fires_about_that_often_and_never_at_zero() -> None:
    quarter = FailPoints.parse("before-upsert@0.25")
    fired = 0
    for _ in range(4000):
        try:
            quarter.hit("before-upsert", attempt=2)
        except InjectedFailure:
            fired += 1
    assert 800 < fired < 1200  # 1000 expected; 6+ standard deviations either side
    never = FailPoints.parse("before-upsert@0")
    for _ in range(1000):
        never.hit("before-upsert")


def test_sleep_stalls_then_goes_on() -> None:
    points = FailPoints.parse("after-plan:sleep=0.2")
    started = time.monotonic()
    points.hit("after-plan")
    assert time.monotonic() - started >= 0.2


def test_exit_kills_the_process_at_once_with_status_137() -> None:
    code = (
        "from txstore.core.failpoints import FailPoints\n"
        "FailPoints.from_env().hit('between-batches')\n"
        "print('survived')\n"
    )
    env = {**os.environ, "TXSTORE_FAILPOINTS": "between-batches:exit"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_STATUS
    assert "survived" not in result.stdout
    assert "txstore fail point between-batches: exit (attempt 0)" in result.stderr


def test_nothing_fires_after_the_until_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXSTORE_FAILPOINTS", "before-commit")
    monkeypatch.setenv("TXSTORE_FAILPOINTS_UNTIL", str(time.time() + 60))
    active = FailPoints.from_env()
    with pytest.raises(InjectedFailure):
        active.hit("before-commit")
    monkeypatch.setenv("TXSTORE_FAILPOINTS_UNTIL", str(time.time() - 1))
    FailPoints.from_env().hit("before-commit")
    monkeypatch.setenv("TXSTORE_FAILPOINTS_UNTIL", "soon")
    with pytest.raises(ValueError, match="TXSTORE_FAILPOINTS_UNTIL: expected epoch seconds, got 'soon'"):
        FailPoints.from_env()
