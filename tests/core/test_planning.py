"""The pure core: planning, starting offsets, conflict classification. No servers."""

from __future__ import annotations

import pytest

from txstore.core.errors import (
    AlreadyCommitted,
    ConfigError,
    DataLoss,
    OffsetGap,
    OffsetOutOfLog,
    OffsetOverlap,
    TopicRecreated,
    UnknownTopic,
)
from txstore.core.failpoints import FailPoints, InjectedFailure
from txstore.core.fingerprint import Fingerprint, digest
from txstore.core.ranges import (
    OffsetRange,
    PartitionHistory,
    PartitionWatermarks,
    aged_out,
    limit_ranges,
    log_start_wanted,
    plan_ranges,
    recreated_topics,
    split_ranges,
    topic_ids_to_store,
    topic_ids_wanted,
    topic_missing_now,
    without_vanished,
)
from txstore.core.starting import (
    EARLIEST,
    LATEST,
    StartingOffsets,
    parse_starting_offsets,
    parse_timestamp,
    resolve_starting_offsets,
)
from txstore.ops.reset_plan import ResetMove, ResetTarget, generation_reason, plan_reset
from txstore.postgres.db import libpq_url, redact, sqlalchemy_url
from txstore.postgres.sink import classify_conflict


def marks(topic: str, partition: int, low: int, high: int) -> PartitionWatermarks:
    return PartitionWatermarks(topic, partition, low, high)


def test_plans_one_range_per_partition_with_new_data_and_none_for_caught_up_partitions() -> None:
    committed = {("a", 0): 5, ("a", 1): 10, ("b", 0): 0}
    ranges = plan_ranges("j", committed, [marks("a", 1, 0, 10), marks("a", 0, 0, 12), marks("b", 0, 0, 3)])
    assert ranges == [OffsetRange("a", 0, 5, 12), OffsetRange("b", 0, 0, 3)]


def test_plans_nothing_when_nothing_is_new() -> None:
    assert plan_ranges("j", {("a", 0): 7}, [marks("a", 0, 0, 7)]) == []


def test_refuses_a_stored_offset_beyond_the_log_end() -> None:
    with pytest.raises(
        OffsetOutOfLog, match=r"job 'j' topic 'a' partition 0: stored offset 9 is beyond the log-end offset 4"
    ):
        plan_ranges("j", {("a", 0): 9}, [marks("a", 0, 0, 4)])


def test_refuses_a_stored_offset_below_the_log_start_with_how_many_were_lost() -> None:
    with pytest.raises(
        DataLoss, match=r"stored offset 3 is below the log-start offset 10; 7 messages aged out"
    ):
        plan_ranges("j", {("a", 0): 3}, [marks("a", 0, 10, 20)])


def test_refuses_a_committed_partition_kafka_no_longer_reports() -> None:
    with pytest.raises(
        OffsetOutOfLog, match=r"partition 3: stored offset 5 but Kafka no longer has this partition"
    ):
        plan_ranges("j", {("a", 0): 0, ("a", 3): 5}, [marks("a", 0, 0, 1)])


def test_offset_range_rejects_backwards_ranges() -> None:
    with pytest.raises(ValueError, match="invalid offset range"):
        OffsetRange("a", 0, 5, 4)
    assert OffsetRange("a", 0, 5, 9).size == 4


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (20, AlreadyCommitted),
        (5, OffsetGap),
        (10 - 1, OffsetGap),
        (15, OffsetOverlap),
        (25, OffsetOverlap),
        (None, OffsetOverlap),
    ],
)
def test_classifies_a_failed_conditional_update_from_the_stored_offset(
    stored: int | None, expected: type
) -> None:
    error = classify_conflict("j", OffsetRange("t", 2, 10, 20), stored)
    assert type(error) is expected
    assert "job 'j' topic 't' partition 2 range 10 -> 20" in str(error)
    assert "\n" not in str(error)


