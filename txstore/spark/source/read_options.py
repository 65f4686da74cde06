"""The options of ``format("txstore")``: their names, as Spark and txstore spell them, parsed and
checked into a frozen :class:`ReadOptions` (:func:`parse_read_options`), a pure function: every
problem is one :class:`~txstore.core.errors.ConfigError` line naming the option. The stream's
options (:mod:`txstore.spark.stream.stream_options`) are these and its own.

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
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from txstore.core.assignment import check_assigned_starts, parse_assignment
from txstore.core.errors import ConfigError
from txstore.core.patterns import (
    compile_topic_pattern,
    matches,
)
from txstore.core.starting import (
    EARLIEST,
    LATEST,
    StartingOffsets,
    parse_starting_offsets,
    parse_time_strategy,
    parse_timestamp,
    parse_timestamps_json,
)
from txstore.kafka.client_settings import client_config, java_only_problem, topic_name_problem
from txstore.postgres.db import DATABASE_URL_ENV, resolve_database_url
from txstore.spark.source.source_columns import KAFKA_SOURCE_COLUMNS, WITHOUT_HEADERS

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
