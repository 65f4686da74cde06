"""Range splitting (``--min-partitions``) and the rate limit (``--max-offsets-per-batch``) with
sizes that do not divide evenly: a piece or a share that drops the remainder loses offsets
here, in milliseconds, rather than in a Spark test minutes later. Pure: no servers."""

from __future__ import annotations

import itertools

import pytest

from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange, limit_ranges, split_ranges

LAST = Fingerprint(99, 5, "d")


def covers_exactly(ranges: list[OffsetRange], pieces: list[OffsetRange]) -> None:
    """Each range's pieces, in order, are non-empty, contiguous, start at its ``from`` and end at
    its ``until``, and keep its generation and log end; only the first piece verifies."""
    for r in ranges:
        own = [p for p in pieces if p.key == r.key]
        assert own, r
        assert own[0].from_offset == r.from_offset and own[-1].until_offset == r.until_offset, (r, own)
        for a, b in itertools.pairwise(own):
            assert a.until_offset == b.from_offset, own
        assert all(p.size > 0 for p in own), own
        assert all((p.generation, p.log_end) == (r.generation, r.log_end) for p in own)
        assert [p.verify for p in own] == [r.verify] + [None] * (len(own) - 1)
    assert sum(p.size for p in pieces) == sum(r.size for r in ranges)


def test_a_range_split_in_three_keeps_the_remainder_and_pieces_differ_by_at_most_one() -> None:
    r = OffsetRange("t", 0, 5, 15, LAST, 2, 20)
    pieces = split_ranges([r], 3)
    assert [(p.from_offset, p.until_offset) for p in pieces] == [(5, 8), (8, 11), (11, 15)]
    covers_exactly([r], pieces)


def test_uneven_ranges_are_split_in_proportion_to_their_sizes_with_every_offset_kept() -> None:
    ranges = [OffsetRange("t", 0, 0, 7, LAST, 1, 7), OffsetRange("t", 1, 10, 13), OffsetRange("u", 0, 4, 5)]
    # 11 offsets over 4 tasks: ceil(7/11*4) = 3, ceil(3/11*4) = 2, ceil(1/11*4) = 1.
    pieces = split_ranges(ranges, 4)
    assert [(p.topic, p.partition, p.from_offset, p.until_offset) for p in pieces] == [
        ("t", 0, 0, 2),
        ("t", 0, 2, 4),
        ("t", 0, 4, 7),
        ("t", 1, 10, 11),
        ("t", 1, 11, 13),
        ("u", 0, 4, 5),
    ]
    covers_exactly(ranges, pieces)


def test_a_range_is_never_cut_into_more_pieces_than_it_has_offsets() -> None:
    ranges = [OffsetRange("t", 0, 0, 2), OffsetRange("t", 1, 0, 1)]
    pieces = split_ranges(ranges, 8)
    assert [(p.partition, p.from_offset, p.until_offset) for p in pieces] == [(0, 0, 1), (0, 1, 2), (1, 0, 1)]


def test_enough_ranges_or_no_minimum_leave_the_batch_as_it_is() -> None:
    ranges = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 3, 4)]
    assert split_ranges(ranges, 2) == ranges
    assert split_ranges(ranges, 1) == ranges
    assert split_ranges(ranges, None) == ranges
    assert split_ranges(ranges, 0) == ranges
    assert split_ranges([], 3) == []


@pytest.mark.parametrize("minimum", [2, 3, 4, 5, 7, 9, 16])
def test_every_split_of_awkward_sizes_covers_each_range_exactly_with_at_least_the_minimum_pieces(
    minimum: int,
) -> None:
    for sizes in [(1,), (10,), (11, 1), (7, 3, 2), (13, 5), (1, 1, 29), (100, 3)]:
        ranges = [
            OffsetRange("t", p, 3 * p, 3 * p + n, LAST if p == 0 else None, p) for p, n in enumerate(sizes)
        ]
        pieces = split_ranges(ranges, minimum)
        covers_exactly(ranges, pieces)
        if len(ranges) < minimum:
            assert len(pieces) >= min(minimum, sum(sizes)), (sizes, pieces)


def test_the_rate_limit_with_uneven_shares_rounds_down_keeps_every_partition_going_and_stays_contiguous() -> (
    None
):
    ranges = [OffsetRange("t", 0, 10, 15, LAST, 3, 15), OffsetRange("t", 1, 0, 7), OffsetRange("t", 2, 4, 5)]
    # 13 offsets capped at 6: 6*5/13 = 2.3 -> 2, 6*7/13 = 3.2 -> 3, 6*1/13 = 0.46 -> at least 1.
    limited = limit_ranges(ranges, 6)
    assert [(r.from_offset, r.until_offset) for r in limited] == [(10, 12), (0, 3), (4, 5)]
    assert [(r.verify, r.generation, r.log_end) for r in limited] == [
        (LAST, 3, 15),
        (None, 0, None),
        (None, 0, None),
    ]
    # The next batch continues exactly where this one stopped.
    rest = [
        OffsetRange(r.topic, r.partition, cut.until_offset, r.until_offset)
        for r, cut in zip(ranges, limited, strict=True)
    ]
    assert limit_ranges(rest, 6) == [
        OffsetRange("t", 0, 12, 14),
        OffsetRange("t", 1, 3, 6),
        OffsetRange("t", 2, 5, 5),
    ]


def test_the_rate_limit_at_exactly_the_backlog_changes_nothing_and_one_below_cuts() -> None:
    ranges = [OffsetRange("t", 0, 0, 4), OffsetRange("t", 1, 0, 3)]
    assert limit_ranges(ranges, 7) == ranges
    assert [r.until_offset for r in limit_ranges(ranges, 6)] == [3, 2]  # 3.43 -> 3, 2.57 -> 2
    assert [r.until_offset for r in limit_ranges(ranges, 1)] == [1, 1]  # shares below one round up


@pytest.mark.parametrize("cap", [1, 2, 5, 9, 17, 40])
def test_the_rate_limit_never_exceeds_a_range_and_takes_close_to_the_cap(cap: int) -> None:
    ranges = [OffsetRange("t", p, 100 * p, 100 * p + n) for p, n in enumerate((1, 6, 13, 29))]
    limited = limit_ranges(ranges, cap)
    for r, cut in zip(ranges, limited, strict=True):
        assert cut.from_offset == r.from_offset and r.from_offset < cut.until_offset <= r.until_offset
    total = sum(r.size for r in limited)
    assert total <= max(cap, 0) + len(ranges)  # each share is rounded down, or up from below one
    assert total >= min(cap, 49) - len(ranges)


def test_a_share_between_one_and_two_is_rounded_down_like_any_other() -> None:
    ranges = [OffsetRange("t", 0, 0, 3), OffsetRange("t", 1, 0, 1)]
    # 2 offsets over 4: 1.5 -> 1, 0.5 -> at least 1.
    assert [r.until_offset for r in limit_ranges(ranges, 2)] == [1, 1]


def test_an_empty_range_from_the_rate_limit_stays_one_empty_piece_when_split() -> None:
    """The rate limit can leave a range empty (a share of 0); splitting keeps it as it is."""
    empty = OffsetRange("t", 2, 5, 5, LAST, 1, 9)
    assert split_ranges([empty], 3) == [empty]
    assert split_ranges([empty, OffsetRange("t", 0, 0, 4)], 4) == [
        empty,
        OffsetRange("t", 0, 0, 1),
        OffsetRange("t", 0, 1, 2),
        OffsetRange("t", 0, 2, 3),
        OffsetRange("t", 0, 3, 4),
    ]
