"""What the event fault kinds add to a trial's plan (no servers)."""

from __future__ import annotations

from tests.chaos.events import PUBLISH_MAX_BYTES
from tests.chaos.runner import FAULT_KINDS, OPT_IN_FAULT_KINDS, TrialPlan

SEEDS = range(4000, 4060)


def test_a_poison_message_trial_counts_per_window_and_some_of_them_skip_bad_messages() -> None:
    plans = [TrialPlan.generate(s, ("poison-message",)) for s in SEEDS]
    assert all(p.job_args[:2] == ("--window", "1m") for p in plans)
    skipping = [p for p in plans if p.job_args[2:4] == ("--on-bad-message", "skip")]
    assert 0 < len(skipping) < len(plans)


def test_an_oversized_publish_trial_publishes_per_key_in_small_parts_over_many_keys() -> None:
    for seed in SEEDS:
        plan = TrialPlan.generate(seed, ("oversized-publish",), job_args=("--by", "key"))
        assert plan.job_args == ("--by", "key", "--publish-max-bytes", str(PUBLISH_MAX_BYTES))
        assert 150 <= plan.keys <= 400
        assert plan.counts_per_key


def test_a_recreated_topic_and_a_poison_message_are_never_planned_together() -> None:
    plan = TrialPlan.generate(1, ("topic-recreated", "poison-message", "kafka-down"))
    assert plan.faults == ("topic-recreated", "kafka-down")
    assert len(plan.fault_times) == 2
    rotation = [TrialPlan.generate(s).faults for s in range(0, 400)]
    assert not [f for f in rotation if {"topic-recreated", "poison-message"} <= set(f)]
    assert {k for f in rotation for k in f} == set(FAULT_KINDS)
    assert OPT_IN_FAULT_KINDS == ()
