"""Where a partition starts when the job has never committed it.

``--starting-offsets`` takes Spark's spellings: ``earliest`` (the default),
``latest``, or JSON ``{"topic": {"0": 23, "1": -2}}`` where -2 means earliest
and -1 latest. Unlike Spark, the JSON may name only some partitions: every
other partition starts at earliest, and :func:`resolve_starting_offsets`
says which start where so the job can log it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from txstore.core.errors import ConfigError
from txstore.core.ranges import PartitionWatermarks, TopicPartition

EARLIEST = -2
LATEST = -1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_FRACTION = re.compile(r"(?<=\d\d:\d\d:\d\d)[.,](\d+)")
"""The seconds' fraction of an ISO-8601 time, any number of digits, with ``.`` or ``,``."""


@dataclass(frozen=True)
class StartingOffsets:
    """Parsed ``--starting-offsets``: a default plus per-partition choices."""

    default: int = EARLIEST
    specific: Mapping[TopicPartition, int] = field(default_factory=dict)
    timestamp_ms: int | None = None  # --starting-timestamp: start at the first message at or after it
    # startingOffsetsByTimestamp: per partition, a time to start at (the first message at or after it)
    timestamps: Mapping[TopicPartition, int] = field(default_factory=dict)
    # No message at or after the time: LATEST_STRATEGY starts at the end (the jobs' flag), ERROR_STRATEGY
    # refuses (Spark's default for its sources' startingOffsetsByTimestampStrategy)
    no_message_at_time: str = "latest"
    time_setting: str = "--starting-timestamp"  # how the time was given, for the start lines and errors
    # how the JSON was given (parse_starting_offsets' flag), for the line refusing a partition it names
    setting: str = field(default="--starting-offsets", compare=False)

    def time_of(self, key: TopicPartition) -> int | None:
        """When ``key`` starts by time: the one time for all (``startingTimestamp``, the jobs'
        ``--starting-timestamp``) before a per-partition one (``startingOffsetsByTimestamp``), as
        Spark's precedence has it; None: not by time."""
        if self.timestamp_ms is not None:
            return self.timestamp_ms
        return self.timestamps.get(key)

    def describe(self) -> str:
        if not self.specific:
            return "earliest" if self.default == EARLIEST else "latest"
        return json.dumps(
            {
                t: {str(p): o for (tt, p), o in sorted(self.specific.items()) if tt == t}
                for t in sorted({t for t, _ in self.specific})
            }
        )


@dataclass(frozen=True)
class StartDecision:
    """Where one new partition starts, and why (for the log line)."""

    topic: str
    partition: int
    offset: int
    reason: str


def offset_for_time(found: int, marks: PartitionWatermarks) -> int:
    """Where a partition starts for an offsets-for-times answer ``found``: within ``[low, high]``.

    ``marks.high`` must be the last stable offset (the read-committed end the
    planner uses). Kafka's lookup is read-uncommitted, so ``found`` can lie
    past it, on a message of a producer transaction still open; stored as is,
    the planner would see an offset beyond the log end and stop the job with
    advice whose reset counts messages twice. So it is capped at the last
    stable offset (the open transaction's messages are then read once it
    commits, or skipped as aborted). ``found`` < 0 (no message that late)
    means the end: the last stable offset too. Below ``low`` (aged out since
    the lookup) means ``low``.
    """
    if found < 0:
        return marks.high
    return min(max(found, marks.low), marks.high)


