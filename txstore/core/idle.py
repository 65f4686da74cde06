"""An idle job's plans: when the next plan is known to be the last one's, nothing to read.

A running job plans a batch every interval, and most of a quiet job's plans find every
partition at its log end. Planning is a function of the job's rows (``txn_offsets``), Kafka's
partitions and their log ends (plus topic IDs and a pattern's topics, asked on their own clock):
so while the rows and the log ends are exactly what the last idle plan saw, the plan is the same
empty plan, and Kafka's metadata, the partitions' log starts and the rows' parsing need not be
asked or done again. At 1,024 partitions those were most of an idle plan (issue 38).

What is not asked meanwhile is asked at the latest when the idle topics' IDs are due
(:data:`~txstore.core.ranges.IDLE_TOPIC_ID_SECONDS`): a partition added to a topic, a topic a
pattern starts to match, a topic recreated at exactly its stored log end. A new message in any
known partition, or any change to the job's rows (another instance, ``txstore reset``), ends the
idle plan at once. Nothing is ever planned from it: it only ever says "nothing to read", and the
conditional offset update guards every range the full plan gives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from txstore.core.ranges import OffsetRange, PartitionWatermarks, TopicPartition


@dataclass(frozen=True)
class IdlePlan:
    """The last full plan, which found every partition at its log end.

    ``rows``: the version of the job's rows as read for it (any value that changes whenever a row
    does: :func:`~txstore.postgres.store.rows_version`); ``ends``: every partition's log end then
    (each its committed offset); ``until``: when a full plan is due again (a monotonic clock's
    reading).
    """

    topics: tuple[str, ...]
    rows: str
    ends: Mapping[TopicPartition, int]
    until: float


def idle_plan(
    topics: Sequence[str],
    rows: str,
    committed: Mapping[TopicPartition, int],
    watermarks: Sequence[PartitionWatermarks],
    ranges: Sequence[OffsetRange],
    checked: Mapping[str, float],
    now: float,
    every: float,
) -> IdlePlan | None:
    """The plan to keep after a full plan, or None if it was not idle.

    Idle: no range planned, and every partition Kafka reported at its committed offset (so each
    has a row). A full plan is due again ``every`` seconds after the earliest time
    one of ``topics`` had its topic ID asked (``checked``; ``now`` for a topic never asked), as
    :func:`~txstore.core.ranges.topic_ids_wanted` would ask it then.
    """
    if ranges or not watermarks:
        return None
    ends = {w.key: w.high for w in watermarks}
    if any(committed.get(key) != end for key, end in ends.items()):
        return None
    asked = min((checked.get(topic, now) for topic in topics), default=now)
    return IdlePlan(tuple(topics), rows, ends, asked + every)


def next_is_idle(
    plan: IdlePlan,
    rows: Callable[[], str],
    ends: Callable[[], Mapping[TopicPartition, int] | None],
    clock: Callable[[], float],
) -> bool:
    """Whether the next plan is ``plan`` again, reading as a full plan reads:

    1. nothing is read once ``plan`` is due (``clock``: a monotonic clock);
    2. the job's rows' version (``rows()``) first: if it differs, Kafka is not asked;
    3. then the log ends of ``plan``'s partitions (``ends()``, None if not known), after the
       rows, so that a row another instance commits meanwhile is never above them: they must be
       exactly ``plan``'s, and ``plan`` still not due once they answered (the lookup may have
       taken its timeout).
    """
    if clock() >= plan.until:
        return False
    if rows() != plan.rows:
        return False
    found = ends()
    return found is not None and dict(found) == plan.ends and clock() < plan.until
