"""A job's settings, validated once: built from the shared command-line options or by hand.

Re-exported by :mod:`txstore.job` (``from txstore.job import JobSettings`` keeps working).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from txstore.core.assignment import check_assigned_starts
from txstore.core.errors import ConfigError
from txstore.core.patterns import compile_topic_pattern
from txstore.core.starting import StartingOffsets
from txstore.kafka.bad_messages import FAIL, ON_BAD_MESSAGE
from txstore.kafka.client_settings import client_config, fixed_option_problem, topic_name_problem
from txstore.postgres.sink import PUBLISH_MAX_BYTES

PER_RANGE = "per-range"
PER_BATCH = "per-batch"
TRANSACTIONAL = "transactional"
IDEMPOTENT = "idempotent"
COMMIT_MODES = (PER_RANGE, PER_BATCH)
SINKS = (TRANSACTIONAL, IDEMPOTENT)
MIN_PUBLISH_MAX_BYTES = 4096  # room for a commit's identity, ranges and some results per message

DataFrameAggregate = Callable[[Any], Any]
"""A DataFrame with Spark's Kafka-source columns -> a DataFrame of deltas
(``topic``, ``metric``, optional ``key``, ``window_start``, ``grain``)."""


@dataclass(frozen=True)
class JobSettings:
    """Everything a job needs; built from the shared command-line options or by hand."""

    job: str
    topics: tuple[str, ...]
    bootstrap_servers: str
    database_url: str = field(repr=False)  # holds the password
    starting_offsets: StartingOffsets = field(default_factory=StartingOffsets)
    kafka_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold passwords
    interval: float | None = None  # None: one batch (--once)
    max_offsets_per_batch: int | None = None
    fail_on_data_loss: bool = True
    commit_to_kafka_group: str | None = None
    max_batch_failures: int = 3
    commit: str = PER_RANGE  # or PER_BATCH: one driver-side transaction per batch
    min_partitions: int | None = None  # per-batch only: at least this many Spark tasks
    sink: str = TRANSACTIONAL  # or IDEMPOTENT: store each message under its offset
    publish_topic: str | None = None  # also publish committed results to this Kafka topic
    publish_max_bytes: int = PUBLISH_MAX_BYTES  # split a commit's results into messages of at most this
    on_bad_message: str = FAIL  # or SKIP: record messages the aggregate fails on, count the rest
    metrics_port: int | None = None  # serve Prometheus metrics at http://metrics_host:metrics_port/metrics
    metrics_host: str = "127.0.0.1"
    # --assign: topic -> the only partitions the job plans and counts (txstore.core.assignment)
    assignment: Mapping[str, tuple[int, ...]] | None = None
    # --topic-pattern: the topics are those Kafka has that match, resolved every batch
    # (txstore.core.patterns); give topics=() with it
    topic_pattern: str | None = None

    def __post_init__(self) -> None:
        if self.topic_pattern is not None:
            compile_topic_pattern(self.topic_pattern, "--topic-pattern")
            if self.topics or self.assignment is not None:
                raise ConfigError(
                    "give either topics (or an assignment) or topic_pattern, not both; with "
                    "topic_pattern give topics=()"
                )
        for topic in self.topics:
            problem = topic_name_problem(topic)
            if problem:
                raise ConfigError(problem)
        problem = fixed_option_problem(self.kafka_options)
        if problem:
            raise ConfigError(problem)
        if self.assignment is not None:
            if sorted(self.assignment) != sorted(self.topics):
                raise ConfigError(
                    f"the assignment's topics {sorted(self.assignment)} are not the job's topics "
                    f"{sorted(self.topics)}; give topics=tuple(assignment)"
                )
            check_assigned_starts(
                self.assignment, self.starting_offsets.specific, "--assign", "--starting-offsets"
            )
        if self.commit not in COMMIT_MODES:
            raise ConfigError(f"--commit must be one of {', '.join(COMMIT_MODES)}, got {self.commit!r}")
        if self.sink not in SINKS:
            raise ConfigError(f"--sink must be one of {', '.join(SINKS)}, got {self.sink!r}")
        if self.on_bad_message not in ON_BAD_MESSAGE:
            raise ConfigError(
                f"--on-bad-message must be one of {', '.join(ON_BAD_MESSAGE)}, got {self.on_bad_message!r}"
            )
        if self.min_partitions is not None and (self.min_partitions < 1 or self.commit != PER_BATCH):
            raise ConfigError(
                "--min-partitions needs --commit per-batch and a number of at least 1 "
                "(per-range commits are one task per Kafka partition)"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port must be a port number 0..65535, got {self.metrics_port}")
        if self.publish_max_bytes < MIN_PUBLISH_MAX_BYTES:
            raise ConfigError(
                f"--publish-max-bytes must be at least {MIN_PUBLISH_MAX_BYTES}, got {self.publish_max_bytes}"
            )
        if self.sink == IDEMPOTENT and (self.commit != PER_RANGE or self.publish_topic):
            raise ConfigError(
                "--sink idempotent stores messages range by range; it takes neither --commit per-batch "
                "nor --publish-topic"
            )

    @property
    def subscribed_by(self) -> str:
        """The flag the job subscribes by, for lines that ask to check it: ``--topic-pattern``,
        ``--assign`` or ``--topic``."""
        if self.topic_pattern is not None:
            return "--topic-pattern"
        return "--topic" if self.assignment is None else "--assign"

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """``topic_pattern`` compiled (None without one)."""
        return None if self.topic_pattern is None else re.compile(self.topic_pattern)

    @property
    def kafka_conf(self) -> dict[str, Any]:
        return client_config(self.bootstrap_servers, self.kafka_options)