def parse_timestamp(text: str, flag: str = "--starting-timestamp") -> int:
    """Epoch milliseconds from ``1767225600000`` or ISO-8601 with a zone (``2026-01-01T00:00:00Z``).

    What both ``--starting-timestamp`` and ``reset --to-datetime`` read, exactly: see
    :func:`epoch_ms`.
    """
    value = text.strip()
    neither = f"{flag} {text!r} is neither epoch milliseconds nor ISO-8601; e.g. 2026-01-01T00:00:00Z"
    if not value.isascii():  # str.isdigit takes ², and 3.11's fromisoformat other scripts' digits
        raise ConfigError(neither)
    if value.isdigit():
        return int(value)
    # Read the same on every Python txstore runs on (3.10's fromisoformat takes neither a Z nor a
    # fraction of other than 3 or 6 digits) and exactly: the fraction as whole microseconds, and
    # whether any digit past them is not 0 (the instant is then just after those microseconds).
    zone = value
    if value[-1:] in ("Z", "z"):  # UTC, as format_timestamp writes it; RFC 3339 allows z too
        zone = value[:-1] + "+00:00"
    fraction = _FRACTION.search(zone)
    past_micros = False
    if fraction is not None:
        digits = fraction.group(1)
        past_micros = digits[6:].strip("0") != ""
        zone = f"{zone[: fraction.start()]}.{digits[:6].ljust(6, '0')}{zone[fraction.end() :]}"
    try:
        parsed = datetime.fromisoformat(zone)
    except ValueError:
        raise ConfigError(neither) from None
    if parsed.tzinfo is None:
        raise ConfigError(f"{flag} {text!r} has no time zone; add one, e.g. {value}Z or {value}+01:00")
    return epoch_ms(parsed, past_micros)


