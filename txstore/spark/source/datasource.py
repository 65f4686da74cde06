"""``spark.read.format("txstore")``: Kafka as a DataFrame, on classic Spark and Spark Connect.

A PySpark Python data source (``pyspark.sql.datasource``, PySpark 4.0 or
newer), registered with :func:`register` (``spark.dataSource.register``, so
it works under Spark Connect too, where there is no ``sparkContext`` and no
RDD). It reads like Spark's own Kafka batch source and has its columns
(:func:`txstore.spark.source.source_columns.kafka_source_schema`)::

    txstore.register(spark)
    df = (spark.read.format("txstore")
          .option("kafka.bootstrap.servers", "kafka:9092")
          .option("subscribe", "events,orders")
          .load())

Options (names are case-insensitive, values strings, as Spark passes them; Spark hands them
over lower-cased, so an error line names an option as documented, :func:`option_names`):

- ``kafka.bootstrap.servers`` (required), ``subscribe`` (comma-separated
  topics), ``subscribePattern`` (a regular expression whole topic names match, Python's ``re``
  syntax, resolved when the read is planned; :mod:`txstore.core.patterns`) or ``assign``
  (Spark's JSON ``{"topicA": [0, 1]}``: only those partitions are planned and read;
  :mod:`txstore.core.assignment`), one of them;
- ``startingOffsets``: ``earliest`` (default), ``latest``, or Spark's JSON
  ``{"topicA": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest); partitions the
  JSON does not name start at earliest;
- ``startingTimestamp`` (epoch milliseconds, or ISO-8601 with a zone) or
  ``startingOffsetsByTimestamp`` (Spark's JSON ``{"topicA": {"0": 1767225600000}}``, naming
  every partition read): start at the first message at or after the time (Kafka's
  offsets-for-times, capped at the last stable offset); ``startingOffsetsByTimestampStrategy``
  ``error`` (default, as in Spark) refuses a partition with no message that late, ``latest``
  starts it at its end. Spark's precedence: ``startingTimestamp``, then
  ``startingOffsetsByTimestamp``, then ``startingOffsets``. With ``txstore.job`` (and in the
  stream) only for a topic the job has never started, like the jobs' ``--starting-timestamp``;
- ``endingOffsets``: ``latest`` (default) or JSON (-1 latest, or an offset);
  partitions the JSON does not name end at latest. Offsets are exclusive ends;
- ``minPartitions``: cut big partitions' ranges so there are at least this
  many Spark tasks;
- ``kafka.*``: any other librdkafka setting for the client (TLS, SASL), with
  the ``kafka.`` prefix stripped; the settings that make reads exact
  (:data:`READER_FIXED_SETTINGS`) are refused, and so are ``kafka.group.id`` and
  ``groupIdPrefix`` (the source joins and commits to no consumer group) and the Java client's
  JKS and JAAS settings (:func:`~txstore.kafka.client_settings.java_only_setting`), naming the PEM
  settings librdkafka takes instead;
- ``txstore.job`` (with ``txstore.databaseUrl``, default the
  ``TXSTORE_DATABASE_URL`` environment variable of the process that plans
  the read): instead of start and end offsets, read exactly the ranges that
  job's next batch would read (without ``--max-offsets-per-batch``): from
  its committed offsets in ``txn_offsets`` to Kafka's log end. Read-only:
  no offset row is created and nothing is committed. A partition the job
  has never committed starts where the job would start it: earliest, or
  per ``startingOffsets`` given as the job's ``--starting-offsets``;
- ``includeHeaders``: ``true`` adds the ``headers`` column, as in Spark's
  source (default ``false``: no ``headers`` column);
- ``failOnDataLoss``: ``true`` (default): an offset Kafka no longer has (aged out, deleted)
  raises :class:`DataLoss`; ``false``: a batch read starts such a partition at its log start
  instead (as Spark's source does), and a stream skips the lost offsets and records them in
  ``txn_lost_ranges`` (:mod:`txstore.spark.stream.stream_source`), as the jobs'
  ``--fail-on-data-loss false``. Any other option is refused.

Columns: Spark's Kafka-source columns (``headers`` only with ``includeHeaders``), or only those a schema names
(``.schema("topic string, timestamp timestamp")``, any order, Spark's types;
:func:`schema_columns`). Spark cannot prune a Python reader's columns itself,
so this is how a query that needs two columns stops paying for keys, values
and headers: only the named columns are built and handed to Spark.

Lowest PySpark: 4.0 (Python data sources, and ``read`` yielding Arrow
batches); tested with 4.3.

Steps: ``schema()`` checks the options (so a bad option fails at
``load()``); ``partitions()`` runs once when Spark plans the read, in a
Python worker of the driver (the Connect server under Connect): it asks
Kafka for the watermarks (and the database for the job's offsets) and plans
one :class:`~txstore.core.ranges.OffsetRange` per partition with data, each in
its own :class:`RangePartition`; ``read(partition)`` runs in a task and
yields one Arrow record batch (:func:`txstore.spark.source.arrow.messages_to_record_batch`)
per batch of messages the :class:`~txstore.kafka.reader.RangeReader` delivers, so
no row ever becomes a Python tuple. A task retried by Spark reads the same
range again.

Option parsing and planning are pure functions over frozen dataclasses
(:func:`parse_read_options`, :func:`plan_read_ranges`, :func:`plan_job_ranges`).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from txstore.core.assignment import assigned_only, check_assigned_starts, parse_assignment
from txstore.core.errors import ConfigError, DataLoss, OffsetOutOfLog, UnknownTopic
from txstore.core.patterns import (
    PatternTopics,
    compile_topic_pattern,
    joining_starts,
    matches,
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
    parse_starting_offsets,
    parse_time_strategy,
    parse_timestamp,
    parse_timestamps_json,
    resolve_starting_offsets,
    times_to_look_up,
)
from txstore.kafka.client import fetch_topic_names, fetch_watermarks, offsets_for_times
from txstore.kafka.client_settings import client_config, java_only_problem, topic_name_problem
from txstore.kafka.reader import RangeReader
from txstore.kafka.topic_ids import fetch_topic_ids
from txstore.postgres import store
from txstore.postgres.db import DATABASE_URL_ENV, connect, resolve_database_url
from txstore.postgres.migrate import check_schema
from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS, WITHOUT_HEADERS

log = logging.getLogger("txstore")

FORMAT = "txstore"

READER_FIXED_SETTINGS = (
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "enable.partition.eof",
)
"""librdkafka settings the reader fixes (read_committed, no commits, fail on aged-out offsets)."""

SPARK_OPTION_NAMES = (
    "kafka.bootstrap.servers",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "startingOffsetsByTimestamp",
    "startingTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingOffsetsByTimestamp",
    "endingTimestamp",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "groupIdPrefix",
    "kafka.group.id",
    "includeHeaders",
)
"""Every option of Spark's Kafka source (``format("kafka")``), as Spark's documentation spells it."""
TXSTORE_OPTION_NAMES = (
    "txstore.job",
    "txstore.databaseUrl",
    "txstore.countMessages",
    "txstore.tasks",
    "txstore.failpoints",
)
SPELLING = {name.lower(): name for name in (*SPARK_OPTION_NAMES, *TXSTORE_OPTION_NAMES)}
"""Lower-cased option name -> its documented spelling (Spark hands a data source its options'
names lower-cased, ``pyspark.sql.datasource.CaseInsensitiveDict``)."""

_CONSUMER_GROUPS = ("kafka.group.id", "groupidprefix")
_JAVA_CONSUMER = (
    "is a setting of the Java consumer of Spark's source; txstore reads with librdkafka, which "
    "waits and retries by its own kafka.* settings; drop the option"
)
NOT_TAKEN = {
    "endingoffsetsbytimestamp": "is not supported yet; give endingOffsets as JSON offsets",
    "endingtimestamp": "is not supported yet; give endingOffsets as JSON offsets",
    "maxrecordsperpartition": "is not supported yet; give minPartitions (the fewest Spark tasks) instead",
    "kafkaconsumer.polltimeoutms": _JAVA_CONSUMER,
    "fetchoffset.numretries": _JAVA_CONSUMER,
    "fetchoffset.retryintervalms": _JAVA_CONSUMER,
    "maxoffsetspertrigger": "is an option of readStream.format('txstore'), not of a batch read; drop it",
    "minoffsetspertrigger": "is not supported: a micro-batch reads what Kafka has, up to "
    "maxOffsetsPerTrigger; drop the option",
    "maxtriggerdelay": "is not supported: a micro-batch reads what Kafka has, up to "
    "maxOffsetsPerTrigger; drop the option",
}
"""Spark's Kafka-source options format('txstore') does not take, each with the rest of its line."""
_KNOWN = (
    "kafka.bootstrap.servers",
    "subscribe",
    "subscribepattern",
    "assign",
    "startingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "endingoffsets",
    "minpartitions",
    "txstore.job",
    "txstore.databaseurl",
    "includeheaders",
    "failondataloss",
)
_SUPPORTED = (
    "kafka.bootstrap.servers, subscribe, subscribePattern or assign, startingOffsets, startingTimestamp, "
    "startingOffsetsByTimestamp (and its Strategy), endingOffsets, minPartitions, "
    "includeHeaders, failOnDataLoss, txstore.job, txstore.databaseUrl, and kafka.* client settings"
)


