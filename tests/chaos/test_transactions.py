"""The aborted-transactions kind's bookkeeping (tests/chaos/transactions.py), without a broker."""

from __future__ import annotations

import random
import threading

from tests.chaos.transactions import TransactionalTraffic


def _traffic() -> TransactionalTraffic:
    traffic = TransactionalTraffic("127.0.0.1:1", "t", 2, 3, random.Random(1), threading.Event(), print)
    traffic.committed[0] = {0: b"k0", 1: b"k1"}
    traffic.aborted[0] = {2: b"k0"}  # offset 3: the abort's control marker
    traffic.committed[1] = {5: b"k2"}
    traffic.uncertain[1] = {7: b"k1", 8: b"k1"}
    return traffic


def test_committed_messages_and_the_uncertain_ones_kafka_shows_are_expected() -> None:
    visible = {0: {0: b"k0", 1: b"k1", 4: b"plain"}, 1: {5: b"k2", 7: b"k1"}}
    assert _traffic().judge(visible) == (4, [])


def test_an_aborted_message_readable_or_a_committed_one_missing_is_a_failure() -> None:
    visible = {0: {0: b"k0", 2: b"k0"}, 1: {}}
    expected, failures = _traffic().judge(visible)
    assert expected == 3
    assert failures == [
        "2 messages of committed transactions not readable, e.g. [(0, 1), (1, 5)]",
        "1 messages of aborted transactions readable, e.g. [(0, 2)]",
    ]