def epoch_ms(moment: datetime, past_micros: bool = False) -> int:
    """The first whole millisecond at or after ``moment`` (an aware datetime), since the epoch;
    ``past_micros``: the instant is a little after ``moment``, within its microsecond (a time
    given in finer digits), so the first millisecond after ``moment`` itself.

    Integers only: through float seconds (``moment.timestamp() * 1000``) many instants
    came out a millisecond early, e.g. 2004-03-15T07:55:47.472Z as 1079337347471, and a
    job started there would count a message from before the time asked for. Kafka's
    timestamps are whole milliseconds, so a time between two (microseconds given) starts
    at the later one: the message at .472 is before .472001, and before .4720001. Before
    1970 is negative.
    """
    delta = moment - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if past_micros:
        return micros // 1000 + 1
    return -(-micros // 1000)


def format_timestamp(timestamp_ms: int) -> str:
    """``timestamp_ms`` in UTC, ISO-8601 (``2004-03-15T07:55:47.472Z``, no fraction for whole
    seconds): :func:`parse_timestamp` reads it back as the same millisecond. Epoch
    milliseconds beyond the calendar (years 1 to 9999) are shown as given."""
    try:
        moment = _EPOCH + timedelta(milliseconds=timestamp_ms)
    except OverflowError:
        return f"{timestamp_ms} (epoch ms)"
    text = moment.isoformat(timespec="milliseconds" if timestamp_ms % 1000 else "seconds")
    return text.replace("+00:00", "Z")


def _json(text: str, flag: str, hint: str) -> object:
    """``text`` as JSON; :class:`ConfigError` in one line naming ``flag`` and where it broke."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} is not valid JSON ({e.msg} at char {e.pos}); {hint}") from None


LATEST_STRATEGY = "latest"
ERROR_STRATEGY = "error"


def parse_timestamps_json(
    text: str, flag: str = "option startingOffsetsByTimestamp"
) -> dict[TopicPartition, int]:
    """Spark's ``startingOffsetsByTimestamp``: ``{"topicA": {"0": 1767225600000, "1": ...}}``, epoch
    milliseconds per partition; :class:`ConfigError` in one line for anything else."""
    hint = 'give JSON like {"topicA": {"0": 1767225600000, "1": 1767225600000}} (epoch milliseconds)'
    parsed = _json(text, flag, hint)
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"{flag} must be a non-empty JSON object; {hint}")
    times: dict[TopicPartition, int] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict) or not partitions:
            raise ConfigError(f"{flag}: topic {topic!r} must map to an object of partitions; {hint}")
        for part, ms in partitions.items():
            try:
                partition = int(part)
            except ValueError:
                partition = -1
            if partition < 0:
                raise ConfigError(f"{flag}: partition {part!r} of topic {topic!r} is not a number; {hint}")
            if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
                raise ConfigError(
                    f"{flag}: topic {topic!r} partition {part}: {ms!r} is not a time in epoch "
                    f"milliseconds (a whole number of at least 0); {hint}"
                )
            times[(topic, partition)] = ms
    return times


def parse_time_strategy(text: str | None, flag: str = "option startingOffsetsByTimestampStrategy") -> str:
    """Spark's ``startingOffsetsByTimestampStrategy``: ``error`` (its default) or ``latest``."""
    value = (text or ERROR_STRATEGY).strip().lower()
    if value not in (ERROR_STRATEGY, LATEST_STRATEGY):
        raise ConfigError(
            f"{flag} must be error (refuse a partition with no message at or after its time, Spark's "
            f"default) or latest (start it at its end), got {text!r}"
        )
    return value


def times_to_look_up(
    starting: StartingOffsets, new_partitions: Iterable[TopicPartition], started_topics: Collection[str] = ()
) -> dict[TopicPartition, int]:
    """The new partitions that start by time (in a topic the job never started), with their times:
    what to ask Kafka's offsets-for-times lookup for, once per distinct time."""
    wanted = {}
    for key in new_partitions:
        when = starting.time_of(key) if key[0] not in started_topics else None
        if when is not None:
            wanted[key] = when
    return wanted


def parse_starting_offsets(text: str, flag: str = "--starting-offsets") -> StartingOffsets:
    """Parse ``earliest``, ``latest`` or Spark-style JSON; raise ConfigError otherwise.

    ``flag`` names the setting in error messages (the data source's options use this too).
    """
    value = text.strip()
    if value.lower() == "earliest":
        return StartingOffsets(EARLIEST, setting=flag)
    if value.lower() == "latest":
        return StartingOffsets(LATEST, setting=flag)
    hint = 'use earliest, latest or JSON like {"mytopic": {"0": 23, "1": -2}}'
    parsed = _json(value, flag, hint)
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"{flag} JSON must be a non-empty object; {hint}")
    specific: dict[TopicPartition, int] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise ConfigError(f"{flag}: topic {topic!r} must map to an object; {hint}")
        for part, offset in partitions.items():
            try:
                partition = int(part)
            except ValueError:
                raise ConfigError(
                    f"{flag}: partition {part!r} of topic {topic!r} is not a number; {hint}"
                ) from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2 or partition < 0:
                raise ConfigError(
                    f"{flag}: topic {topic!r} partition {part}: offset {offset!r} must be "
                    "an offset >= 0, -2 (earliest) or -1 (latest)"
                )
            specific[(topic, partition)] = offset
    return StartingOffsets(EARLIEST, specific, setting=flag)


