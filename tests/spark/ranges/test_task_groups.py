"""Many partitions: ranges share Spark tasks, and still commit (and retry) one by one."""

from __future__ import annotations

import pytest

from tests.helpers.counting import Counting
from txstore.core.ranges import OffsetRange, group_ranges
from txstore.spark.ranges.range_task import ALREADY_COMMITTED, COMMITTED
from txstore.spark.ranges.tasks import TASKS_PER_CORE, task_groups


def ranges(*sizes: int) -> list[OffsetRange]:
    return [OffsetRange("t", p, 100, 100 + size) for p, size in enumerate(sizes)]


def test_a_few_ranges_per_core_get_a_task_each() -> None:
    planned = ranges(*[5, 500] * TASKS_PER_CORE)
    assert task_groups(planned, 2) == [[r] for r in planned]


def test_more_ranges_are_cut_in_order_into_one_equal_run_per_core() -> None:
    planned = ranges(*[10] * 64)
    groups = task_groups(planned, 4)
    assert [len(g) for g in groups] == [16, 16, 16, 16]
    assert [r for g in groups for r in g] == planned


def test_a_large_range_gets_a_task_of_its_own() -> None:
    planned = ranges(10, 10, 10, 10, 1_000_000, 10, 10, 10, 10, 10)
    groups = task_groups(planned, 3)
    assert len(groups) == 3
    assert [planned[4]] in groups
    assert [r for g in groups for r in g] == planned


def test_a_run_ends_once_the_work_so_far_with_half_the_next_range_passes_its_share() -> None:
    """The rule of ``group_ranges``, worked by hand. Work is size + 1,000 (a range's fixed cost):
    3,000 1,500 1,000 3,000 2,000, 10,500 in all, a share of 3,500 for 3 runs. The second range
    starts run 2 (3,000 + 750 > 3,500); the fourth does not start run 3, as 5,500 + 1,500 is
    7,000, equal to two shares, not past them; the fifth does (8,500 + 1,000 > 7,000)."""
    planned = ranges(2_000, 500, 0, 2_000, 1_000)
    assert group_ranges(planned, 3) == [planned[:1], planned[1:4], planned[4:]]


def test_one_run_holds_every_range_and_no_run_is_refused() -> None:
    planned = ranges(5, 0, 70)
    assert group_ranges(planned, 1) == [planned]
    for groups in (0, -1):
        with pytest.raises(ValueError, match=f"^groups must be at least 1, got {groups}$"):
            group_ranges(planned, groups)


@pytest.mark.spark
def test_a_batch_over_many_partitions_counts_each_range_exactly_once(counting: Counting) -> None:
    partitions = 5 * TASKS_PER_CORE * counting.spark.sparkContext.defaultParallelism
    topic = counting.new_topic(partitions)
    counts = {p: p + 1 for p in range(partitions)}
    counting.produce(topic, counts)
    report = counting.job(topic).run_batch()
    assert [r.range.partition for r in report.ranges] == list(range(partitions))
    assert all(r.outcome == COMMITTED for r in report.ranges)
    counting.assert_counted_exactly(topic, sum(counts.values()))


@pytest.mark.spark
def test_a_task_of_many_ranges_commits_them_in_one_transaction_that_a_retry_recognises(
    counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    partitions = 3 * TASKS_PER_CORE * counting.spark.sparkContext.defaultParallelism
    topic = counting.new_topic(partitions)
    counting.produce(topic, dict.fromkeys(range(partitions), 7))
    # Every first attempt dies right after its one COMMIT of all its ranges: the retry
    # finds every one of them committed and adds nothing.
    monkeypatch.setenv("TXSTORE_FAILPOINTS", "after-commit@first")
    report = counting.job(topic).run_batch()
    assert len(report.ranges) == partitions
    assert {r.outcome for r in report.ranges} == {ALREADY_COMMITTED}
    counting.assert_counted_exactly(topic, 7 * partitions)
