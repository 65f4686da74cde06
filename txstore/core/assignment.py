"""Assigned partitions: a job or a read that owns only some partitions of its topics.

Spark's Kafka source takes ``assign`` as JSON, ``{"topicA": [0, 1], "topicB": [2]}``, instead of
``subscribe``; txstore takes the same JSON in ``format("txstore")`` (option ``assign``) and in
the jobs (``--assign``). Two jobs may split a topic's partitions between them: each plans,
reads and commits only its own partitions, so between them every message is counted once.

Pure functions: :func:`parse_assignment` checks the JSON, :func:`check_assigned_starts` the
rule Spark has for starting offsets given as JSON (they name exactly the assigned
partitions), and :func:`assigned_only` keeps the assigned partitions of what Kafka reports
and of what a job has committed, refusing an assigned partition Kafka does not have.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from txstore.core.errors import ConfigError
from txstore.core.ranges import PartitionWatermarks, TopicPartition

Assignment = Mapping[str, tuple[int, ...]]
"""Topic -> its assigned partitions, ascending."""

_HINT = 'give JSON like {"topicA": [0, 1], "topicB": [2]}'


def parse_assignment(text: str, where: str) -> dict[str, tuple[int, ...]]:
    """Spark's ``assign`` JSON as topic -> partitions (ascending); :class:`ConfigError` in one line
    starting with ``where`` (``option assign`` or ``--assign``) for anything else: not JSON, no
    topic, a topic without partitions, a partition that is not a whole number of at least 0, or
    named twice. (The callers check the topics' names, as they do ``subscribe``'s.)"""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where} is not valid JSON ({e.msg} at char {e.pos}); {_HINT}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"{where} must be a JSON object naming at least one topic; {_HINT}")
    assignment: dict[str, tuple[int, ...]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not partitions:
            raise ConfigError(f"{where}: topic {topic!r} must map to a non-empty list of partitions; {_HINT}")
        for p in partitions:
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise ConfigError(
                    f"{where}: topic {topic!r}: partition {p!r} is not a whole number of at least 0; {_HINT}"
                )
        if len(set(partitions)) != len(partitions):
            raise ConfigError(f"{where}: topic {topic!r} names a partition twice: {partitions}")
        assignment[topic] = tuple(sorted(partitions))
    return assignment


def assigned_keys(assignment: Assignment) -> set[TopicPartition]:
    return {(t, p) for t, ps in assignment.items() for p in ps}


def check_assigned_starts(
    assignment: Assignment, specific: Iterable[TopicPartition], where: str, starts: str
) -> None:
    """Offsets given as JSON (``specific``, the partitions it names) with an assignment must name
    exactly the assigned partitions, as Spark requires (-2 earliest, -1 latest); ``starts`` names
    the setting (``startingOffsets``). Nothing to check without JSON (``earliest``, ``latest``)."""
    named = set(specific)
    if not named:
        return
    assigned = assigned_keys(assignment)
    missing, extra = sorted(assigned - named), sorted(named - assigned)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"leaves out assigned {_names(missing)}")
        if extra:
            parts.append(f"names {_names(extra)}, not assigned by {where}")
        raise ConfigError(
            f"{starts} {' and '.join(parts)}; with {where} its JSON must name exactly the assigned "
            "partitions, as in Spark (-2 earliest, -1 latest)"
        )


def assigned_only(
    assignment: Assignment | None,
    watermarks: Sequence[PartitionWatermarks],
    committed: Mapping[TopicPartition, int] | None = None,
    where: str = "option assign",
) -> tuple[list[PartitionWatermarks], dict[TopicPartition, int]]:
    """What Kafka reports and what a job committed, for the assigned partitions only (all of both
    without an assignment).

    An assigned partition Kafka does not report is :class:`ConfigError` (a typo, or more
    partitions than the topic has), unless the job committed it: then the planner's own line
    for a vanished partition tells it (:func:`~txstore.core.ranges.plan_ranges`). A partition the
    job committed but is no longer assigned is left alone: not planned, its row kept.
    """
    committed = dict(committed or {})
    if assignment is None:
        return list(watermarks), committed
    assigned = assigned_keys(assignment)
    reported = {w.key for w in watermarks}
    absent = sorted(k for k in assigned - reported if k not in committed)
    if absent:
        have = {t: sorted(p for tt, p in reported if tt == t) for t, _ in absent}
        counts = ", ".join(
            f"{t!r} has {len(ps)} partition{'' if len(ps) == 1 else 's'}" for t, ps in sorted(have.items())
        )
        topics = "the topics have" if len(have) > 1 else "the topic has"
        raise ConfigError(
            f"{where} names {_names(absent)}, which Kafka does not report ({counts}; numbered from 0); "
            f"assign partitions {topics}"
        )
    kept = [w for w in watermarks if w.key in assigned]
    return kept, {k: o for k, o in committed.items() if k in assigned}


def _names(keys: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{t!r} partition {p}" for t, p in keys)