def option_names(options: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased option name -> the name to show in an error line: as typed when the caller
    kept its case (a dict passed directly), else as documented (:data:`SPELLING`: Spark passes a
    data source its options' names lower-cased, so ``subscribePattern`` arrives as
    ``subscribepattern``), else as given."""
    names: dict[str, str] = {}
    for key in options:
        typed = str(key)
        lowered = typed.lower()
        names[lowered] = typed if typed != lowered else SPELLING.get(lowered, typed)
    return names


def shown(names: Mapping[str, str], name: str) -> str:
    """Option ``name`` (any case) as :func:`option_names` shows it; documented if not given."""
    lowered = name.lower()
    return names.get(lowered) or SPELLING.get(lowered, name)


def _did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), list(SPELLING), n=1, cutoff=0.75)
    return f" (did you mean {SPELLING[close[0]]}?)" if close else ""


@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, checked. ``starting``/``ending`` use -2 earliest, -1 latest."""

    topics: tuple[str, ...]
    bootstrap_servers: str
    kafka_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold passwords
    starting: StartingOffsets = field(default_factory=StartingOffsets)
    ending: StartingOffsets = field(default_factory=lambda: StartingOffsets(LATEST))
    min_partitions: int | None = None
    job: str | None = None
    database_url: str | None = field(default=None, repr=False)  # holds the password
    # lower-cased option name -> as shown in error lines (option_names)
    names: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    include_headers: bool = False  # includeHeaders: the headers column, as in Spark's source
    # assign: topic -> the only partitions read (txstore.core.assignment); None: all of subscribe's
    assignment: Mapping[str, tuple[int, ...]] | None = None
    # failOnDataLoss: false skips offsets Kafka no longer has (a stream records them in txn_lost_ranges)
    fail_on_data_loss: bool = True
    # subscribePattern: the topics are Kafka's that match, resolved at each read (txstore.core.patterns)
    pattern: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """The source's columns when no schema is declared: Spark's, ``headers`` only with
        ``includeHeaders``."""
        return KAFKA_SOURCE_COLUMNS if self.include_headers else WITHOUT_HEADERS

    def name(self, option: str) -> str:
        """``option`` as the caller spelled it, for an error line (:func:`shown`)."""
        return shown(self.names, option)

    @property
    def subscribed_by(self) -> str:
        """The option the read subscribes by, as spelled (:meth:`name`), for lines that ask to
        check it: ``subscribePattern``, ``assign`` or ``subscribe``."""
        if self.pattern is not None:
            return self.name("subscribePattern")
        return self.name("subscribe" if self.assignment is None else "assign")

    @property
    def kafka_conf(self) -> dict[str, Any]:
        return client_config(self.bootstrap_servers, self.kafka_options)


def _parse_fail_on_data_loss(text: str | None, name: str) -> bool:
    value = (text or "true").strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(
            f"option {name} must be true (stop on offsets Kafka no longer has, the default) or false "
            f"(skip them), got {text!r}"
        )
    return value == "true"


def _parse_include_headers(text: str | None, name: str) -> bool:
    value = (text or "false").strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {name} must be true or false, got {text!r}")
    return value == "true"


def parse_read_options(options: Mapping[str, str], environ: Mapping[str, str]) -> ReadOptions:
    """Check the options Spark passes (any case) and return them parsed.

    Raises :class:`ConfigError` with one line naming the option for: a missing
    ``kafka.bootstrap.servers`` or ``subscribe``, an unknown option, a
    reader-fixed ``kafka.*`` setting, malformed offsets JSON, JSON naming a
    topic not subscribed, ``endingOffsets`` at earliest, and ``txstore.job``
    with ``endingOffsets`` or without a database URL. ``environ`` supplies
    ``TXSTORE_DATABASE_URL``.
    """
    given = {str(k).lower(): str(v) for k, v in options.items()}
    names = option_names(options)

    def name_of(option: str) -> str:
        return shown(names, option)

    kafka_options: dict[str, str] = {}
    for name, value in sorted(given.items()):
        if name in _CONSUMER_GROUPS:
            raise ConfigError(
                f"option {name_of(name)} is refused: format('txstore') joins and commits to no Kafka "
                "consumer group (its reads are assigned ranges; a txstore.job's offsets are in "
                "PostgreSQL, txn_offsets), so a group would be named and never used; drop the option"
            )
        if name.startswith("kafka."):
            setting = name[len("kafka.") :]
            if setting in READER_FIXED_SETTINGS:
                raise ConfigError(
                    f"option {name_of(name)} cannot be set: the txstore reader fixes it "
                    "(read_committed, no offset commits, fail on aged-out offsets); drop the option"
                )
            if setting != "bootstrap.servers":
                kafka_options[setting] = value
        elif name in NOT_TAKEN:
            raise ConfigError(f"option {name_of(name)} {NOT_TAKEN[name]}")
        elif name not in _KNOWN:
            raise ConfigError(
                f"unknown option {name_of(name)!r} for format('txstore'){_did_you_mean(name)}; "
                f"it takes {_SUPPORTED}"
            )

    java_only = java_only_problem(
        {names[f"kafka.{k}"][len("kafka.") :]: v for k, v in kafka_options.items()}, "option kafka."
    )
    if java_only:
        raise ConfigError(java_only)
    servers = given.get("kafka.bootstrap.servers", "").strip()
    if not servers:
        raise ConfigError(
            f"option {name_of('kafka.bootstrap.servers')} is required: "
            ".option('kafka.bootstrap.servers', 'host:9092')"
        )
    subscribe, assign = name_of("subscribe"), name_of("assign")
    subscribe_pattern = name_of("subscribePattern")
    if "subscribe" in given and "assign" in given:
        raise ConfigError(
            f"give one of option {subscribe} and option {assign}, not both (as in Spark): the topics "
            "to read, or the partitions"
        )
    for other in ("subscribe", "assign"):
        if other in given and "subscribepattern" in given:
            raise ConfigError(
                f"give one of option {name_of(other)} and option {subscribe_pattern}, not both (as in "
                "Spark): the topics to read, or a regular expression their names match"
            )
    assignment = None
    pattern = None
    if "subscribepattern" in given:
        pattern = given["subscribepattern"]
        compile_topic_pattern(pattern, f"option {subscribe_pattern}")
        topics: tuple[str, ...] = ()
    elif "assign" in given:
        assignment = parse_assignment(given["assign"], f"option {assign}")
        topics = tuple(assignment)
    else:
        topics = tuple(t.strip() for t in given.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise ConfigError(
                f"option {subscribe} (or {assign}) is required: .option('subscribe', 'topicA,topicB'), "
                f"or a regular expression: .option('{subscribe_pattern}', 'topic.*')"
            )
        if len(set(topics)) != len(topics):
            raise ConfigError(f"option {subscribe} names a topic twice: {given['subscribe']!r}")
    for topic in topics:
        problem = topic_name_problem(topic)
        if problem:
            raise ConfigError(f"option {assign if assignment else subscribe}: {problem}")

    starting_name, ending_name = name_of("startingOffsets"), name_of("endingOffsets")
    starting = parse_starting_offsets(given.get("startingoffsets", "earliest"), f"option {starting_name}")
    starting = _by_time(given, name_of, starting)
    ending = _parse_ending(given.get("endingoffsets"), ending_name)
    by_time_name = name_of("startingOffsetsByTimestamp")
    for name, named in (
        (starting_name, starting.specific),
        (by_time_name, starting.timestamps),
        (ending_name, ending.specific),
    ):
        if assignment is not None:
            check_assigned_starts(assignment, named, f"option {assign}", f"option {name}")
        if pattern is not None:
            compiled = compile_topic_pattern(pattern, f"option {subscribe_pattern}")
            unmatched = sorted({t for t, _ in named if not matches(compiled, t)})
            if unmatched:
                raise ConfigError(
                    f"option {name} names topics option {subscribe_pattern} {pattern!r} does not "
                    f"match: {', '.join(map(repr, unmatched))}; remove them from the JSON"
                )
            continue
        strangers = sorted({t for t, _ in named} - set(topics))
        if strangers:
            raise ConfigError(
                f"option {name} names topics that are not subscribed: {', '.join(map(repr, strangers))}; "
                f"add them to option {subscribe} or remove them from the JSON"
            )

    min_partitions = _parse_min_partitions(given.get("minpartitions"), name_of("minPartitions"))
    include_headers = _parse_include_headers(given.get("includeheaders"), name_of("includeHeaders"))
    fail_on_data_loss = _parse_fail_on_data_loss(given.get("failondataloss"), name_of("failOnDataLoss"))
    job = given.get("txstore.job", "").strip() or None
    database_url = None
    if job is not None:
        if "endingoffsets" in given:
            raise ConfigError(
                f"option {ending_name} cannot be combined with {name_of('txstore.job')} {job!r}: "
                "the job's next batch reads to the log end"
            )
        url = given.get("txstore.databaseurl") or environ.get(DATABASE_URL_ENV)
        if not url:
            raise ConfigError(
                f"option {name_of('txstore.job')} {job!r} needs the job's database: "
                f".option('txstore.databaseUrl', 'postgresql://...') or {DATABASE_URL_ENV} "
                "where Spark plans the read"
            )
        database_url = resolve_database_url(url)
    return ReadOptions(
        topics,
        servers,
        kafka_options,
        starting,
        ending,
        min_partitions,
        job,
        database_url,
        names,
        include_headers,
        assignment,
        fail_on_data_loss,
        pattern,
    )


def _by_time(given: Mapping[str, str], name_of: Any, starting: StartingOffsets) -> StartingOffsets:
    """``startingTimestamp`` (one time for every partition) or ``startingOffsetsByTimestamp`` (a
    time per partition) on ``starting``, with ``startingOffsetsByTimestampStrategy`` (``error``, as
    in Spark, or ``latest``). Spark's precedence: ``startingTimestamp``, then
    ``startingOffsetsByTimestamp``, then ``startingOffsets``."""
    strategy = parse_time_strategy(
        given.get("startingoffsetsbytimestampstrategy"),
        f"option {name_of('startingOffsetsByTimestampStrategy')}",
    )
    if "startingtimestamp" in given:
        name = f"option {name_of('startingTimestamp')}"
        return replace(
            starting,
            timestamp_ms=parse_timestamp(given["startingtimestamp"], name),
            no_message_at_time=strategy,
            time_setting=name,
        )
    if "startingoffsetsbytimestamp" in given:
        name = f"option {name_of('startingOffsetsByTimestamp')}"
        return replace(
            starting,
            timestamps=parse_timestamps_json(given["startingoffsetsbytimestamp"], name),
            no_message_at_time=strategy,
            time_setting=name,
        )
    return starting


def _parse_ending(text: str | None, name: str = "endingOffsets") -> StartingOffsets:
    if text is None:
        return StartingOffsets(LATEST)
    if text.strip().lower() == "earliest":
        raise ConfigError(f"option {name} cannot be earliest; use latest or JSON offsets")
    parsed = parse_starting_offsets(text, f"option {name}")
    for (topic, partition), offset in sorted(parsed.specific.items()):
        if offset == EARLIEST:
            raise ConfigError(
                f"option {name}: topic {topic!r} partition {partition}: -2 (earliest) is not "
                "an end; use -1 (latest) or an offset"
            )
    return replace(parsed, default=LATEST)  # partitions the JSON does not name end at latest


def _parse_min_partitions(text: str | None, name: str = "minPartitions") -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"option {name} must be a whole number of at least 1, got {text!r}")
    return value


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


def resolve_read_topics(options: ReadOptions, stored_topics: Sequence[str] = ()) -> PatternTopics | None:
    """``subscribePattern`` resolved against Kafka's topics now (with ``stored_topics``, the topics
    a ``txstore.job`` has offsets for); None without a pattern. A pattern that matches no topic
    yet is one INFO line, not an error: there is nothing to read."""
    if options.pattern is None:
        return None
    pattern = compile_topic_pattern(options.pattern, f"option {options.name('subscribePattern')}")
    resolved = resolve_pattern(pattern, fetch_topic_names(options.kafka_conf), stored_topics)
    if not resolved.matched:
        log.info(
            "option %s %r matches no topic on Kafka yet; nothing to read",
            options.name("subscribePattern"),
            options.pattern,
        )
    return resolved


def read_watermarks(
    options: ReadOptions, topics: Sequence[str], stored: Mapping[TopicPartition, int] | None = None
) -> list[PartitionWatermarks]:
    """:func:`fetch_watermarks` of ``topics``. With a pattern, a topic the job has offsets for that
    Kafka no longer has stops the read with the job's vanished-topic line; one that matched a
    moment ago and was deleted since, with no offsets stored, matches nothing now."""
    topics = list(topics)
    while True:
        try:
            return fetch_watermarks(options.kafka_conf, topics)
        except UnknownTopic as e:
            held = sum(1 for t, _ in (stored or {}) if t == e.topic)
            if held and options.job is not None:
                raise topic_missing_now(options.job, e.topic, e.servers, held) from None
            if options.pattern is None or e.topic not in topics:
                raise
            topics.remove(e.topic)


def plan(options: ReadOptions) -> list[OffsetRange]:
    """The ranges to read: I/O (offsets first, then watermarks, as the job does), then pure planning."""
    if options.job is not None:
        assert options.database_url is not None
        resolved = None
        topics: Sequence[str] = options.topics
        if options.pattern is not None:
            resolved = resolve_read_topics(options, job_topics(options.database_url, options.job))
            assert resolved is not None
            topics = resolved.topics
        stored, history = job_committed_state(options.database_url, options.job, topics)
        where = f"option {options.name('assign')}"
        watermarks, committed = assigned_only(
            options.assignment, read_watermarks(options, topics, stored), stored, where
        )
        new = [w.key for w in watermarks if w.key not in committed]
        by_time = start_times(options, new, {t for t, _ in committed})
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
            fetch_topic_ids(options.kafka_conf, topics),
        )
        return split_ranges(ranges, options.min_partitions)
    return _plan_read(options)


