"""An idle job's plans (txstore.core.idle): when the next plan is the last one's, nothing to read."""

from __future__ import annotations

from txstore.core.idle import idle_plan, still_idle
from txstore.core.ranges import OffsetRange, PartitionWatermarks

ROWS = [("t", 0, 5, 0, "id", 4, 1, "d"), ("t", 1, 7, 0, "id", 6, 1, "d")]
MARKS = [PartitionWatermarks("t", 0, 0, 5), PartitionWatermarks("t", 1, 2, 7)]
COMMITTED = {("t", 0): 5, ("t", 1): 7}


def test_a_plan_is_kept_as_idle_only_when_every_partition_is_at_its_committed_end() -> None:
    kept = idle_plan(("t",), ROWS, COMMITTED, MARKS, [], {"t": 100.0}, 101.0, 5.0)
    assert kept is not None and kept.ends == COMMITTED and kept.rows == tuple(ROWS)
    behind = {("t", 0): 5, ("t", 1): 6}
    assert idle_plan(("t",), ROWS, behind, MARKS, [], {}, 101.0, 5.0) is None
    unstarted = {("t", 0): 5}  # partition 1 has no row yet: it is to be started
    assert idle_plan(("t",), ROWS, unstarted, MARKS, [], {}, 101.0, 5.0) is None
    planned = [OffsetRange("t", 1, 6, 7)]
    assert idle_plan(("t",), ROWS, COMMITTED, MARKS, planned, {}, 101.0, 5.0) is None
    assert idle_plan(("t",), [], {}, [], [], {}, 101.0, 5.0) is None  # nothing reported: no plan kept


def test_an_idle_plan_is_due_again_when_its_first_topic_id_is() -> None:
    marks = [*MARKS, PartitionWatermarks("u", 0, 0, 3)]
    committed = {**COMMITTED, ("u", 0): 3}
    kept = idle_plan(("t", "u"), ROWS, committed, marks, [], {"t": 100.0, "u": 98.0}, 101.0, 5.0)
    assert kept is not None and kept.until == 103.0
    never = idle_plan(("t", "u"), ROWS, committed, marks, [], {"t": 100.0}, 101.0, 5.0)
    assert never is not None and never.until == 100.0 + 5.0  # "u" never asked counts as now: "t" is due first
    unasked = idle_plan(("t",), ROWS, COMMITTED, MARKS, [], {}, 101.0, 5.0)
    assert unasked is not None and unasked.until == 106.0


def test_the_next_plan_is_the_idle_one_only_with_the_same_rows_and_ends_before_it_is_due() -> None:
    kept = idle_plan(("t",), ROWS, COMMITTED, MARKS, [], {}, 100.0, 5.0)
    assert kept is not None
    assert still_idle(kept, list(ROWS), dict(COMMITTED), 104.9)
    assert not still_idle(kept, ROWS, COMMITTED, 105.0)  # due: a full plan
    assert not still_idle(kept, ROWS, {("t", 0): 5, ("t", 1): 8}, 101.0)  # a new message
    assert not still_idle(kept, ROWS, {("t", 0): 5}, 101.0)  # a partition not answered
    assert not still_idle(kept, ROWS, None, 101.0)  # the log ends not known
    moved = [ROWS[0], ("t", 1, 7, 1, "id", None, None, None)]  # the same offset, a new generation
    assert not still_idle(kept, moved, COMMITTED, 101.0)
    assert not still_idle(kept, ROWS[:1], COMMITTED, 101.0)  # a row forgotten
