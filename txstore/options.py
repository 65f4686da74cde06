"""Job options, defined once and shared by ``jobs/*.py``, the ``txstore`` CLI and the library."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from txstore.core.env import BOOTSTRAP_ENV, DATABASE_URL_ENV
from txstore.core.errors import ConfigError

if TYPE_CHECKING:
    from txstore.job import JobSettings

# The job's modules (PySpark, confluent_kafka, psycopg behind them) are imported by the functions
# that need them: the ``txstore`` command builds its parser (``--help``, a typo) without them.

SPARK_REMOTE_ENV = "SPARK_REMOTE"
"""Spark Connect's own variable: a job run with it set talks to that server (``sc://host:port``)."""
CONNECT_TIMEOUT = 30.0
"""Seconds a job waits for a Spark Connect server to answer before it gives up (``--connect-timeout``)."""


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value == "true"


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """Where PostgreSQL and Kafka are: shared by every job and every ``txstore`` command."""
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get(BOOTSTRAP_ENV),
        help=f"Kafka bootstrap servers, host:port[,host:port] (env {BOOTSTRAP_ENV})",
    )
    parser.add_argument(
        "--database-url",
        help=f"PostgreSQL URL, postgresql://user:password@host:5432/db (env {DATABASE_URL_ENV})",
    )
    parser.add_argument(
        "--kafka-option",
        dest="kafka_options",
        action="append",
        type=key_value,
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting for the Kafka clients (TLS, SASL); repeatable",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def add_check_options(parser: argparse.ArgumentParser) -> None:
    """``txstore status --check``: judge each partition (:mod:`txstore.core.health`), exit 0/1/2/3."""
    parser.add_argument(
        "--check",
        action="store_true",
        help="judge each partition like Burrow (OK, WARN, STALL, STOP, ERR), print one line per "
        "problem and exit 0 (all OK), 1 (WARN), 2 (STALL, STOP or ERR) or 3 (lag unknown: no answer from Kafka)",
    )
    parser.add_argument(
        "--stall-after",
        type=_positive_seconds,
        default=None,  # txstore.core.health.STALL_AFTER, not imported to build the parser
        metavar="SECONDS",
        help="with --check: a running job whose lag has waited longer with no commit is STALL: since the "
        "last commit, or since its oldest uncounted message was written if later (default 300)",
    )


def add_job_options(parser: argparse.ArgumentParser, default_job: str) -> None:
    """Add the flags every txstore job takes."""
    from txstore.job import COMMIT_MODES, PER_RANGE, SINKS, TRANSACTIONAL
    from txstore.kafka.bad_messages import FAIL, ON_BAD_MESSAGE
    from txstore.postgres.sink import PUBLISH_MAX_BYTES
    from txstore.report.logformat import LOG_FORMATS, TEXT

    add_connection_options(parser)
    parser.add_argument(
        "--topic",
        dest="topics",
        action="append",
        metavar="TOPIC",
        help="Kafka topic to read; repeat for several topics (or --assign)",
    )
    parser.add_argument(
        "--assign",
        metavar="JSON",
        help='instead of --topic: only these partitions, as Spark\'s assign option, {"topic": [0, 1]}; '
        "two jobs may split a topic's partitions, each counting its own",
    )
    parser.add_argument(
        "--topic-pattern",
        metavar="REGEX",
        help="instead of --topic: every topic whose whole name matches REGEX (Python re syntax; "
        "Spark's subscribePattern), resolved every batch; a topic that starts matching later "
        "joins at its earliest offset",
    )
    parser.add_argument(
        "--job",
        default=default_job,
        help=f"job name: the key of this job's offsets and results (default {default_job})",
    )
    parser.add_argument(
        "--starting-offsets",
        default="earliest",
        help="where partitions never committed start: earliest (default), latest, or JSON "
        '{"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest; unnamed partitions: earliest)',
    )
    parser.add_argument(
        "--starting-timestamp",
        metavar="TIME",
        help="instead of --starting-offsets: partitions never committed start at their first message "
        "at or after TIME (ISO-8601 with a zone, or epoch milliseconds)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--once",
        action="store_true",
        help="run one batch from the committed offsets to the current end, then exit (default)",
    )
    mode.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="run a batch every SECONDS until SIGTERM or Ctrl-C (the current batch finishes first)",
    )
    parser.add_argument(
        "--max-offsets-per-batch",
        type=int,
        metavar="N",
        help="cap a batch at about N offsets, split across partitions by backlog (Spark's maxOffsetsPerTrigger)",
    )
    parser.add_argument(
        "--fail-on-data-loss",
        type=_boolean,
        default=True,
        metavar="true|false",
        help="messages that aged out of Kafka before they were counted stop the job (true, the default), "
        "or are skipped and recorded in txn_lost_ranges with a warning (false)",
    )
    parser.add_argument(
        "--commit-to-kafka-group",
        metavar="GROUP",
        help="after each database commit, also commit the offsets to this Kafka consumer group so Kafka "
        "tooling and lag monitors see progress (the database stays the source of truth)",
    )
    parser.add_argument(
        "--max-batch-failures",
        type=int,
        default=3,
        metavar="N",
        help="with --interval: give up after N failed batches in a row (default 3)",
    )
    parser.add_argument(
        "--commit",
        choices=COMMIT_MODES,
        default=PER_RANGE,
        help="per-range (default): each Spark task commits its Kafka partition's range; per-batch: "
        "tasks aggregate, the driver sums across partitions, and commits the whole batch "
        "in one transaction",
    )
    parser.add_argument(
        "--min-partitions",
        type=int,
        metavar="N",
        help="with --commit per-batch: split big partitions' ranges so a batch runs at least N Spark tasks",
    )
    parser.add_argument(
        "--sink",
        choices=SINKS,
        default=TRANSACTIONAL,
        help="transactional (default): aggregate results committed with the offsets; idempotent: store "
        "each message under its (topic, partition, offset) in txn_messages, insert-or-ignore",
    )
    parser.add_argument(
        "--publish-topic",
        metavar="TOPIC",
        help="also publish committed results to this Kafka topic, through the txn_outbox table "
        "(at least once, each message keyed job/topic/partition/until/<commit>/<part> for deduplication)",
    )
    parser.add_argument(
        "--publish-max-bytes",
        type=int,
        default=PUBLISH_MAX_BYTES,
        metavar="N",
        help=f"with --publish-topic: split a commit's results into messages of at most N bytes "
        f"(default {PUBLISH_MAX_BYTES}, half of Kafka's default maximum message size)",
    )
    parser.add_argument(
        "--on-bad-message",
        choices=ON_BAD_MESSAGE,
        default=FAIL,
        help="a message the aggregate (or transform) fails on every time: fail (default) stops the job with "
        "one line naming its topic, partition and offset; skip records it in txn_bad_messages with the "
        "range's commit, counts every other message, and logs a warning",
    )
    parser.add_argument(
        "--remote",
        default=os.environ.get(SPARK_REMOTE_ENV) or None,
        metavar="sc://HOST:PORT",
        help=f"run on a Spark Connect server instead of a classic Spark session (env {SPARK_REMOTE_ENV})",
    )
    parser.add_argument(
        "--connect-timeout",
        type=_positive_seconds,
        default=CONNECT_TIMEOUT,
        metavar="SECONDS",
        help=f"with --remote: give up if the Spark Connect server has not answered within SECONDS "
        f"(default {CONNECT_TIMEOUT:g}); SIGTERM or Ctrl-C ends the wait at once",
    )
    parser.add_argument(
        "--no-ship-txstore",
        dest="ship_txstore",
        action="store_false",
        help="with --remote: do not add txstore's sources to the Connect session as an artifact "
        "(the server's Python already has txstore installed)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (opened before the first batch; "
        "a port in use exits 2)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="with --metrics-port: the address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=TEXT,
        help="text (default), or json: one JSON object per log line, batch and range lines "
        "with their numbers as fields",
    )
    add_verbose_option(parser)