def _plan_read(options: ReadOptions) -> list[OffsetRange]:
    watermarks = read_watermarks(options, read_topics(options))
    reported, _ = assigned_only(options.assignment, watermarks, None, f"option {options.name('assign')}")
    return plan_read_ranges(options, watermarks, start_times(options, [w.key for w in reported]))


def start_times(
    options: ReadOptions, new: Sequence[TopicPartition], started: set[str] | None = None
) -> dict[TopicPartition, int]:
    """Kafka's offsets-for-times answers for the partitions ``new`` that start by time (none asked
    without ``startingTimestamp`` or ``startingOffsetsByTimestamp``)."""
    wanted = times_to_look_up(options.starting, new, started or set())
    return offsets_for_times(options.kafka_conf, wanted) if wanted else {}


def read_topics(options: ReadOptions) -> tuple[str, ...]:
    """A read's topics (without ``txstore.job``): ``subscribe``'s or ``assign``'s, or what the
    pattern matches now."""
    resolved = resolve_read_topics(options)
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
        _plan_read(options)


def schema_columns(schema: Any, include_headers: bool = True) -> tuple[str, ...]:
    """The Kafka-source columns a user-given schema (``.schema(...)``) names, checked.

    Each field must be one of the Kafka-source columns, with its Spark type
    (nullability aside); a column that can be null (``key``, ``value``,
    ``timestamp``, ``headers``) cannot be declared NOT NULL; ``headers`` only
    with ``include_headers`` (option ``includeHeaders``). Anything else is
    :class:`ConfigError`, one line naming the column.
    """
    from txstore.spark.source.source_columns import kafka_source_schema

    ours = kafka_source_schema()
    names: list[str] = []
    for f in schema.fields:
        if f.name not in ours.names:
            raise ConfigError(
                f"schema: {f.name!r} is not a column of format('txstore'); name some of "
                f"{', '.join(ours.names)}, or leave out .schema() for all of them"
            )
        expected = ours[f.name]
        if f.dataType.simpleString() != expected.dataType.simpleString():
            raise ConfigError(
                f"schema: column {f.name} is {expected.dataType.simpleString()}, not "
                f"{f.dataType.simpleString()}; declare it as {f.name} {expected.dataType.simpleString()} "
                "and cast it after load()"
            )
        if expected.nullable and not f.nullable:
            raise ConfigError(f"schema: column {f.name} can be null; do not declare it NOT NULL")
        if f.name == "headers" and not include_headers:
            raise ConfigError(
                "schema: column headers is there only with .option('includeHeaders', 'true'), as in "
                "Spark's Kafka source; add the option or leave headers out of the schema"
            )
        names.append(f.name)
    if len(set(names)) != len(names):
        raise ConfigError(f"schema: a column is named twice: {', '.join(names)}")
    if not names:
        raise ConfigError("schema: no columns; name at least one, or leave out .schema() for all of them")
    return tuple(names)


