"""Start times (``--starting-timestamp``, ``reset --to-datetime``) to epoch milliseconds and back, exactly.

Both flags go through :func:`txstore.core.starting.parse_timestamp`; the job logs, and the reset
plan shows, the instant looked up with :func:`txstore.core.starting.format_timestamp`. Float
seconds lose the last millisecond of many instants (``2004-03-15T07:55:47.472Z`` became
1079337347471), which would start a job one message early. No servers here: the reset's
command line is tested in tests/ops/test_operator_cli.py.
"""

from __future__ import annotations

import argparse
import random
from datetime import datetime, timedelta, timezone

import pytest

from txstore.core.errors import ConfigError
from txstore.core.starting import format_timestamp, parse_timestamp
from txstore.options import add_job_options, job_settings

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Every instant datetime can show in any of the zones below (a day inside years 1 and 9999).
FIRST_MS = (datetime(1, 1, 2, tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)
LAST_MS = (datetime(9999, 12, 30, tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)
ZONES = [timezone(timedelta(minutes=m)) for m in (0, 60, 330, 345, -210, -570, 840, -720)]


def iso(ms: int, zone: timezone = UTC, timespec: str = "milliseconds") -> str:
    """``ms`` as ISO-8601 in ``zone``, computed apart from the code under test (integers only)."""
    return (EPOCH + timedelta(milliseconds=ms)).astimezone(zone).isoformat(timespec=timespec)


def test_the_quoted_instant_is_not_a_millisecond_early() -> None:
    assert parse_timestamp("2004-03-15T07:55:47.472Z") == 1_079_337_347_472
    assert format_timestamp(1_079_337_347_472) == "2004-03-15T07:55:47.472Z"


@pytest.mark.slow
def test_random_millisecond_instants_round_trip_exactly_in_any_zone_and_spelling() -> None:
    rng = random.Random(24)
    instants = [rng.randrange(FIRST_MS, LAST_MS) for _ in range(10_000)]
    # Around today too, where the float error showed (643 of 100,000 instants a millisecond early).
    recent = (datetime(2000, 1, 1, tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)
    instants += [rng.randrange(recent, recent + 40 * 365 * 86_400_000) for _ in range(50_000)]
    wrong = []
    for ms in instants:
        zone = rng.choice(ZONES)
        spellings = (
            iso(ms).replace("+00:00", "Z"),
            iso(ms, zone),
            iso(ms, zone, "microseconds"),  # 472000 microseconds
            format_timestamp(ms),
        )
        found = [parse_timestamp(text) for text in spellings]
        if found != [ms] * len(spellings):
            wrong.append((ms, spellings, found))
    assert (len(wrong), wrong[:5]) == (0, [])


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T00:00:00.001Z", 1),
        ("1969-12-31T23:59:59.999Z", -1),
        ("1969-12-31T23:59:59.001Z", -999),
        ("1969-12-31T23:59:59Z", -1000),
        ("1900-01-01T00:00:00Z", -2_208_988_800_000),
        ("1960-06-29T13:09:59.999-05:30", -300_000_000_001),
        ("0001-01-01T00:00:00Z", -62_135_596_800_000),
        ("9999-12-31T23:59:59.999Z", 253_402_300_799_999),
        ("2026-01-01T05:30:00+05:30", 1_767_225_600_000),
        ("2025-12-31T14:00:00-10:00", 1_767_225_600_000),
        ("2026-01-01T00:00:00.000000+00:00", 1_767_225_600_000),
        ("2026-01-01T00:00:00z", 1_767_225_600_000),  # RFC 3339's z, which no Python reads itself
        ("1767225600000", 1_767_225_600_000),
    ],
)
def test_edge_instants_before_1970_at_the_calendar_s_ends_and_with_offsets_are_exact(
    text: str, ms: int
) -> None:
    assert parse_timestamp(text) == ms
    assert parse_timestamp(format_timestamp(ms)) == ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2004-03-15T07:55:47.472001Z", 1_079_337_347_473),
        ("2004-03-15T07:55:47.472999Z", 1_079_337_347_473),
        ("2004-03-15T13:25:47.4725+05:30", 1_079_337_347_473),
        # Digits past the microsecond: after .472 by less than a microsecond is still after it
        # (they used to be dropped, and the message at .472 counted); zeros there change nothing.
        ("2004-03-15T07:55:47.4720000001Z", 1_079_337_347_473),
        ("2004-03-15T07:55:47.472999999999Z", 1_079_337_347_473),
        ("2004-03-15T07:55:47.4720000000Z", 1_079_337_347_472),
        ("2004-03-15T07:55:47,4725Z", 1_079_337_347_473),
        ("9999-12-31T23:59:59.9999990001Z", 253_402_300_800_000),
        ("1969-12-31T23:59:59.999500Z", 0),
        ("1969-12-31T23:59:59.998001Z", -1),
    ],
)
def test_a_time_between_two_milliseconds_starts_at_the_later_one_the_first_message_at_or_after_it(
    text: str, ms: int
) -> None:
    """Kafka's timestamps are whole milliseconds: a message at .472 is before .472001."""
    assert parse_timestamp(text) == ms


def test_the_instant_is_shown_back_in_utc_with_milliseconds_only_when_it_has_some() -> None:
    assert format_timestamp(1_767_225_600_000) == "2026-01-01T00:00:00Z"
    assert format_timestamp(1_767_225_600_010) == "2026-01-01T00:00:00.010Z"
    assert format_timestamp(-1) == "1969-12-31T23:59:59.999Z"
    # Epoch milliseconds beyond the calendar (year 10000 and later) are shown as given.
    assert format_timestamp(99_999_999_999_999_999) == "99999999999999999 (epoch ms)"


def test_the_job_s_starting_timestamp_flag_gives_the_exact_millisecond() -> None:
    parser = argparse.ArgumentParser()
    add_job_options(parser, "j")
    given = ["--topic", "t", "--bootstrap-servers", "k:9092", "--database-url", "postgresql://u@h/d"]

    def starting_ms(text: str) -> int | None:
        args = parser.parse_args([*given, "--starting-timestamp", text])
        return job_settings(args).starting_offsets.timestamp_ms

    for text in ("2004-03-15T07:55:47.472Z", "2004-03-15T13:25:47.472+05:30", "1079337347472"):
        assert starting_ms(text) == 1_079_337_347_472, text
    with pytest.raises(
        ConfigError, match=r"^--starting-timestamp '2004-03-15T07:55:47.472' has no time zone"
    ):
        starting_ms("2004-03-15T07:55:47.472")


@pytest.mark.parametrize(
    "text",
    [
        "²",  # str.isdigit() says yes, int() refuses
        "١٢٣",  # Arabic-Indic digits
        "2004-03-15T07:55:47.472000٠Z",  # an Arabic-Indic zero past the microsecond
        "2004-03-15T07:55:47.٤٧٢Z",
    ],
)
def test_a_time_in_other_digits_than_ascii_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^--starting-timestamp .* is neither epoch milliseconds nor ISO-8601"
    ):
        parse_timestamp(text)
