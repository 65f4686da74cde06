"""The pure core of exactly-once, decisions from frozen values, in milliseconds: conflict
classification, planning bounds, fingerprints, exact sums, finding bad messages, topic IDs.
No servers; these are the first tests ``./dev mutate`` runs against each mutant."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import struct
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from txstore.core.errors import (
    AlreadyCommitted,
    CommitConflict,
    DataLoss,
    KafkaReadError,
    OffsetGap,
    OffsetOutOfLog,
    OffsetOverlap,
    TopicRecreated,
)
from txstore.core.fingerprint import Fingerprint, digest, fingerprint
from txstore.core.ranges import OffsetRange, PartitionHistory, PartitionWatermarks, aged_out, plan_ranges
from txstore.core.results import (
    TOPIC_TOTAL,
    ResultKey,
    add_metrics,
    by_key,
    by_key_and_window,
    by_window,
    decode_key,
    encode_key,
    exact_decimal,
    metric_text,
    row_order,
)
from txstore.kafka import topic_ids as topic_ids_module
from txstore.kafka.bad_messages import BadOffset, describe_skipped, is_message_failure, isolate, reason_of
from txstore.kafka.topic_ids import TopicIds, fetch_topic_ids
from txstore.postgres.sink import (
    bad_message_params,
    classify_batch_conflict,
    classify_conflict,
    move_offsets_params,
    outbox_identity,
    require_transactions,
)

R = OffsetRange("t", 0, 10, 20)


def marks(partition: int, low: int, high: int, topic: str = "t") -> PartitionWatermarks:
    return PartitionWatermarks(topic, partition, low, high)


# Conflict classification: why the conditional update matched no row.


@pytest.mark.parametrize(
    ("stored", "kind"),
    [
        (20, AlreadyCommitted),  # at until: committed before
        (9, OffsetGap),  # below from: committing would skip 9
        (0, OffsetGap),
        (10, OffsetOverlap),  # at from, yet refused: another generation
        (15, OffsetOverlap),  # inside the range
        (19, OffsetOverlap),
        (21, OffsetOverlap),  # past it
        (None, OffsetOverlap),  # no row
    ],
)
def test_a_refused_range_is_classified_from_the_stored_offset(stored: int | None, kind: type) -> None:
    conflict = classify_conflict("j", R, stored)
    assert type(conflict) is kind
    assert (conflict.offset_range, conflict.stored_offset, conflict.job) == (R, stored, "j")


def test_an_empty_range_at_its_stored_offset_is_already_committed() -> None:
    assert type(classify_conflict("j", OffsetRange("t", 0, 5, 5), 5)) is AlreadyCommitted


A = OffsetRange("t", 0, 0, 10)
B = OffsetRange("t", 1, 5, 8)
C = OffsetRange("u", 0, 2, 4)


def batch(stored: Mapping[tuple[str, int], int | None]) -> CommitConflict:
    return classify_batch_conflict("j", [A, B, C], stored)


def test_a_batch_whose_every_range_is_at_its_end_was_committed_before() -> None:
    conflict = batch({A.key: 10, B.key: 8, C.key: 4})
    assert type(conflict) is AlreadyCommitted and conflict.offset_range == A


def test_a_batch_committed_in_part_by_another_writer_is_an_overlap_on_the_committed_range() -> None:
    conflict = batch({A.key: 0, B.key: 8, C.key: 2})
    assert type(conflict) is OffsetOverlap
    assert (conflict.offset_range, conflict.stored_offset) == (B, 8)


def test_a_batch_with_a_gap_names_the_gap_even_after_a_committed_range() -> None:
    conflict = batch({A.key: 10, B.key: 8, C.key: 1})
    assert type(conflict) is OffsetGap and conflict.offset_range == C


def test_a_batch_names_its_first_conflict_that_is_not_already_committed() -> None:
    conflict = batch({A.key: 10, B.key: 6, C.key: 1})
    assert type(conflict) is OffsetOverlap and conflict.offset_range == B


def test_a_batch_with_a_missing_row_is_an_overlap() -> None:
    conflict = batch({A.key: 0, B.key: 5})
    assert type(conflict) is OffsetOverlap and (conflict.offset_range, conflict.stored_offset) == (C, None)


def test_a_batch_refused_with_every_offset_at_its_start_is_an_overlap_in_another_generation() -> None:
    conflict = batch({A.key: 0, B.key: 5, C.key: 2})
    assert type(conflict) is OffsetOverlap
    assert (conflict.offset_range, conflict.stored_offset) == (A, 0)


# What the conditional update is given.


def test_the_offset_moves_carry_every_range_and_the_fingerprint_of_its_last_message() -> None:
    last = Fingerprint(9, 1_000, "d")
    ranges = [OffsetRange("t", 0, 0, 10, None, 2, 12), OffsetRange("u", 3, 4, 6)]
    params = move_offsets_params("j", ranges, {("t", 0): last})
    assert params == {
        "job": "j",
        "r_topics": ["t", "u"],
        "r_parts": [0, 3],
        "r_froms": [0, 4],
        "r_untils": [10, 6],
        "r_gens": [2, 0],
        "r_log_ends": [12, None],
        "r_last_offs": [9, None],
        "r_last_tss": [1_000, None],
        "r_last_digests": ["d", None],
    }
    assert move_offsets_params("j", ranges)["r_last_offs"] == [None, None]


def test_bad_messages_are_recorded_with_their_partition_offset_and_reason() -> None:
    bad = [BadOffset("t", 1, 7, "ValueError: x"), BadOffset("u", 0, 2, "E: y")]
    assert bad_message_params("j", bad) == {
        "job": "j",
        "b_topics": ["t", "u"],
        "b_parts": [1, 0],
        "b_offs": [7, 2],
        "b_reasons": ["ValueError: x", "E: y"],
    }


class _Conn:
    def __init__(self, autocommit: bool) -> None:
        self.autocommit = autocommit


def test_only_a_connection_with_autocommit_off_may_commit_results() -> None:
    with pytest.raises(ValueError, match="TransactionalSink needs a connection with autocommit off"):
        require_transactions(_Conn(True), "TransactionalSink")  # type: ignore[arg-type]
    require_transactions(_Conn(False), "TransactionalSink")  # type: ignore[arg-type]


def test_an_outbox_identity_names_one_range_or_a_batch_in_any_order() -> None:
    key, headers = outbox_identity("j", [OffsetRange("t", 2, 0, 5)], "c1")
    assert key == "j/t/2/5/c1"
    assert headers == {
        "txstore-job": "j",
        "txstore-commit": "c1",
        "txstore-topic": "t",
        "txstore-partition": "2",
        "txstore-until": "5",
    }
    ranges = [OffsetRange("t", 1, 0, 5), OffsetRange("a", 0, 3, 9)]
    key, headers = outbox_identity("j", ranges, "c")
    assert key == "j/batch/e4a1ee469dddfc23d04c3ba3e99d02f8/c"
    assert headers == {"txstore-job": "j", "txstore-commit": "c", "txstore-offsets": "a/0/9,t/1/5"}
    assert outbox_identity("j", ranges[::-1], "c") == (key, headers)
    assert outbox_identity("j", [ranges[0], OffsetRange("a", 0, 3, 10)], "c")[0] != key


# Ranges and planning.


def test_a_range_is_refused_backwards_or_below_zero_and_may_be_empty() -> None:
    for a, b in [(5, 4), (-1, 3), (-2, -1)]:
        with pytest.raises(ValueError, match=f"invalid offset range for 't' partition 0: {a} -> {b}"):
            OffsetRange("t", 0, a, b)
    empty = OffsetRange("t", 0, 0, 0)
    assert (empty.size, empty.key) == (0, ("t", 0))
    assert OffsetRange("t", 3, 4, 9).size == 5 and OffsetRange("t", 3, 4, 9).key == ("t", 3)
    assert str(OffsetRange("t", 3, 4, 9)) == "t/3 4 -> 9"


def test_ranges_compare_and_sort_by_topic_partition_and_offsets_only() -> None:
    last = Fingerprint(3, 1, "d")
    assert OffsetRange("t", 0, 4, 9, last, 2, 12) == OffsetRange("t", 0, 4, 9)
    assert hash(OffsetRange("t", 0, 4, 9, last, 2, 12)) == hash(OffsetRange("t", 0, 4, 9))
    assert sorted([OffsetRange("t", 1, 0, 1), OffsetRange("t", 0, 5, 6), OffsetRange("a", 9, 0, 1)]) == [
        OffsetRange("a", 9, 0, 1),
        OffsetRange("t", 0, 5, 6),
        OffsetRange("t", 1, 0, 1),
    ]
    assert PartitionHistory() == PartitionHistory(0, None, None)


def test_planned_values_cannot_change_once_made() -> None:
    """A range, the history it was planned from and the fingerprint it verifies are frozen
    (a task retried or speculated reads exactly what was planned) and hashable."""
    last = Fingerprint(3, 1, "d")
    for value, attribute in [
        (last, "offset"),
        (PartitionHistory(1, "A", last), "generation"),
        (OffsetRange("t", 0, 4, 9, last), "until_offset"),
    ]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, attribute, 5)
        assert hash(value) == hash(copy.copy(value))


def test_a_partition_at_its_log_start_or_end_is_planned_exactly() -> None:
    assert plan_ranges("j", {("t", 0): 5}, [marks(0, 5, 9)]) == [OffsetRange("t", 0, 5, 9)]
    assert plan_ranges("j", {("t", 0): 9}, [marks(0, 5, 9)]) == []
    ranges = plan_ranges("j", {("t", 0): 5, ("t", 1): 0}, [marks(1, 0, 1), marks(0, 0, 6)])
    assert ranges == [OffsetRange("t", 0, 5, 6), OffsetRange("t", 1, 0, 1)]
    assert [(r.log_end, r.generation, r.verify) for r in ranges] == [(6, 0, None), (1, 0, None)]


def test_a_partition_one_below_its_log_start_or_one_above_its_end_is_refused() -> None:
    with pytest.raises(
        DataLoss, match="stored offset 4 is below the log-start offset 5; 1 messages aged out"
    ):
        plan_ranges("j", {("t", 0): 4}, [marks(0, 5, 9)])
    with pytest.raises(OffsetOutOfLog, match="stored offset 10 is beyond the log-end offset 9"):
        plan_ranges("j", {("t", 0): 10}, [marks(0, 5, 9)])
    with pytest.raises(KeyError, match="no committed or starting offset for 't' partition 1"):
        plan_ranges("j", {("t", 0): 5}, [marks(0, 5, 9), marks(1, 0, 3)])
    with pytest.raises(
        OffsetOutOfLog, match="partition 1: stored offset 3 but Kafka no longer has this partition"
    ):
        plan_ranges("j", {("t", 0): 5, ("t", 1): 3}, [marks(0, 5, 9)])


@pytest.mark.parametrize(
    ("last_offset", "verified"),
    [(5, True), (9, True), (4, False), (10, False), (11, False)],
)
def test_the_last_counted_message_is_verified_only_between_the_log_start_and_the_stored_offset(
    last_offset: int, verified: bool
) -> None:
    last = Fingerprint(last_offset, 1, "d")
    history = {("t", 0): PartitionHistory(3, None, last)}
    (planned,) = plan_ranges("j", {("t", 0): 10}, [marks(0, 5, 20)], history)
    assert planned.verify == (last if verified else None)
    assert planned.generation == 3


def test_a_topic_id_is_compared_only_where_both_are_known() -> None:
    history = {("t", 0): PartitionHistory(0, "A", None)}
    assert plan_ranges("j", {("t", 0): 1}, [marks(0, 0, 2)], history, {"t": "A"}) == [
        OffsetRange("t", 0, 1, 2)
    ]
    assert plan_ranges("j", {("t", 0): 1}, [marks(0, 0, 2)], {}, {"t": "B"}) == [OffsetRange("t", 0, 1, 2)]
    with pytest.raises(TopicRecreated, match="stored topic ID A; found topic ID B"):
        plan_ranges("j", {("t", 0): 1}, [marks(0, 0, 2)], history, {"t": "B"})
    with pytest.raises(TopicRecreated):  # even with nothing new to read
        plan_ranges("j", {("t", 0): 2}, [marks(0, 0, 2)], history, {"t": "B"})


def test_aged_out_offsets_are_exactly_those_below_the_log_start() -> None:
    committed = {("t", 0): 4, ("t", 1): 5, ("t", 2): 6}
    assert aged_out(committed, [marks(2, 5, 9), marks(1, 5, 9), marks(0, 5, 9), marks(3, 5, 9)]) == [
        OffsetRange("t", 0, 4, 5)
    ]


# Fingerprints.


def test_a_message_digest_is_blake2b_of_length_prefixed_key_and_value() -> None:
    """Stored fingerprints are compared across versions: the digest is fixed, byte for byte."""
    expected = hashlib.blake2b(digest_size=16)
    for part in (b"k", b"value"):
        expected.update(struct.pack(">q", len(part)) + part)
    assert digest(b"k", b"value") == expected.hexdigest()
    none = hashlib.blake2b(struct.pack(">q", -1) * 2, digest_size=16).hexdigest()
    assert digest(None, None) == none
    assert digest(b"k", b"v") == "2094fc14099002c1f0517bb8d9456e83"
    assert len({digest(None, b""), digest(b"", None), digest(b"", b""), digest(None, None)}) == 4


def test_a_fingerprint_holds_the_offset_the_timestamp_if_any_and_the_digest() -> None:
    m = Message(topic="t", partition=0, offset=7, key=b"k", value=b"v", timestamp=(1, 1_234))
    assert fingerprint(m) == Fingerprint(7, 1_234, digest(b"k", b"v"))
    no_ts = Message(topic="t", partition=0, offset=8, key=None, value=b"v", timestamp=(0, -1))
    assert fingerprint(no_ts) == Fingerprint(8, None, digest(None, b"v"))
    assert Fingerprint(8, None, "d").describe() == "offset 8, timestamp none, digest d"
    assert Fingerprint(8, 0, "d").describe() == "offset 8, timestamp 0, digest d"
    assert Fingerprint(1, 2, "d") != Fingerprint(1, 2, "e") and Fingerprint(1, 2, "d") == Fingerprint(
        1, 2, "d"
    )


# Exact sums.


def test_a_delta_is_exact_decimal_text_and_nothing_else_is_a_delta() -> None:
    assert metric_text(3) == "3" and metric_text(-3) == "-3"
    assert metric_text(0.1) == "0.1" and metric_text(1e-7) == "1e-07"
    assert (
        metric_text(Decimal("12345678901234567890.123456789012345")) == "12345678901234567890.123456789012345"
    )
    for bad in (True, False, "1", None, [1]):
        with pytest.raises(TypeError, match="a result delta must be a number"):
            metric_text(bad)  # type: ignore[arg-type]
    for bad in (math.inf, -math.inf, math.nan, Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")):
        with pytest.raises(ValueError, match="a result delta must be finite"):
            metric_text(bad)


def test_deltas_add_without_rounding_and_ints_stay_ints() -> None:
    assert add_metrics(2, 3) == 5 and type(add_metrics(2, 3)) is int
    assert add_metrics(0.1, 0.2) == Decimal("0.3")
    assert add_metrics(1, 0.5) == Decimal("1.5") and type(add_metrics(1, 0.5)) is Decimal
    big = Decimal("1" * 40 + ".5")
    assert add_metrics(0, big) == big
    assert add_metrics(big, big) == Decimal("2" * 39 + "3.0")
    assert add_metrics(Decimal("1e-30"), 10**30) == Decimal("1" + "0" * 30 + "." + "0" * 29 + "1")
    assert add_metrics(True, 1) == Decimal(2)  # a bool is no int here: it goes the exact way
    assert exact_decimal(0.1) == Decimal("0.1") and exact_decimal(7) == Decimal(7)
    d = Decimal("1.10")
    assert exact_decimal(d) is d
    assert add_metrics(Decimal("9" * 60), 1) == Decimal("1" + "0" * 60)


def test_result_rows_sort_with_nulls_first_within_topic_and_grain() -> None:
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    later = datetime(2026, 1, 2, tzinfo=timezone.utc)
    rows: list[tuple[str, ResultKey]] = [
        ("t", by_window(later)),
        ("t", by_key_and_window("a", later)),
        ("t", by_key("a")),
        ("t", by_key_and_window("a", when)),
        ("t", by_key("b")),
        ("t", by_key("")),
        ("t", by_key(None)),
        ("t", by_window(when)),
        ("t", by_window(None)),
        ("s", TOPIC_TOTAL),
        ("t", TOPIC_TOTAL),
        ("t", by_key_and_window("a", None)),
        ("t", by_key_and_window(None, when)),
        ("t", by_key("c")),
    ]
    assert sorted(rows, key=row_order) == [
        ("s", TOPIC_TOTAL),
        ("t", by_key(None)),
        ("t", by_key("")),
        ("t", by_key("a")),
        ("t", by_key("b")),
        ("t", by_key("c")),
        ("t", by_key_and_window(None, when)),
        ("t", by_key_and_window("a", None)),
        ("t", by_key_and_window("a", when)),
        ("t", by_key_and_window("a", later)),
        ("t", TOPIC_TOTAL),
        ("t", by_window(None)),
        ("t", by_window(when)),
        ("t", by_window(later)),
    ]


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"plain", "plain"),
        (b"a\\b", "a\\\\b"),
        (b"\xff", "\\xff"),
        (b"\\xff", "\\\\xff"),
        (b"nul\x00", "nul\\x00"),
        (b"", ""),
        ("é".encode(), "é"),
        (b"a\\b\xffc\\", "a\\\\b\\xffc\\\\"),
    ],
)
def test_every_kafka_key_is_stored_under_its_own_text_and_back(raw: bytes, text: str) -> None:
    assert decode_key(raw) == text
    assert encode_key(text) == raw
    assert decode_key(None) is None


# Bad messages: the deltas of the good ones, exactly, and each bad one.


def _messages(offsets: Iterable[int]) -> list[Message]:
    return [Message(topic="t", partition=0, offset=o, key=None, value=b"%d" % o) for o in offsets]


def _count_unless(bad: set[int]) -> Any:
    def aggregate(r: OffsetRange, batches: Iterable[list[Message]]) -> Mapping[ResultKey, int]:
        n = 0
        for b in batches:
            for m in b:
                if m.offset() in bad:
                    raise ValueError(f"bad {m.offset()}")
                assert r.from_offset <= (m.offset() or 0) < r.until_offset
                n += 1
        return {TOPIC_TOTAL: n}

    return aggregate


@pytest.mark.parametrize("bad", [set(), {0}, {6}, {3}, {1, 2}, {0, 6}, {1, 4, 5}, {0, 1, 2, 3, 4, 5, 6}])
def test_isolating_bad_messages_counts_every_good_one_and_names_every_bad_one(bad: set[int]) -> None:
    batches = [_messages([0, 1, 2]), [], _messages([3, 4, 5, 6])]
    found = isolate(_count_unless(bad), OffsetRange("t", 0, 0, 7), batches, first_only=False)
    assert found.messages == 7
    assert found.deltas == ({TOPIC_TOTAL: 7 - len(bad)} if len(bad) < 7 else {})
    assert [b.offset for b in found.bad] == sorted(bad)
    assert all(b.reason == f"ValueError: bad {b.offset}" for b in found.bad)
    first = isolate(_count_unless(bad), OffsetRange("t", 0, 0, 7), batches, first_only=True)
    assert [b.offset for b in first.bad] == sorted(bad)[:1]


def test_each_piece_of_a_bisected_range_is_exactly_the_offsets_of_its_messages() -> None:
    """An aggregate may use the range it is given (here: offsets spanned, as a count)."""

    wrong: list[tuple[OffsetRange, list[int]]] = []

    def spanned(r: OffsetRange, batches: Iterable[list[Message]]) -> Mapping[ResultKey, int]:
        offsets = [m.offset() or 0 for b in batches for m in b]
        if (r.from_offset, r.until_offset) != (offsets[0], offsets[-1] + 1):
            wrong.append((r, offsets))
        if 4 in offsets:
            raise ValueError("bad 4")
        return {TOPIC_TOTAL: r.size}

    found = isolate(spanned, OffsetRange("t", 0, 0, 9), [_messages(range(9))], first_only=False)
    assert found.deltas == {TOPIC_TOTAL: 8} and [b.offset for b in found.bad] == [4]
    assert wrong == []


def test_failures_that_are_not_a_message_are_raised_not_isolated() -> None:
    def broken(r: OffsetRange, batches: Iterable[list[Message]]) -> Mapping[ResultKey, int]:
        raise KafkaReadError("broker gone")

    with pytest.raises(KafkaReadError):
        isolate(broken, OffsetRange("t", 0, 0, 3), [_messages([0, 1, 2])], first_only=False)
    assert is_message_failure(ValueError("x")) and is_message_failure(OverflowError("x"))
    assert not is_message_failure(KafkaReadError("x")) and not is_message_failure(KeyboardInterrupt())
    assert not is_message_failure(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert reason_of(ValueError("first\nsecond")) == "ValueError: first"
    assert (
        describe_skipped([BadOffset("t", 0, 3, "E: x")] * 7, 7, 2)
        == "offset 3 (E: x), offset 3 (E: x), and 5 more"
    )


# Topic IDs.


class _Future:
    def __init__(self, topic_id: str | None, error: Exception | None = None) -> None:
        self.topic_id, self.error = topic_id, error

    def result(self, timeout: float | None = None) -> Any:
        if self.error:
            raise self.error
        return type("Description", (), {"topic_id": self.topic_id})()


class _AdminClient:
    def __init__(
        self, ids: Mapping[str, str | None], controller: int = 1, fail: Exception | None = None
    ) -> None:
        self.ids, self.controller, self.fail, self.calls = ids, controller, fail, 0
        self.described = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.calls += 1
        if self.fail:
            raise self.fail
        return type("Metadata", (), {"controller_id": self.controller, "brokers": {1: object()}})()

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, _Future]:
        self.described += 1
        if self.fail:
            raise self.fail
        return {name: _Future(self.ids.get(name)) for name in topics.topic_names}


class _Admin:
    client: _AdminClient

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self.conf = conf


def _admin(monkeypatch: pytest.MonkeyPatch, client: _AdminClient) -> list[_Admin]:
    made: list[_Admin] = []

    def make(conf: Mapping[str, Any]) -> _Admin:
        admin = _Admin(conf)
        admin.client = client
        made.append(admin)
        return admin

    monkeypatch.setattr(topic_ids_module, "Admin", make)
    return made


def test_topic_ids_are_those_the_broker_reports_and_never_the_all_zero_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _admin(monkeypatch, _AdminClient({"a": "ID-A", "b": "AAAAAAAAAAAAAAAAAAAAAA", "c": ""}))
    assert fetch_topic_ids({}, ["a", "b", "c"]) == {"a": "ID-A"}
    assert fetch_topic_ids({}, []) == {}


def test_a_broker_that_names_no_controller_or_fails_gives_no_topic_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _admin(monkeypatch, _AdminClient({"a": "ID-A"}, controller=-1))
    assert fetch_topic_ids({}, ["a"]) == {}
    _admin(monkeypatch, _AdminClient({"a": "ID-A"}, fail=KafkaException(KafkaError(KafkaError._TIMED_OUT))))
    assert fetch_topic_ids({}, ["a"]) == {}


def test_a_job_asks_a_broker_without_topic_ids_once_and_one_that_answered_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    never = _AdminClient({"a": "ID-A"}, controller=-1)
    made = _admin(monkeypatch, never)
    ids = TopicIds()
    assert ids({"x": 1}, ["a"]) == {} and ids({"x": 1}, ["a"]) == {}
    assert never.calls == 1 and len(made) == 1

    answers = _AdminClient({"a": "ID-A"})
    made = _admin(monkeypatch, answers)
    ids = TopicIds()
    assert ids({"x": 1}, []) == {} and answers.calls == 0
    assert ids({"x": 1}, ["a"]) == {"a": "ID-A"}
    answers.fail = KafkaException(KafkaError(KafkaError._TIMED_OUT))
    assert ids({"x": 1}, ["a"]) == {}  # a passing failure
    answers.fail = None
    assert ids({"x": 1}, ["a"]) == {"a": "ID-A"}
    # the controller checked once (a metadata request per plan at 1,024 partitions: ~4 ms), then
    # DescribeTopics asked every time, the failed time too
    assert answers.calls == 1 and answers.described == 3 and len(made) == 1
    assert ids({"x": 2}, ["a"]) == {"a": "ID-A"} and len(made) == 2  # another configuration
    ids.close()
    assert ids({"x": 2}, ["a"]) == {"a": "ID-A"} and len(made) == 3
