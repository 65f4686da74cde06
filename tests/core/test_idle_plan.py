"""An idle job's plans (txstore.core.idle): when the next plan is the last one's, nothing to read."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from txstore.core.idle import IdlePlan, idle_plan, next_is_idle
from txstore.core.ranges import OffsetRange, PartitionWatermarks

ROWS = "731,732"  # the rows' version (txstore.postgres.store.rows_version): their xmins
MARKS = [PartitionWatermarks("t", 0, 0, 5), PartitionWatermarks("t", 1, 2, 7)]
COMMITTED = {("t", 0): 5, ("t", 1): 7}


def test_a_plan_is_kept_as_idle_only_when_every_partition_is_at_its_committed_end() -> None:
    kept = idle_plan(("t",), ROWS, COMMITTED, MARKS, [], {"t": 100.0}, 101.0, 5.0)
    assert kept is not None and kept.ends == COMMITTED and kept.rows == ROWS
    with pytest.raises(FrozenInstanceError):  # a kept plan is never changed, only replaced
        kept.until = 0.0  # type: ignore[misc]
    behind = {("t", 0): 5, ("t", 1): 6}
    assert idle_plan(("t",), ROWS, behind, MARKS, [], {}, 101.0, 5.0) is None
    unstarted = {("t", 0): 5}  # partition 1 has no row yet: it is to be started
    assert idle_plan(("t",), ROWS, unstarted, MARKS, [], {}, 101.0, 5.0) is None
    planned = [OffsetRange("t", 1, 6, 7)]
    assert idle_plan(("t",), ROWS, COMMITTED, MARKS, planned, {}, 101.0, 5.0) is None
    assert idle_plan(("t",), "", {}, [], [], {}, 101.0, 5.0) is None  # nothing reported: no plan kept


def test_an_idle_plan_is_due_again_when_its_first_topic_id_is() -> None:
    marks = [*MARKS, PartitionWatermarks("u", 0, 0, 3)]
    committed = {**COMMITTED, ("u", 0): 3}
    kept = idle_plan(("t", "u"), ROWS, committed, marks, [], {"t": 100.0, "u": 98.0}, 101.0, 5.0)
    assert kept is not None and kept.until == 103.0
    never = idle_plan(("t", "u"), ROWS, committed, marks, [], {"t": 100.0}, 101.0, 5.0)
    assert never is not None and never.until == 100.0 + 5.0  # "u" never asked counts as now: "t" is due first
    unasked = idle_plan(("t",), ROWS, COMMITTED, MARKS, [], {}, 101.0, 5.0)
    assert unasked is not None and unasked.until == 106.0


def idle_with(plan: IdlePlan, rows: Any, ends: Any, now: float) -> bool:
    """:func:`next_is_idle` with these rows and ends read at ``now``."""
    return next_is_idle(plan, lambda: rows, lambda: ends, lambda: now)


def test_the_next_plan_is_the_idle_one_only_with_the_same_rows_and_ends_before_it_is_due() -> None:
    kept = idle_plan(("t",), ROWS, COMMITTED, MARKS, [], {}, 100.0, 5.0)
    assert kept is not None
    assert idle_with(kept, ROWS, dict(COMMITTED), 104.9)
    assert not idle_with(kept, ROWS, COMMITTED, 105.0)  # due: a full plan
    assert not idle_with(kept, ROWS, {("t", 0): 5, ("t", 1): 8}, 101.0)  # a new message
    assert not idle_with(kept, ROWS, {("t", 0): 5}, 101.0)  # a partition not answered
    assert not idle_with(kept, ROWS, None, 101.0)  # the log ends not known
    rewritten = "731,840"  # partition 1's row written again (a new generation, the same offset)
    assert not idle_with(kept, rewritten, COMMITTED, 101.0)
    assert not idle_with(kept, "731", COMMITTED, 101.0)  # a row forgotten


def test_the_next_plan_reads_the_rows_before_the_log_ends_and_nothing_once_due() -> None:
    kept = idle_plan(("t",), ROWS, COMMITTED, MARKS, [], {}, 100.0, 5.0)
    assert kept is not None
    asked: list[str] = []

    def rows(changed: bool = False) -> str:
        asked.append("rows")
        return "731" if changed else ROWS

    def ends() -> dict[tuple[str, int], int]:
        asked.append("ends")
        return dict(COMMITTED)

    assert next_is_idle(kept, rows, ends, lambda: 101.0)
    assert asked == ["rows", "ends"]
    asked.clear()
    assert not next_is_idle(kept, lambda: rows(changed=True), ends, lambda: 101.0)
    assert asked == ["rows"]  # a row changed: Kafka is not asked
    asked.clear()
    assert not next_is_idle(kept, rows, ends, lambda: 105.0)
    assert asked == []  # due: nothing read, a full plan follows
    assert not next_is_idle(kept, rows, lambda: None, lambda: 101.0)  # the ends not known


def test_the_next_plan_is_not_the_idle_one_if_it_fell_due_while_the_log_ends_were_asked() -> None:
    kept = idle_plan(("t",), ROWS, COMMITTED, MARKS, [], {}, 100.0, 5.0)
    assert kept is not None
    readings = iter([104.0, 105.0])  # before the rows; once the ends answered (at the due time)
    assert not next_is_idle(kept, lambda: ROWS, lambda: COMMITTED, lambda: next(readings))
    just_before = iter([104.0, 104.999])
    assert next_is_idle(kept, lambda: ROWS, lambda: COMMITTED, lambda: next(just_before))
