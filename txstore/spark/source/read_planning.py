"""What a ``format("txstore")`` read plans: one :class:`~txstore.core.ranges.OffsetRange` per
partition with data, from its options' starting and ending offsets (:func:`plan_read_ranges`) or,
with ``txstore.job``, from the job's committed offsets (:func:`plan_job_ranges`), against Kafka's
watermarks (:func:`read_watermarks`); :func:`plan` asks Kafka (and the database) and plans. The
planning rules are pure functions over frozen dataclasses; the asking is in :func:`plan`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from txstore.core.assignment import assigned_only
from txstore.core.errors import ConfigError, DataLoss, OffsetOutOfLog, UnknownTopic
from txstore.core.patterns import (
    PatternTopics,
    compile_topic_pattern,
    joining_starts,
    resolve_pattern,
)
from txstore.core.ranges import (
    OffsetRange,
    PartitionHistory,
    PartitionWatermarks,
    TopicPartition,
    aged_out,
    plan_ranges,
    split_ranges,
    topic_missing_now,
)
from txstore.core.starting import (
    EARLIEST,
    LATEST,
    StartingOffsets,
    resolve_starting_offsets,
    times_to_look_up,
)
from txstore.kafka.admin import Admin, one_client
from txstore.kafka.client import fetch_topic_names, fetch_watermarks
from txstore.kafka.list_offsets import offsets_for_times
from txstore.kafka.topic_ids import fetch_topic_ids
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.migrate import check_schema
from txstore.spark.source.read_options import ReadOptions

log = logging.getLogger("txstore")


def _resolve(
    option: str, spec: StartingOffsets, marks: PartitionWatermarks, fail_on_data_loss: bool = True
) -> int:
    chosen = spec.specific.get(marks.key, spec.default)
    if chosen == EARLIEST:
        return marks.low
    if chosen == LATEST:
        return marks.high
    where = f"option {option}: topic {marks.topic!r} partition {marks.partition} offset {chosen}"
    if chosen < marks.low and not fail_on_data_loss:
        log.warning(
            "%s is below the log-start offset %d: %d messages aged out of Kafka; read from %d "
            "(failOnDataLoss false)",
            where,
            marks.low,
            marks.low - chosen,
            marks.low,
        )
        return marks.low
    if chosen < marks.low:
        raise DataLoss(
            f"{where} is below the log-start offset {marks.low}: those messages aged out of Kafka; "
            f"use an offset from {marks.low} to {marks.high}, or -2 (earliest)"
        )
    if chosen > marks.high:
        raise OffsetOutOfLog(
            f"{where} is beyond the log-end offset {marks.high}; use an offset from {marks.low} to "
            f"{marks.high}, or -1 (latest)"
        )
    return chosen


def plan_read_ranges(
    options: ReadOptions,
    watermarks: Sequence[PartitionWatermarks],
    by_time: Mapping[TopicPartition, int] | None = None,
) -> list[OffsetRange]:
    """One range per partition with messages between the starting and ending offsets.

    ``by_time``: Kafka's offsets-for-times answers for the partitions that start by time
    (``startingTimestamp``, ``startingOffsetsByTimestamp``; :func:`start_times`).

    Steps, per partition Kafka reports (ordered by topic and partition):
    1. refuse JSON naming a partition Kafka does not report (it would be ignored);
    2. start: the JSON's offset, else the option's default (earliest unless
       ``latest``); end: likewise, defaulting to latest. An explicit offset
       below the log start is refused as :class:`DataLoss` (like Spark's
       ``failOnDataLoss``), one beyond the log end as :class:`OffsetOutOfLog`;
    3. refuse a start after its end; keep the range if it is not empty;
    4. cut them for ``minPartitions``.
    """
    watermarks, _ = assigned_only(options.assignment, watermarks, None, f"option {options.name('assign')}")
    known = {w.key for w in watermarks}
    starting_name, ending_name = options.name("startingOffsets"), options.name("endingOffsets")
    for name, spec in ((starting_name, options.starting), (ending_name, options.ending)):
        unknown = sorted(k for k in spec.specific if k not in known)
        if unknown:
            names = ", ".join(f"{t!r} partition {p}" for t, p in unknown)
            raise ConfigError(f"option {name} names {names}, which Kafka does not report; check the JSON")
    timed = {}
    if options.starting.timestamp_ms is not None or options.starting.timestamps:
        # Where the partitions start by time, as a job's first run would start them.
        decisions = resolve_starting_offsets(
            replace(options.starting, specific={}),
            watermarks,
            known,
            (),
            by_time or {},
            options.subscribed_by,
        )
        timed = {(d.topic, d.partition): d.offset for d in decisions}
    ranges = []
    for marks in sorted(watermarks, key=lambda w: w.key):
        fail = options.fail_on_data_loss
        start = (
            timed[marks.key] if marks.key in timed else _resolve(starting_name, options.starting, marks, fail)
        )
        end = _resolve(ending_name, options.ending, marks, fail)
        if start > end:
            raise ConfigError(
                f"topic {marks.topic!r} partition {marks.partition}: {starting_name} {start} is after "
                f"{ending_name} {end}; give a start at or before the end"
            )
        if start < end:
            ranges.append(OffsetRange(marks.topic, marks.partition, start, end))
    return split_ranges(ranges, options.min_partitions)


def plan_job_ranges(
    job: str,
    committed: Mapping[TopicPartition, int],
    watermarks: Sequence[PartitionWatermarks],
    starting: StartingOffsets,
    by_time: Mapping[TopicPartition, int] | None = None,
    fail_on_data_loss: bool = True,
    resolved: PatternTopics | None = None,
    subscribed: str = "subscribe",
    history: Mapping[TopicPartition, PartitionHistory] | None = None,
    topic_ids: Mapping[str, str] | None = None,
) -> list[OffsetRange]:
    """The ranges job ``job``'s next batch reads, without writing anything.

    Steps, as the job plans (:meth:`txstore.job.TransactionalJob.plan`) but
    in memory: partitions without a committed offset start where the job
    would start them (:func:`~txstore.core.starting.resolve_starting_offsets`:
    ``starting``, earliest by default; a new partition of a topic the job
    already reads at earliest); then :func:`~txstore.core.ranges.plan_ranges`,
    which refuses aged-out or out-of-log offsets exactly as the job does. With a pattern
    (``resolved``), a topic that started matching after the job's first run starts at earliest
    (:func:`~txstore.core.patterns.joining_starts`). ``subscribed``: the option the read subscribes
    by (:attr:`ReadOptions.subscribed_by`), named by the line refusing starting offsets JSON that
    names a partition Kafka does not report. ``history`` (the job's last counted messages and
    stored topic IDs) and ``topic_ids`` (Kafka's now): a topic deleted and recreated is refused
    as the job's own batch refuses it, by its topic ID at planning or by its last counted
    message when the range is read, never read on from the old log's offsets.
    """
    new = [w for w in watermarks if w.key not in committed]
    started = {topic for topic, _ in committed}
    joining = [] if resolved is None else joining_starts(resolved, new, "subscribePattern")
    joined = {(d.topic, d.partition) for d in joining}
    new = [w for w in new if w.key not in joined]
    decisions = joining + resolve_starting_offsets(
        starting, new, [w.key for w in watermarks], started, by_time, subscribed
    )
    planned = dict(committed)
    planned.update({(d.topic, d.partition): d.offset for d in decisions})
    if not fail_on_data_loss:  # read-only: the aged-out offsets are passed over, not recorded
        planned.update({r.key: r.until_offset for r in aged_out(planned, watermarks)})
    return plan_ranges(job, planned, watermarks, history, topic_ids)


def job_committed_state(
    database_url: str, job: str, topics: Sequence[str]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, PartitionHistory]]:
    """The job's committed offsets and each partition's history (last counted message, topic
    ID), read in a read-only transaction (nothing can be written)."""
    with connect(database_url) as conn:
        conn.read_only = True
        check_schema(conn, database_url)
        return store.committed_state(conn, job, topics)


def job_topics(database_url: str, job: str) -> list[str]:
    """Every topic the job has offsets for, read in a read-only transaction."""
    with connect(database_url) as conn:
        conn.read_only = True
        check_schema(conn, database_url)
        return store.job_topics(conn, job)


def resolve_read_topics(
    options: ReadOptions, stored_topics: Sequence[str], admin: Callable[[], Admin]
) -> PatternTopics | None:
    """``subscribePattern`` resolved against Kafka's topics now (with ``stored_topics``, the topics
    a ``txstore.job`` has offsets for); None without a pattern. A pattern that matches no topic
    yet is one INFO line, not an error: there is nothing to read. ``admin``: the plan's client
    (:func:`plan`)."""
    if options.pattern is None:
        return None
    pattern = compile_topic_pattern(options.pattern, f"option {options.name('subscribePattern')}")
    resolved = resolve_pattern(pattern, fetch_topic_names(options.kafka_conf, admin=admin()), stored_topics)
    if not resolved.matched:
        log.info(
            "option %s %r matches no topic on Kafka yet; nothing to read",
            options.name("subscribePattern"),
            options.pattern,
        )
    return resolved


def read_watermarks(
    options: ReadOptions,
    topics: Sequence[str],
    stored: Mapping[TopicPartition, int] | None,
    admin: Callable[[], Admin],
) -> list[PartitionWatermarks]:
    """:func:`fetch_watermarks` of ``topics``. With a pattern, a topic the job has offsets for that
    Kafka no longer has stops the read with the job's vanished-topic line; one that matched a
    moment ago and was deleted since, with no offsets stored, matches nothing now."""
    topics = list(topics)
    while True:
        try:
            return fetch_watermarks(options.kafka_conf, topics, admin=admin())
        except UnknownTopic as e:
            held = sum(1 for t, _ in (stored or {}) if t == e.topic)
            if held and options.job is not None:
                raise topic_missing_now(options.job, e.topic, e.servers, held) from None
            if options.pattern is None or e.topic not in topics:
                raise
            topics.remove(e.topic)


def plan(options: ReadOptions) -> list[OffsetRange]:
    """The ranges to read: I/O (offsets first, then watermarks, as the job does), then pure planning.
    Kafka's topics, log offsets, offsets for times and topic IDs are asked through one admin
    client, made when first asked (a new client waits for its first answer:
    :class:`~txstore.kafka.admin.Admin`)."""
    admin = one_client(options.kafka_conf)
    if options.job is not None:
        assert options.database_url is not None
        resolved = None
        topics: Sequence[str] = options.topics
        if options.pattern is not None:
            resolved = resolve_read_topics(options, job_topics(options.database_url, options.job), admin)
            assert resolved is not None
            topics = resolved.topics
        stored, history = job_committed_state(options.database_url, options.job, topics)
        where = f"option {options.name('assign')}"
        watermarks, committed = assigned_only(
            options.assignment, read_watermarks(options, topics, stored, admin), stored, where
        )
        new = [w.key for w in watermarks if w.key not in committed]
        by_time = start_times(options, new, {t for t, _ in committed}, admin)
        ranges = plan_job_ranges(
            options.job,
            committed,
            watermarks,
            options.starting,
            by_time,
            options.fail_on_data_loss,
            resolved,
            options.subscribed_by,
            history,
            fetch_topic_ids(options.kafka_conf, topics, admin=admin()),
        )
        return split_ranges(ranges, options.min_partitions)
    return _plan_read(options, admin)


def _plan_read(options: ReadOptions, admin: Callable[[], Admin]) -> list[OffsetRange]:
    watermarks = read_watermarks(options, read_topics(options, admin), None, admin)
    reported, _ = assigned_only(options.assignment, watermarks, None, f"option {options.name('assign')}")
    return plan_read_ranges(options, watermarks, start_times(options, [w.key for w in reported], admin=admin))


def start_times(
    options: ReadOptions,
    new: Sequence[TopicPartition],
    started: set[str] | None = None,
    admin: Callable[[], Admin] | None = None,
) -> dict[TopicPartition, int]:
    """Kafka's offsets-for-times answers for the partitions ``new`` that start by time (none asked
    without ``startingTimestamp`` or ``startingOffsetsByTimestamp``). ``admin``: the plan's client."""
    wanted = times_to_look_up(options.starting, new, started or set())
    if not wanted:
        return {}
    return offsets_for_times(options.kafka_conf, wanted, admin=admin() if admin is not None else None)


def read_topics(options: ReadOptions, admin: Callable[[], Admin]) -> tuple[str, ...]:
    """A read's topics (without ``txstore.job``): ``subscribe``'s or ``assign``'s, or what the
    pattern matches now."""
    resolved = resolve_read_topics(options, (), admin)
    return options.topics if resolved is None else resolved.matched


def check_explicit_offsets(options: ReadOptions) -> None:
    """At ``load()``, for a batch read whose ``startingOffsets``/``endingOffsets`` JSON names
    offsets: plan the read once against Kafka's watermarks, so an offset outside the log (or
    a partition Kafka does not have, or a start after its end) fails there in its one line,
    not at the first action inside a long trace. Without explicit offsets (or with
    ``txstore.job``) nothing is asked of Kafka at ``load()``. With a declared schema Spark does
    not call ``schema()``: the same checks then run when the read is planned."""
    explicit = any(o >= 0 for spec in (options.starting, options.ending) for o in spec.specific.values())
    by_time = options.starting.timestamp_ms is not None or bool(options.starting.timestamps)
    if (explicit or by_time) and options.job is None:
        _plan_read(options, one_client(options.kafka_conf))