class RangePartition(InputPartition):  # type: ignore[misc]
    """One Spark task's input: an offset range, fixed when the read was planned."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


class RangesPartition(InputPartition):  # type: ignore[misc]
    """One Spark task's input: neighbouring offset ranges, read in order, fixed when the read was
    planned (a streaming micro-batch's run of ranges, :func:`~txstore.core.ranges.group_ranges`)."""

    def __init__(self, ranges: Sequence[OffsetRange]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)


def partition_ranges(partition: InputPartition) -> tuple[OffsetRange, ...]:
    """The ranges a task reads: a :class:`RangePartition`'s one, a :class:`RangesPartition`'s
    all; none for Spark's ``InputPartition(None)`` (an empty read)."""
    if isinstance(partition, RangesPartition):
        return partition.ranges
    if isinstance(partition, RangePartition):
        return (partition.range,)
    return ()


class TxstoreReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: ReadOptions, schema: Any) -> None:
        self.options = options
        self.columns = schema_columns(schema, options.include_headers)
        self.schema = schema  # Spark's, for the Arrow schema Spark expects (its nullability)

    def partitions(self) -> list[InputPartition]:
        """Plan the ranges (once, when Spark plans the read); none means an empty DataFrame."""
        return [RangePartition(r) for r in plan(self.options)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from txstore.spark.source.arrow import arrow_schema

        # Nothing to read for Spark's InputPartition(None) (it stands for an empty partitions()).
        ranges = partition_ranges(partition)
        if not ranges:
            return
        built = arrow_schema(self.columns)
        expected = _spark_arrow_schema(self.schema)
        # A declared schema may differ from the source's in nullability only: a free cast.
        cast = None if built.equals(expected) else expected
        conf = self.options.kafka_conf
        for offset_range in ranges:  # in the planned order
            # Spark may stop pulling early (limit): the garbage collector is paused per batch only.
            reader = RangeReader(conf, offset_range, job=self.options.job or "", pause_gc=False)
            yield from self.read_range(reader, built, cast)

    def read_range(self, reader: RangeReader, built: Any = None, cast: Any = None) -> Iterator[Any]:
        """One range's messages as record batches of the read's columns (``reader.messages`` and
        ``reader.last`` tell what was read, once they are all yielded)."""
        from txstore.spark.source.arrow import arrow_schema, coalesce, record_batches

        if built is None:
            built = arrow_schema(self.columns)
            expected = _spark_arrow_schema(self.schema)
            cast = None if built.equals(expected) else expected
        for batch in coalesce(record_batches(reader, built, reader.range.key)):
            yield batch if cast is None else batch.cast(cast)


def _spark_arrow_schema(schema: Any) -> Any:
    """The Arrow schema PySpark expects ``read`` to yield for ``schema`` (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")  # PySpark 4.1+, as it checks the batches
    except TypeError:  # PySpark 4.0: no timezone argument; timestamps are UTC by default
        return to_arrow_schema(schema)