def add_verbose_option(parser: argparse.ArgumentParser) -> None:
    """``--verbose``: shared by the jobs and ``txstore demo``."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="debug logging, tracebacks on errors, and Spark's own log lines (its warnings, start-up "
        "banner); without it Spark logs its errors only",
    )


def job_settings(args: argparse.Namespace) -> JobSettings:
    """Validate parsed options into :class:`JobSettings`; raise ConfigError with one line."""
    from dataclasses import replace

    from txstore.core.assignment import parse_assignment
    from txstore.core.patterns import compile_topic_pattern
    from txstore.core.starting import parse_starting_offsets, parse_timestamp
    from txstore.job import JobSettings
    from txstore.kafka.client_settings import topic_name_problem
    from txstore.postgres.db import resolve_database_url

    if not args.bootstrap_servers:
        raise ConfigError(f"no Kafka given: pass --bootstrap-servers or set {BOOTSTRAP_ENV}")
    if args.interval is not None and not args.interval > 0:
        raise ConfigError(f"--interval must be a number of seconds above 0, got {args.interval:g}")
    if args.max_offsets_per_batch is not None and args.max_offsets_per_batch < 1:
        raise ConfigError(f"--max-offsets-per-batch must be at least 1, got {args.max_offsets_per_batch}")
    if args.max_batch_failures < 1:
        raise ConfigError("--max-batch-failures must be at least 1")
    assignment = None
    pattern = getattr(args, "topic_pattern", None)
    if pattern is not None:
        for flag, given in (("--topic", args.topics), ("--assign", args.assign)):
            if given:
                raise ConfigError(
                    f"give either {flag} or --topic-pattern, not both: the topics to read, or a "
                    "regular expression their names match"
                )
        compile_topic_pattern(pattern, "--topic-pattern")
        topics: tuple[str, ...] = ()
    elif args.assign is not None:
        if args.topics:
            raise ConfigError(
                "give either --topic or --assign, not both: the topics to read, or the partitions"
            )
        assignment = parse_assignment(args.assign, "--assign")
        topics = tuple(assignment)
    elif not args.topics:
        raise ConfigError(
            "no topic given: pass --topic TOPIC (repeatable), or --assign '{\"topic\": [0, 1]}', "
            "or --topic-pattern REGEX"
        )
    else:
        topics = tuple(dict.fromkeys(t.strip() for t in args.topics))
    if any(not t for t in topics):
        raise ConfigError("--topic must not be empty")
    for topic in topics:
        problem = topic_name_problem(topic)
        if problem:
            raise ConfigError(f"{'--assign:' if assignment else '--topic'} {problem}")
    if not args.job.strip():
        raise ConfigError("--job must not be empty")
    starting = parse_starting_offsets(args.starting_offsets)
    if args.starting_timestamp is not None:
        if args.starting_offsets.strip().lower() != "earliest":
            raise ConfigError("give either --starting-offsets or --starting-timestamp, not both")
        starting = replace(starting, timestamp_ms=parse_timestamp(args.starting_timestamp))
    return JobSettings(
        job=args.job,
        topics=topics,
        assignment=assignment,
        topic_pattern=pattern,
        bootstrap_servers=args.bootstrap_servers,
        database_url=resolve_database_url(args.database_url),
        starting_offsets=starting,
        kafka_options=dict(args.kafka_options),
        interval=args.interval,
        max_offsets_per_batch=args.max_offsets_per_batch,
        fail_on_data_loss=args.fail_on_data_loss,
        commit_to_kafka_group=args.commit_to_kafka_group,
        max_batch_failures=args.max_batch_failures,
        commit=args.commit,
        min_partitions=args.min_partitions,
        sink=args.sink,
        publish_topic=args.publish_topic,
        publish_max_bytes=args.publish_max_bytes,
        on_bad_message=args.on_bad_message,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
