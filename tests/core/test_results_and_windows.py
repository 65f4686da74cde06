"""Pure pieces of the aggregates: durations, windows, result addresses, splitting, batch conflicts."""

from __future__ import annotations

import itertools
import random
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from txstore.core.errors import AlreadyCommitted, ConfigError, OffsetGap, OffsetOverlap
from txstore.core.ranges import OffsetRange, split_ranges
from txstore.core.results import TOPIC_TOTAL, by_key, decode_key, encode_key, metric_text, row_order
from txstore.core.windows import format_duration, parse_duration_ms, window_start, window_start_ms
from txstore.job import JobSettings
from txstore.postgres.sink import classify_batch_conflict, outbox_identity


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1m", 60_000),
        ("90s", 90_000),
        ("1h30m", 5_400_000),
        ("500ms", 500),
        ("1.5h", 5_400_000),
        ("1w", 604_800_000),
    ],
)
def test_durations_read_units_and_combinations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms
    assert parse_duration_ms(format_duration(ms)) == ms


@pytest.mark.parametrize("text", ["", "1", "m", "1 minute", "-1m", "0s", "0.5ms", "1m-", "1y"])
def test_malformed_durations_are_refused_with_an_example(text: str) -> None:
    with pytest.raises(ConfigError, match="duration"):
        parse_duration_ms(text)


def test_windows_are_aligned_to_the_epoch_also_before_1970() -> None:
    minute = 60_000
    assert window_start_ms(125_000, minute) == 120_000
    assert window_start_ms(120_000, minute) == 120_000
    assert window_start_ms(-1, minute) == -60_000
    assert window_start(1_700_000_123_456, minute) == datetime(2023, 11, 14, 22, 15, tzinfo=timezone.utc)


def test_keys_that_are_not_utf8_or_hold_nul_are_kept_apart_and_storable() -> None:
    assert decode_key(None) is None
    assert decode_key("ключ".encode()) == "ключ"
    assert decode_key(b"\xff\xfe") == "\\xff\\xfe"
    assert decode_key(b"a\x00b") == "a\\x00b"
    assert "\x00" not in (decode_key(b"\x00") or "")


def test_a_key_holding_a_backslash_escape_as_text_is_not_the_byte_it_spells() -> None:
    assert decode_key(b"\\xff") != decode_key(b"\xff")
    assert decode_key(b"\\x00") != decode_key(b"\x00")
    assert decode_key(b"a\\b") == "a\\\\b"  # a backslash is escaped as two


def test_every_stored_key_decodes_back_to_exactly_its_bytes() -> None:
    rng = random.Random(7)
    samples = [b"", b"\\", b"\\x41", b"\xff", b"\x00", "ключ\\".encode(), b"\xc3", b"\xc3\xa9"]
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(12))) for _ in range(3000)]
    samples += [bytes(rng.choice(b"\\x0fA\xff\x00") for _ in range(rng.randrange(8))) for _ in range(3000)]
    seen: dict[str, bytes] = {}
    for raw in samples:
        text = decode_key(raw)
        assert text is not None and "\x00" not in text
        assert encode_key(text) == raw
        assert seen.setdefault(text, raw) == raw, f"{raw!r} and {seen[text]!r} are stored alike"


def test_the_null_key_row_is_not_the_topic_total() -> None:
    assert by_key(None) != TOPIC_TOTAL
    rows = [("t", by_key("b")), ("t", by_key(None)), ("t", TOPIC_TOTAL), ("s", by_key("a"))]
    assert sorted(rows, key=row_order) == [
        ("s", by_key("a")),
        ("t", by_key(None)),
        ("t", by_key("b")),
        ("t", TOPIC_TOTAL),
    ]


def test_metrics_are_exact_decimals_and_never_nan() -> None:
    assert metric_text(3) == "3"
    assert metric_text(0.1) == "0.1"
    assert metric_text(Decimal("12.345")) == "12.345"
    for bad in (float("nan"), float("inf"), Decimal("NaN")):
        with pytest.raises(ValueError, match="finite"):
            metric_text(bad)
    with pytest.raises(TypeError):
        metric_text(True)


def test_min_partitions_splits_big_ranges_in_proportion_without_losing_an_offset() -> None:
    ranges = [OffsetRange("t", 0, 100, 1100), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 5, 6)]
    pieces = split_ranges(ranges, 10)
    assert len(pieces) >= 10
    for r in ranges:
        mine = sorted(p for p in pieces if p.key == r.key)
        assert mine[0].from_offset == r.from_offset and mine[-1].until_offset == r.until_offset
        assert all(a.until_offset == b.from_offset for a, b in itertools.pairwise(mine))
        assert all(p.size > 0 for p in mine)
    assert len([p for p in pieces if p.partition == 0]) > len([p for p in pieces if p.partition == 1])
    assert split_ranges(ranges, None) == ranges
    assert split_ranges(ranges, 2) == ranges


