"""A job's subscription: which Kafka partitions are the job's, as ``txstore status`` judges them.

A job names what it reads in one of three ways, as Spark's Kafka source does: topics
(``--topic``, ``subscribe``), a pattern (``--topic-pattern``, ``subscribePattern``) or assigned
partitions (``--assign``, ``assign``). Its planner records the way in ``txn_subscriptions`` with
its plans, so that ``txstore status`` (and ``--check``) can tell, of a partition Kafka has that the
job has no offsets for:

- a partition the job will start (a topic gained partitions; a topic that started matching the
  pattern while the job was down): shown with its lag, judged as a partition that did not start;
- a partition the job does not own (a partition of its topic left out of its assignment, read
  by another job that splits the topic with it): not the job's, not shown, never a STOP.

A job with no record (it last ran before schema revision 0009) is judged as before: every
partition of the topics it has offsets for is its own.

Pure functions over frozen data: :meth:`Subscription.holds`, :func:`subscription_json` and
:func:`subscription_from_json` (the stored form).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from txstore.core.patterns import matches

Kind = Literal["topics", "pattern", "assign"]


class SubscriptionUnreadable(ValueError):
    """A stored subscription this txstore cannot read (a newer txstore wrote it, or it was edited)."""


@dataclass(frozen=True)
class Subscription:
    """How a job names its partitions: ``topics`` (kind ``topics``: every partition of them;
    kind ``assign``: the assigned topics), ``pattern`` (kind ``pattern``), ``assignment`` (kind
    ``assign``: topic -> its partitions, ascending)."""

    kind: Kind
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assignment: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def holds(self, topic: str, partition: int) -> bool:
        """Whether ``topic``'s ``partition`` is the job's to read."""
        if self.kind == "pattern":
            return self.pattern is not None and matches(re.compile(self.pattern), topic)
        if self.kind == "assign":
            return partition in dict(self.assignment).get(topic, ())
        return topic in self.topics


def subscription_of(
    topics: tuple[str, ...], pattern: str | None, assignment: Mapping[str, tuple[int, ...]] | None
) -> Subscription:
    """The subscription of a job's settings (or a source's options): a pattern, an assignment,
    or its topics."""
    if pattern is not None:
        return Subscription("pattern", pattern=pattern)
    if assignment is not None:
        given = tuple(sorted((t, tuple(sorted(ps))) for t, ps in assignment.items()))
        return Subscription("assign", tuple(t for t, _ in given), assignment=given)
    return Subscription("topics", tuple(sorted(set(topics))))


def subscription_json(sub: Subscription) -> dict[str, Any]:
    """The stored form (``txn_subscriptions.subscription``)."""
    if sub.kind == "pattern":
        return {"pattern": sub.pattern}
    if sub.kind == "assign":
        return {"assign": {t: list(ps) for t, ps in sub.assignment}}
    return {"topics": list(sub.topics)}


def subscription_from_json(stored: Any) -> Subscription:
    """:func:`subscription_json`'s form read back; :class:`SubscriptionUnreadable` for anything else."""
    if isinstance(stored, dict) and len(stored) == 1:
        ((kind, value),) = stored.items()
        if kind == "pattern" and isinstance(value, str):
            try:
                re.compile(value)
            except re.error:
                raise SubscriptionUnreadable(f"pattern {value!r} does not compile") from None
            return Subscription("pattern", pattern=value)
        if kind == "topics" and isinstance(value, list) and all(isinstance(t, str) for t in value):
            return Subscription("topics", tuple(sorted(set(value))))
        if (
            kind == "assign"
            and isinstance(value, dict)
            and all(
                isinstance(ps, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in ps)
                for ps in value.values()
            )
        ):
            return subscription_of((), None, {t: tuple(ps) for t, ps in value.items()})
    raise SubscriptionUnreadable(f"not a subscription txstore writes: {stored!r}")