def test_starting_offsets_keywords_and_json() -> None:
    assert parse_starting_offsets("earliest").default == EARLIEST
    assert parse_starting_offsets(" LATEST ").default == LATEST
    parsed = parse_starting_offsets('{"t": {"0": 23, "1": -2}, "u": {"3": -1}}')
    assert parsed.default == EARLIEST
    assert dict(parsed.specific) == {("t", 0): 23, ("t", 1): -2, ("u", 3): -1}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not valid JSON"),
        ("[]", "must be a non-empty object"),
        ('{"t": 5}', "topic 't' must map to an object"),
        ('{"t": {"x": 5}}', "partition 'x' of topic 't' is not a number"),
        ('{"t": {"0": -3}}', "offset -3 must be an offset >= 0, -2 (earliest) or -1 (latest)"),
        ('{"t": {"0": "5"}}', "must be an offset"),
    ],
)
def test_malformed_starting_offsets_are_refused_with_a_hint(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_starting_offsets(text)


def test_partial_json_starts_unnamed_partitions_at_earliest_and_says_why() -> None:
    starting = parse_starting_offsets('{"t": {"0": 23, "1": -1}}')
    new = [marks("t", 0, 0, 50), marks("t", 1, 5, 50), marks("t", 2, 7, 50)]
    decisions = resolve_starting_offsets(starting, new, [m.key for m in new])
    assert [(d.partition, d.offset) for d in decisions] == [(0, 23), (1, 50), (2, 7)]
    assert decisions[1].reason == "latest offset 50 (--starting-offsets JSON)"
    assert decisions[2].reason == "earliest offset 7 (not named in --starting-offsets JSON)"


def test_json_naming_unknown_partitions_or_offsets_outside_the_log_is_refused() -> None:
    new = [marks("t", 0, 10, 50)]
    with pytest.raises(ConfigError, match=r"names 't' partition 9, which Kafka does not report"):
        resolve_starting_offsets(parse_starting_offsets('{"t": {"9": 1}}'), new, [("t", 0)])
    with pytest.raises(ConfigError, match=r"offset 3 is outside what Kafka holds \(10 to 50\)"):
        resolve_starting_offsets(parse_starting_offsets('{"t": {"0": 3}}'), new, [("t", 0)])


def test_database_urls_are_converted_and_redacted() -> None:
    url = "postgresql+psycopg://job:s3cr%40t@db.example:5432/txstore?sslmode=require"
    assert libpq_url(url).startswith("postgresql://job:")
    assert sqlalchemy_url("postgres://u:p@h/d").drivername == "postgresql+psycopg"
    assert "s3cr" not in redact(url)
    assert redact(url) == "postgresql://job:***@db.example:5432/txstore?sslmode=require"


def test_fail_points_parse_and_fire_only_where_enabled() -> None:
    points = FailPoints.parse("after-commit@first, before-upsert:raise")
    points.hit("before-commit", attempt=0)
    points.hit("after-commit", attempt=1)
    with pytest.raises(InjectedFailure):
        points.hit("after-commit", attempt=0)
    with pytest.raises(InjectedFailure):
        points.hit("before-upsert", attempt=3)
    with pytest.raises(ValueError):
        FailPoints.parse("nowhere")


def test_a_partition_new_to_a_started_topic_starts_at_earliest_whatever_the_starting_offsets() -> None:
    new = [marks("t", 4, 2, 30), marks("u", 0, 3, 9)]
    decisions = resolve_starting_offsets(parse_starting_offsets("latest"), new, [m.key for m in new], {"t"})
    assert [(d.topic, d.partition, d.offset) for d in decisions] == [("t", 4, 2), ("u", 0, 9)]
    assert decisions[0].reason == "earliest offset 2 (new partition of a started topic)"
    assert decisions[1].reason == "latest offset 9 (--starting-offsets)"


def test_the_rate_limit_splits_a_batch_by_backlog_and_keeps_ranges_contiguous() -> None:
    ranges = [OffsetRange("t", 0, 100, 1100), OffsetRange("t", 1, 0, 3000), OffsetRange("t", 2, 50, 51)]
    limited = limit_ranges(ranges, 400)
    # 400 * 1000/4001 = 99.97 -> 99; 400 * 3000/4001 = 299.9 -> 299; 0.09 -> at least 1.
    assert limited == [
        OffsetRange("t", 0, 100, 199),
        OffsetRange("t", 1, 0, 299),
        OffsetRange("t", 2, 50, 51),
    ]
    assert limit_ranges(ranges, 10_000) == ranges
    assert limit_ranges(ranges, None) == ranges


def test_starting_timestamps_parse_from_iso_8601_with_a_zone_or_epoch_millis() -> None:
    assert parse_timestamp("1767225600000") == 1_767_225_600_000
    assert parse_timestamp("2026-01-01T00:00:00Z") == 1_767_225_600_000
    assert parse_timestamp("2026-01-01T01:00:00+01:00") == 1_767_225_600_000
    with pytest.raises(ConfigError, match=r"has no time zone; add one, e.g. 2026-01-01T00:00Z"):
        parse_timestamp("2026-01-01T00:00")
    with pytest.raises(ConfigError, match="neither epoch milliseconds nor ISO-8601"):
        parse_timestamp("yesterday")


def test_a_starting_timestamp_starts_at_the_looked_up_offset_or_the_log_end() -> None:
    starting = StartingOffsets(timestamp_ms=1_767_225_600_000)
    new = [marks("t", 0, 0, 50), marks("t", 1, 0, 40)]
    decisions = resolve_starting_offsets(
        starting, new, [m.key for m in new], (), {("t", 0): 17, ("t", 1): -1}
    )
    assert [(d.partition, d.offset) for d in decisions] == [(0, 17), (1, 40)]
    assert decisions[0].reason == "offset 17 (--starting-timestamp 2026-01-01T00:00:00Z)"


def test_aged_out_lists_what_kafka_dropped_before_it_was_counted() -> None:
    committed = {("t", 0): 3, ("t", 1): 50, ("t", 2): 0}
    lost = aged_out(
        committed, [marks("t", 0, 10, 20), marks("t", 1, 10, 60), marks("t", 2, 0, 0), marks("t", 3, 5, 9)]
    )
    assert lost == [OffsetRange("t", 0, 3, 10)]


def test_a_range_verifies_the_last_counted_message_only_while_kafka_can_still_hold_it() -> None:
    last = Fingerprint(9, 1_000, digest(b"k", b"v"))
    history = {("a", 0): PartitionHistory(2, None, last), ("a", 1): PartitionHistory(0, None, last)}
    ranges = plan_ranges(
        "j", {("a", 0): 10, ("a", 1): 10}, [marks("a", 0, 9, 20), marks("a", 1, 10, 20)], history
    )
    assert [(r.verify, r.generation) for r in ranges] == [(last, 2), (None, 0)]  # 9 aged out of partition 1
    assert [r.verify for r in limit_ranges(ranges, 4)] == [last, None]
    pieces = split_ranges(ranges[:1], 3)
    assert [(p.from_offset, p.verify, p.generation) for p in pieces] == [
        (10, last, 2),
        (13, None, 2),
        (16, None, 2),
    ]


def test_a_changed_topic_id_is_refused_with_the_reset_that_starts_a_new_generation() -> None:
    history = {("a", 0): PartitionHistory(0, "OLD-ID", None)}
    with pytest.raises(TopicRecreated) as raised:
        plan_ranges("j", {("a", 0): 5}, [marks("a", 0, 0, 8)], history, {"a": "NEW-ID"})
    assert str(raised.value) == (
        "job 'j' topic 'a' partition 0: the topic was deleted and recreated (stored topic ID OLD-ID; "
        "found topic ID NEW-ID); nothing was counted. To count the new topic from its start as a new "
        "generation: txstore reset --job j --topic a --partition 0 --to-earliest --execute"
    )
    assert plan_ranges("j", {("a", 0): 5}, [marks("a", 0, 0, 8)], history, {}) == [OffsetRange("a", 0, 5, 8)]


def test_message_digests_tell_a_missing_key_from_an_empty_one_and_never_confuse_boundaries() -> None:
    assert (
        len(
            {
                digest(None, b"v"),
                digest(b"", b"v"),
                digest(b"kv", b""),
                digest(b"k", b"v"),
                digest(None, None),
            }
        )
        == 5
    )
    assert digest(b"k", b"v") == digest(b"k", b"v")
    assert len(digest(b"k", b"v")) == 32


@pytest.mark.parametrize(
    ("stored", "past", "topic_id", "found", "forced", "reason"),
    [
        (5, PartitionHistory(), None, None, False, None),
        (9, PartitionHistory(), None, None, False, "stored offset 9 is beyond the log end 8"),
        (5, PartitionHistory(0, "A"), "B", None, False, "topic ID A is now B"),
        (5, PartitionHistory(0, "A"), "A", None, False, None),
        (
            5,
            PartitionHistory(0, None, Fingerprint(4, 1, "x")),
            None,
            Fingerprint(4, 1, "y"),
            False,
            "the message at offset 4 is not the one last counted",
        ),
        (5, PartitionHistory(0, None, Fingerprint(4, 1, "x")), None, Fingerprint(4, 1, "x"), False, None),
        (5, PartitionHistory(0, None, Fingerprint(4, 1, "x")), None, None, False, None),
        (5, PartitionHistory(), None, None, True, "--new-generation"),
    ],
)
def test_a_reset_starts_a_new_generation_only_across_a_recreated_topic_or_when_told(
    stored: int,
    past: PartitionHistory,
    topic_id: str | None,
    found: Fingerprint | None,
    forced: bool,
    reason: str | None,
) -> None:
    assert generation_reason(stored, marks("a", 0, 0, 8), past, topic_id, found, forced) == reason
    moves = plan_reset(
        "j",
        "a",
        None,
        {0: stored},
        {0: marks("a", 0, 0, 8)},
        ResetTarget("earliest"),
        None,
        {0: past},
        topic_id,
        {0: found},
        forced,
    )
    new_generation = None if reason is None else past.generation + 1
    assert moves == [
        ResetMove("a", 0, stored, 0, past.generation, new_generation, reason, topic_id if reason else None)
    ]


def test_a_looked_up_start_past_the_last_stable_offset_starts_at_the_last_stable_offset() -> None:
    """Kafka's offsets-for-times lookup is read-uncommitted: it may answer an offset inside a
    producer transaction still open, above the last stable offset the planner reads up to."""
    starting = StartingOffsets(timestamp_ms=1_767_225_600_000)
    # Partition 0: last stable offset 30, an open transaction above it; the lookup says 42.
    new = [marks("t", 0, 0, 30), marks("t", 1, 5, 40), marks("t", 2, 10, 20)]
    found = {("t", 0): 42, ("t", 1): -1, ("t", 2): 3}
    decisions = resolve_starting_offsets(starting, new, [m.key for m in new], (), found)
    assert [(d.partition, d.offset) for d in decisions] == [(0, 30), (1, 40), (2, 10)]
    assert decisions[0].reason == "offset 30 (--starting-timestamp 2026-01-01T00:00:00Z)"
    planned = plan_ranges("j", {(d.topic, d.partition): d.offset for d in decisions}, new)
    assert planned == [OffsetRange("t", 2, 10, 20)]  # no offset beyond the log: the job goes on


def test_a_reset_to_a_datetime_never_moves_past_the_last_stable_offset() -> None:
    watermarks = {0: marks("t", 0, 0, 30), 1: marks("t", 1, 5, 40), 2: marks("t", 2, 10, 20)}
    moves = plan_reset(
        "j", "t", None, {0: 0, 1: 5, 2: 10}, watermarks, ResetTarget("datetime", 1), {0: 42, 1: -1, 2: 3}
    )
    assert [(m.partition, m.new) for m in moves] == [(0, 30), (1, 40), (2, 10)]


def test_a_topic_is_recreated_when_its_stored_id_and_kafka_s_differ_and_both_are_known() -> None:
    history = {
        ("a", 0): PartitionHistory(0, "A1"),
        ("a", 1): PartitionHistory(0, "A1"),
        ("b", 0): PartitionHistory(0, "B1"),
        ("c", 0): PartitionHistory(0, None),
        ("d", 0): PartitionHistory(0, "D1"),
    }
    assert recreated_topics(history, {"a": "A2", "b": "B1", "c": "C1", "d": None}) == {"a"}
    assert recreated_topics(history, {}) == set()


def test_a_plan_asks_the_log_start_only_of_partitions_not_at_their_end() -> None:
    ends = {("t", 0): 10, ("t", 1): 4, ("t", 2): 7, ("u", 0): 0}
    committed = {("t", 0): 10, ("t", 1): 2, ("t", 2): 9, ("u", 0): 0}
    # at its end: not asked; new data, beyond the end, no row: asked
    assert log_start_wanted(committed, {**ends, ("t", 3): 5}) == [("t", 1), ("t", 2), ("t", 3)]
    assert log_start_wanted(committed, {("t", 0): 10, ("u", 0): 0}) == []


def test_a_plan_asks_topic_ids_only_of_topics_with_a_range_or_a_row_without_one() -> None:
    marks_now = [
        marks("idle", 0, 0, 5),
        marks("idle", 1, 3, 3),
        marks("busy", 0, 0, 9),
        marks("busy", 1, 0, 4),
        marks("new", 0, 0, 2),
        marks("noid", 0, 0, 6),
    ]
    committed = {("idle", 0): 5, ("idle", 1): 3, ("busy", 0): 9, ("busy", 1): 1, ("noid", 0): 6}
    history = {
        ("idle", 0): PartitionHistory(0, "I"),
        ("idle", 1): PartitionHistory(0, "I"),
        ("busy", 0): PartitionHistory(0, "B"),
        ("busy", 1): PartitionHistory(0, "B"),
        ("noid", 0): PartitionHistory(0, None),
    }
    # busy: one partition has new data; new: no row yet; noid: its ID not stored yet
    checked = {"idle": 0.0, "busy": 0.0, "new": 0.0, "noid": 0.0}
    assert topic_ids_wanted(committed, marks_now, history, checked, 1.0) == ("busy", "new", "noid")
    idle_only = {k: v for k, v in committed.items() if k[0] == "idle"}
    idle_history = {k: v for k, v in history.items() if k[0] == "idle"}
    assert topic_ids_wanted(idle_only, marks_now[:2], idle_history, {"idle": 0.0}, 1.0) == ()
    # beyond the log end (refused anyway) and a row the history lacks are asked too
    assert topic_ids_wanted({("idle", 0): 6}, marks_now[:1], {}) == ("idle",)
    # an idle topic: asked when never asked, or last asked `every` seconds ago or more
    assert topic_ids_wanted(idle_only, marks_now[:2], idle_history, {"idle": 100.0}, 104.9, 5.0) == ()
    assert topic_ids_wanted(idle_only, marks_now[:2], idle_history, {"idle": 100.0}, 105.0, 5.0) == ("idle",)
    assert topic_ids_wanted(idle_only, marks_now[:2], idle_history, {"other": 100.0}, 100.0) == ("idle",)


def test_the_topic_ids_stored_are_those_of_topics_with_a_row_that_has_none() -> None:
    history = {
        ("a", 0): PartitionHistory(0, "A"),
        ("b", 0): PartitionHistory(0, "B"),
        ("b", 1): PartitionHistory(0, None),  # added later: its row has no ID yet
        ("c", 0): PartitionHistory(0, None),
    }
    found = {"a": "A2", "b": "B", "c": "C", "d": "D"}  # d: no row (not started)
    assert topic_ids_to_store(found, history) == {"b": "B", "c": "C"}
    assert topic_ids_to_store({"a": "A"}, history) == {}
    assert topic_ids_to_store(found, {}) == {}


def test_an_unknown_topic_is_the_vanished_line_if_stored_kafka_s_if_unmatched_else_left_out() -> None:
    """What a batch planner and a stream's planning do when Kafka reports a topic unknown."""
    gone = UnknownTopic("topic 'b' does not exist on Kafka at k:9092; check --topic", "b", "k:9092")
    # Offsets stored for it: it existed, no typo (whether a pattern matched it or not).
    for pattern in (True, False):
        with pytest.raises(UnknownTopic) as raised:
            without_vanished("j", gone, ("a", "b"), 3, pattern)
        assert str(raised.value) == str(topic_missing_now("j", "b", "k:9092", 3))
        assert "stored offsets for 3 of its partitions" in str(raised.value)
    # Never stored, no pattern: Kafka's own line (a typo, say).
    with pytest.raises(UnknownTopic) as raised:
        without_vanished("j", gone, ("a", "b"), 0, False)
    assert raised.value is gone
    # Never stored, a pattern, but not among the topics planned: not ours to drop.
    with pytest.raises(UnknownTopic) as raised:
        without_vanished("j", gone, ("a", "c"), 0, True)
    assert raised.value is gone
    # Matched a moment ago, deleted since, never started: left out, the others kept in order.
    assert without_vanished("j", gone, ("a", "b", "c"), 0, True) == ("a", "c")