def test_a_batch_conflict_is_named_from_the_stored_offsets() -> None:
    a, b = OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 8)
    replay = classify_batch_conflict("j", [a, b], {a.key: 10, b.key: 8})
    assert isinstance(replay, AlreadyCommitted)
    gap = classify_batch_conflict("j", [a, b], {a.key: 0, b.key: 3})
    assert isinstance(gap, OffsetGap) and gap.offset_range == b
    # One range committed by someone else, the other not: committing the rest would double count.
    partial = classify_batch_conflict("j", [a, b], {a.key: 10, b.key: 5})
    assert isinstance(partial, OffsetOverlap) and partial.offset_range == a
    missing = classify_batch_conflict("j", [a, b], {a.key: 0, b.key: None})
    assert isinstance(missing, OffsetOverlap) and "no offset row" in str(missing)


def test_outbox_messages_have_a_dedup_key_per_commit_that_names_its_range() -> None:
    key, headers = outbox_identity("j", [OffsetRange("orders", 3, 100, 250)], "c1")
    assert key == "j/orders/3/250/c1"
    assert headers == {
        "txstore-job": "j",
        "txstore-commit": "c1",
        "txstore-topic": "orders",
        "txstore-partition": "3",
        "txstore-until": "250",
    }
    batch = [OffsetRange("b", 1, 0, 5), OffsetRange("a", 0, 0, 7)]
    key1, headers1 = outbox_identity("j", batch, "c2")
    key2, _ = outbox_identity("j", list(reversed(batch)), "c2")
    assert key1 == key2 and key1.startswith("j/batch/") and key1.endswith("/c2")
    assert headers1["txstore-offsets"] == "a/0/7,b/1/5"
    assert outbox_identity("j", batch, "c3")[0] != key1  # a re-count after a reset is a new identity


def test_settings_refuse_combinations_that_cannot_work() -> None:
    base = {"job": "j", "topics": ("t",), "bootstrap_servers": "x:1", "database_url": "postgresql:///x"}
    with pytest.raises(ConfigError, match="--min-partitions needs --commit per-batch"):
        JobSettings(**base, min_partitions=4)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--sink idempotent"):
        JobSettings(**base, sink="idempotent", commit="per-batch")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--commit must be one of"):
        JobSettings(**base, commit="sometimes")  # type: ignore[arg-type]
    assert JobSettings(**base, commit="per-batch", min_partitions=4).min_partitions == 4  # type: ignore[arg-type]


@pytest.mark.parametrize(("by_key", "window_ms"), [(True, None), (False, 60_000), (True, 60_000), (True, 7)])
def test_count_messages_counts_what_one_message_at_a_time_counts(by_key: bool, window_ms: int | None) -> None:
    """Batched counting (distinct keys and windows decoded once) against the plain definition."""
    from collections import Counter

    from confluent_kafka import Message

    from txstore.core.results import ResultKey
    from txstore.count_topic import CountMessages

    rng = random.Random(5)
    keys = [None, b"", b"a", b"\\", b"\\xff", b"\xff", b"a\x00b", "ключ".encode(), b"user-1", b"user-2"]
    stamps = [(0, -1), (1, 0), (1, -1), (1, -60_001), (2, 1_700_000_000_000), (1, 59_999), (1, 60_000)]
    messages = [
        Message(
            topic="t", partition=0, offset=i, key=rng.choice(keys), value=b"v", timestamp=rng.choice(stamps)
        )
        for i in range(3000)
    ]
    expected: Counter[ResultKey] = Counter()
    for m in messages:
        kind, ts = m.timestamp()
        start = None if window_ms is None or kind == 0 else window_start(ts, window_ms)
        grain = "key+window" if by_key and window_ms else ("key" if by_key else "window")
        expected[ResultKey(grain, decode_key(m.key()) if by_key else None, start)] += 1
    count = CountMessages(by_key=by_key, window_ms=window_ms)
    batches = [messages[:1], messages[1:1000], [], messages[1000:]]
    deltas = count(OffsetRange("t", 0, 0, 3000), batches)
    assert deltas == {TOPIC_TOTAL: 3000, **expected}
    assert all(type(k) is ResultKey for k in deltas)


@pytest.mark.slow
def test_every_duration_with_whole_milliseconds_in_decimals_is_read_exactly() -> None:
    # Through float arithmetic 1.001s was 1000.9999999999999 ms, refused as not whole.
    for thousandths in range(1, 100_000):
        assert parse_duration_ms(f"{thousandths // 1000}.{thousandths % 1000:03d}s") == thousandths
    for hundredths in range(1, 2000):
        assert parse_duration_ms(f"{hundredths // 100}.{hundredths % 100:02d}m") == hundredths * 600
    assert parse_duration_ms("0.27m") == 16_200
