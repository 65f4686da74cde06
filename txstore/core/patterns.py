"""Topic patterns: a job or a read whose topics are the Kafka topics a regular expression matches.

Spark's Kafka source takes ``subscribePattern``; txstore takes it in ``format("txstore")`` (batch
and stream) and in the jobs (``--topic-pattern``). As in Spark, the pattern is resolved against
Kafka's topics for every batch (or micro-batch), and a topic matches when the whole name matches
(Java's ``Pattern.matcher(topic).matches()``; here :func:`re.fullmatch`, with Python's regular
expression syntax). Kafka's internal topics (``__consumer_offsets``, ``__transaction_state``:
names starting with ``__``) never match, as Kafka's consumer leaves them out of a subscription.

Pure functions over what Kafka lists and what a job has stored:

- :func:`compile_topic_pattern` refuses a pattern that does not compile, in one line;
- :func:`resolve_pattern` gives the topics a batch plans: those that match now, and those the
  job has offsets for that match (a topic that vanished is then found missing and stops the
  job as a vanished topic does today, with its reset);
- :func:`joining_starts` says where the partitions of a topic that starts matching later
  start: at earliest, as Spark reads newly discovered partitions (``--starting-offsets`` and
  ``--starting-timestamp`` are for the job's first run only).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from txstore.core.errors import ConfigError
from txstore.core.ranges import PartitionWatermarks
from txstore.core.starting import StartDecision

INTERNAL_PREFIX = "__"
"""Kafka's internal topics' names start so (``__consumer_offsets``): no pattern matches them."""


def compile_topic_pattern(text: str, where: str) -> re.Pattern[str]:
    """``text`` compiled; :class:`ConfigError` in one line starting with ``where`` (``--topic-pattern``,
    ``option subscribePattern``) if it is empty or not a regular expression Python compiles."""
    if not text.strip():
        raise ConfigError(f"{where} must not be empty; give a regular expression such as 'orders-.*'")
    try:
        return re.compile(text)
    except re.error as e:
        raise ConfigError(
            f"{where} {text!r} is not a valid regular expression ({e}; Python's re syntax); "
            "give one such as 'orders-.*'"
        ) from None


def matches(pattern: re.Pattern[str], topic: str) -> bool:
    """Whether ``topic`` matches as a whole, and is not one of Kafka's internal topics."""
    return not topic.startswith(INTERNAL_PREFIX) and pattern.fullmatch(topic) is not None


def matching_topics(pattern: re.Pattern[str], topics: Iterable[str]) -> tuple[str, ...]:
    """The topics among ``topics`` that ``pattern`` matches, sorted."""
    return tuple(sorted({t for t in topics if matches(pattern, t)}))


@dataclass(frozen=True)
class PatternTopics:
    """One resolution of a pattern: what Kafka has that matches, and what the job holds."""

    matched: tuple[str, ...]
    """Kafka's topics that match now."""
    held: tuple[str, ...]
    """The topics that match among those the job has offsets for (some may have vanished)."""
    first_run: bool
    """The job has no offsets at all: the starting offsets apply to every matched topic."""

    @property
    def topics(self) -> tuple[str, ...]:
        """What a batch plans: the matched topics and the held ones, sorted."""
        return tuple(sorted(set(self.matched) | set(self.held)))

    @property
    def vanished(self) -> tuple[str, ...]:
        """Held topics Kafka no longer lists."""
        return tuple(t for t in self.held if t not in self.matched)


def resolve_pattern(
    pattern: re.Pattern[str], kafka_topics: Iterable[str], stored_topics: Collection[str]
) -> PatternTopics:
    """The topics a batch plans for ``pattern``: ``kafka_topics`` (what Kafka lists) that match,
    and ``stored_topics`` (every topic the job has offsets for) that match. A job's offsets for a
    topic the pattern does not match (from a run with other topics) are left alone."""
    return PatternTopics(
        matched=matching_topics(pattern, kafka_topics),
        held=matching_topics(pattern, stored_topics),
        first_run=not stored_topics,
    )


def joining_starts(
    resolved: PatternTopics, new_partitions: Iterable[PartitionWatermarks], where: str
) -> list[StartDecision]:
    """Where the partitions of topics that start matching after the job's first run start: at
    earliest, as Spark reads newly discovered partitions; written while the job was down or
    before the topic matched, nothing is skipped. None on the first run (``--starting-offsets``
    applies) and none for partitions of topics the job holds (new partitions of a started topic:
    :func:`~txstore.core.starting.resolve_starting_offsets`)."""
    if resolved.first_run:
        return []
    held = set(resolved.held)
    return [
        StartDecision(m.topic, m.partition, m.low, f"earliest offset {m.low} (topic newly matching {where})")
        for m in sorted(new_partitions, key=lambda m: m.key)
        if m.topic not in held
    ]