def resolve_starting_offsets(
    starting: StartingOffsets,
    new_partitions: Iterable[PartitionWatermarks],
    known_partitions: Iterable[TopicPartition],
    started_topics: Collection[str] = (),
    timestamp_offsets: Mapping[TopicPartition, int] | None = None,
    subscribed: str = "--topic",
) -> list[StartDecision]:
    """Decide a start offset for each partition that has no committed row.

    ``known_partitions`` is every partition Kafka reports for the job's topics;
    JSON naming any other partition is refused rather than ignored. An explicit
    offset outside what Kafka holds is refused too: it would silently skip or
    invent messages.

    ``--starting-offsets`` is for a job's first run on a topic. A partition
    that appears later in a topic the job already reads (``started_topics``)
    starts at earliest, as in Spark's Kafka source: starting it at latest
    would silently skip whatever was written to it before the job noticed it.

    With ``starting.timestamp_ms`` set, ``timestamp_offsets`` holds Kafka's
    offsets-for-times answer for the new partitions, placed by
    :func:`offset_for_time` (at most the last stable offset; -1: no message
    that late, so the partition starts at its end).

    ``subscribed`` names the way the job subscribes, for the line refusing JSON that names a
    partition Kafka does not report: ``--topic``, ``--topic-pattern`` or ``--assign`` for a job,
    ``subscribe``, ``subscribePattern`` or ``assign`` for the data source.
    """
    known = set(known_partitions)
    unknown = sorted(k for k in starting.specific if k not in known)
    if unknown:
        names = ", ".join(f"{t!r} partition {p}" for t, p in unknown)
        raise ConfigError(
            f"{starting.setting} names {names}, which Kafka does not report for the job's topics; "
            f"check the topic names ({subscribed}) and partition numbers"
        )
    by_time = starting.timestamp_ms is None and bool(starting.timestamps)
    unknown = sorted(k for k in starting.timestamps if k not in known) if by_time else []
    if unknown:
        names = ", ".join(f"{t!r} partition {p}" for t, p in unknown)
        raise ConfigError(
            f"{starting.time_setting} names {names}, which Kafka does not report for the topics read; "
            f"check the topic names ({subscribed}) and partition numbers"
        )
    new_partitions = sorted(new_partitions, key=lambda m: m.key)
    left_out = [
        m.key
        for m in new_partitions
        if by_time and m.topic not in started_topics and m.key not in starting.timestamps
    ]
    if left_out:
        names = ", ".join(f"{t!r} partition {p}" for t, p in left_out)
        raise ConfigError(
            f"{starting.time_setting} leaves out {names}: name a time for every partition of the "
            "topics read, as Spark requires"
        )
    decisions = []
    for marks in new_partitions:
        if marks.topic in started_topics:
            decisions.append(
                StartDecision(
                    marks.topic,
                    marks.partition,
                    marks.low,
                    f"earliest offset {marks.low} (new partition of a started topic)",
                )
            )
            continue
        time_ms = starting.time_of(marks.key)
        if time_ms is not None:
            found = (timestamp_offsets or {}).get(marks.key, -1)
            when = format_timestamp(time_ms)
            if found < 0 and starting.no_message_at_time == ERROR_STRATEGY:
                raise ConfigError(
                    f"{starting.time_setting}: topic {marks.topic!r} partition {marks.partition} has no "
                    f"message at or after {when} (its log holds offsets {marks.low} to {marks.high}); "
                    "give an earlier time, or startingOffsetsByTimestampStrategy latest to start such "
                    "a partition at its end"
                )
            offset = offset_for_time(found, marks)
            decisions.append(
                StartDecision(
                    marks.topic, marks.partition, offset, f"offset {offset} ({starting.time_setting} {when})"
                )
            )
            continue
        chosen = starting.specific.get(marks.key)
        source = (
            "--starting-offsets JSON"
            if chosen is not None
            else ("not named in --starting-offsets JSON" if starting.specific else "--starting-offsets")
        )
        if chosen is None:
            chosen = starting.default
        if chosen == EARLIEST:
            decisions.append(
                StartDecision(
                    marks.topic, marks.partition, marks.low, f"earliest offset {marks.low} ({source})"
                )
            )
        elif chosen == LATEST:
            decisions.append(
                StartDecision(
                    marks.topic, marks.partition, marks.high, f"latest offset {marks.high} ({source})"
                )
            )
        elif marks.low <= chosen <= marks.high:
            decisions.append(
                StartDecision(marks.topic, marks.partition, chosen, f"offset {chosen} ({source})")
            )
        else:
            raise ConfigError(
                f"--starting-offsets: topic {marks.topic!r} partition {marks.partition} offset {chosen} "
                f"is outside what Kafka holds ({marks.low} to {marks.high}); pick an offset in that "
                "range, -2 (earliest) or -1 (latest)"
            )
    return decisions
