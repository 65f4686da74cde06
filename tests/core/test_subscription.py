"""A job's subscription (txstore.core.subscription, ``txn_subscriptions``): which partitions
``txstore status`` judges as the job's; pure functions, and the record on real PostgreSQL."""

from __future__ import annotations

import re
from dataclasses import FrozenInstanceError

import psycopg
import pytest

from txstore.core.patterns import resolve_pattern
from txstore.core.ranges import PartitionWatermarks
from txstore.core.subscription import (
    Subscription,
    SubscriptionUnreadable,
    subscription_from_json,
    subscription_json,
    subscription_of,
)
from txstore.ops.status import not_started
from txstore.postgres import store


def test_each_way_of_naming_partitions_holds_exactly_its_partitions() -> None:
    topics = subscription_of(("b", "a", "a"), None, None)
    assert topics == Subscription("topics", ("a", "b"))
    assert topics.holds("a", 7) and topics.holds("b", 0) and not topics.holds("ab", 0)
    pattern = subscription_of((), r"orders-\d+", None)
    assert pattern.holds("orders-12", 3) and not pattern.holds("orders-12x", 0)
    assert not pattern.holds("xorders-1", 0) and not Subscription("pattern", pattern=".*").holds(
        "__consumer_offsets", 0
    )
    assign = subscription_of(("t", "u"), None, {"u": (2,), "t": (3, 0)})
    assert assign.assignment == (("t", (0, 3)), ("u", (2,))) and assign.topics == ("t", "u")
    assert [p for p in range(5) if assign.holds("t", p)] == [0, 3]
    assert not assign.holds("u", 0) and assign.holds("u", 2) and not assign.holds("v", 2)


def test_a_subscription_and_a_pattern_s_topics_are_frozen_values() -> None:
    sub = subscription_of(("t",), None, {"t": (0,)})
    with pytest.raises(FrozenInstanceError):
        sub.kind = "topics"  # type: ignore[misc]
    assert {sub, subscription_of(("t",), None, {"t": (0,)})} == {sub}  # hashable: equal values are one
    resolved = resolve_pattern(re.compile("t.*"), ["t1"], [])
    with pytest.raises(FrozenInstanceError):
        resolved.matched = ()  # type: ignore[misc]
    assert hash(resolved) == hash(resolve_pattern(re.compile("t.*"), ["t1"], []))


def test_the_stored_form_reads_back_as_written_and_anything_else_is_refused() -> None:
    for sub in (
        subscription_of(("a",), None, None),
        subscription_of((), "x.*", None),
        subscription_of(("t",), None, {"t": (1, 0)}),
    ):
        assert subscription_from_json(subscription_json(sub)) == sub
    assert subscription_json(subscription_of(("t",), None, {"t": (1, 0)})) == {"assign": {"t": [0, 1]}}
    for stored in (
        {},
        {"pattern": "("},
        {"pattern": 3},
        {"topics": "t"},
        {"topics": ["t"], "pattern": "t"},
        {"assign": {"t": [True]}},
        {"assign": {"t": ["0"]}},
        {"assign": {"t": [0, "1"]}},
        {"assign": {"t": [0], "u": "1"}},
        {"topics": ["t", 1]},
        {"assign": [0]},
        {"queue": "t"},
        None,
    ):
        with pytest.raises(SubscriptionUnreadable):
            subscription_from_json(stored)


def marks(topic: str, *partitions: int) -> dict[tuple[str, int], PartitionWatermarks]:
    return {(topic, p): PartitionWatermarks(topic, p, 0, 10) for p in partitions}


def test_status_counts_as_not_started_only_the_partitions_a_job_holds() -> None:
    kafka = {**marks("t", 0, 1, 2, 3), **marks("orders-2", 0), **marks("other", 0)}
    stored = [("left", "t", 0), ("right", "t", 1), ("old", "t", 2), ("p", "t", 0)]
    subs = {
        "left": subscription_of(("t",), None, {"t": (0, 2)}),
        "right": subscription_of(("t",), None, {"t": (1, 3)}),
        "p": subscription_of((), "orders-.*|t", None),
    }
    found = [(j, w.topic, w.partition) for j, w in not_started(stored, kafka, subs, {"p": ["orders-2", "t"]})]
    assert found == [
        ("left", "t", 2),  # assigned, not started yet
        # no record (an older txstore ran it): every partition of its stored topics is its own
        ("old", "t", 0),
        ("old", "t", 1),
        ("old", "t", 3),
        ("p", "orders-2", 0),  # matched while the job was down: it starts there
        ("p", "t", 1),
        ("p", "t", 2),
        ("p", "t", 3),
        ("right", "t", 3),
    ]
    assert not_started(stored, kafka) == not_started(stored, kafka, {}, {})


def test_a_job_s_subscription_is_recorded_once_and_again_only_when_it_changes(db: psycopg.Connection) -> None:
    def row() -> tuple[object, object]:
        found = db.execute(
            "SELECT subscription, updated_at FROM txn_subscriptions WHERE job = 'j'"
        ).fetchone()
        assert found is not None
        return found[0], found[1]

    assert store.subscriptions(db) == {}
    store.record_subscription(db, "j", subscription_of(("t",), None, {"t": (0,)}))
    first = row()
    assert first[0] == {"assign": {"t": [0]}}
    db.execute("SELECT pg_sleep(0.01)")
    store.record_subscription(db, "j", subscription_of(("t",), None, {"t": (0,)}))
    assert row() == first  # unchanged: not written again
    store.record_subscription(db, "j", subscription_of(("t",), None, None))
    changed = row()
    assert changed[0] == {"topics": ["t"]} and changed[1] != first[1]
    store.record_subscription(db, "k", subscription_of((), "x.*", None))
    db.execute("""INSERT INTO txn_subscriptions (job, subscription) VALUES ('bad', '{"queue": 1}')""")
    assert store.subscriptions(db) == {
        "j": Subscription("topics", ("t",)),
        "k": Subscription("pattern", pattern="x.*"),
    }
    assert store.subscriptions(db, "k") == {"k": Subscription("pattern", pattern="x.*")}
