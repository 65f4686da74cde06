"""Kafka's ListOffsets request through the admin client: log starts and ends, and offsets for times.

Both questions of a one-off plan (log start, read-committed log end) go out together
(:func:`list_offsets_together`), so they cost one round trip. A running job asks its log offsets
with kept consumers instead (:mod:`txstore.kafka.log_offsets`, whose rules for a moving
leadership and an answer below 0 are followed here too).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS, Admin, kept
from txstore.kafka.client_settings import servers_of
from txstore.kafka.log_offsets import LIST_OFFSETS_RETRY_SECONDS, answer_settled, moving_within, unsettled


def lookup_timestamp(timestamp_ms: int) -> int:
    """The timestamp to ask Kafka for: never below 0, since Kafka reads -1 as "latest" and -2 as
    "earliest" (an instant before 1970 would start at the log end). No message is older than
    the epoch (producers refuse negative timestamps), so 0 finds the same first message."""
    return max(timestamp_ms, 0)


def offsets_for_timestamp(
    conf: Mapping[str, Any],
    partitions: Sequence[tuple[str, int]],
    timestamp_ms: int,
    timeout: float = METADATA_TIMEOUT_SECONDS,
    admin: Admin | None = None,
) -> dict[tuple[str, int], int]:
    """Per partition, the first offset whose timestamp is at or after ``timestamp_ms``.

    Kafka's offsets-for-times lookup; a partition with no such message gets -1.
    The lookup is read-uncommitted, so an answer can lie past the last stable
    offset: callers place it with :func:`txstore.core.starting.offset_for_time`,
    which caps it (and -1) at the planner's read-committed end. ``admin``: a client the
    caller already asked through (else a new one).
    """
    return offsets_for_times(conf, dict.fromkeys(partitions, timestamp_ms), timeout, admin)


def offsets_for_times(
    conf: Mapping[str, Any],
    wanted: Mapping[tuple[str, int], int],
    timeout: float = METADATA_TIMEOUT_SECONDS,
    admin: Admin | None = None,
) -> dict[tuple[str, int], int]:
    """:func:`offsets_for_timestamp` for partitions each with its own time
    (``startingOffsetsByTimestamp``), -1 where no message is that late: one question per
    distinct time, all asked at once on one client (:func:`list_offsets_together`). Asked one
    time after another, each on a client of its own, 8 partitions of 8 times took a median 25 ms
    (once 3 s) on Apache Kafka, and 6 ms at once (``docs/benchmark.md``). ``admin``: a client
    the caller already asked through (else a new one)."""
    by_time: dict[int, list[tuple[str, int]]] = {}
    for key, when in wanted.items():
        by_time.setdefault(when, []).append(key)
    if not by_time:
        return {}
    questions = [
        OffsetsQuestion(
            [TopicPartition(t, p) for t, p in sorted(keys)],
            OffsetSpec.for_timestamp(lookup_timestamp(when)),  # type: ignore[no-untyped-call]
        )
        for when, keys in sorted(by_time.items())
    ]
    admin = kept(admin, conf)
    try:
        answers = list_offsets_together(admin.client, questions, timeout)
    except (KafkaException, TimeoutError) as e:
        raise admin.unavailable(servers_of(conf), "the offsets-for-times lookup", timeout, e) from None
    return {key: offset for answer in answers for key, offset in answer.items()}


@dataclass(frozen=True)
class OffsetsQuestion:
    """One ListOffsets question: these partitions at ``spec`` (earliest, latest or a time).

    ``committed``: the read-committed answer (the last stable offset for latest).
    ``log_offsets``: the answer is a log start or end, never a time lookup (whose -1 means
    "no message that late"), so an answer below 0 is no offset of any log.
    """

    partitions: Sequence[TopicPartition]
    spec: Any
    committed: bool = False
    log_offsets: bool = False


def list_offsets_together(
    admin: AdminClient, questions: Sequence[OffsetsQuestion], timeout: float
) -> list[dict[tuple[str, int], int]]:
    """The answers to several ListOffsets questions, asked at once: one answer per partition
    per question, in the questions' order.

    Each round sends every question's pending partitions before waiting for any answer, so
    two questions cost one round trip. Partitions whose leadership is moving are asked again
    until ``timeout`` (then the last error is raised). A log offset below 0 is no offset of
    any log: a restarted Apache Kafka gave -1001 (librdkafka's OFFSET_INVALID) without an
    error while a partition's log was loading; taken as the log end, it stopped the job as a
    recreated topic. It is asked again like a moving leadership, then raised as
    :class:`TimeoutError` (the caller's "did not answer").
    """
    deadline = time.monotonic() + timeout
    found: list[dict[tuple[str, int], int]] = [{} for _ in questions]
    pending: list[Sequence[TopicPartition]] = [q.partitions for q in questions]
    while any(pending):
        left = max(deadline - time.monotonic(), 0.001)
        asked = [
            (
                i,
                admin.list_offsets(
                    {tp: questions[i].spec for tp in pending[i]},
                    isolation_level=(
                        IsolationLevel.READ_COMMITTED
                        if questions[i].committed
                        else IsolationLevel.READ_UNCOMMITTED
                    ),
                    request_timeout=left,
                ),
            )
            for i in range(len(questions))
            if pending[i]
        ]
        for i, futures in asked:
            again: list[TopicPartition] = []
            for tp, future in futures.items():
                try:
                    wait = max(deadline - time.monotonic(), 0.001)  # one deadline for all answers
                    offset = int(future.result(timeout=wait).offset)
                except KafkaException as e:
                    if not moving_within(e, deadline):
                        raise unsettled(f"{tp.topic}/{tp.partition}", e) from None
                    again.append(tp)
                    continue
                if answer_settled(tp.topic, tp.partition, offset, questions[i].log_offsets, deadline):
                    found[i][(tp.topic, tp.partition)] = offset
                else:
                    again.append(tp)
            pending[i] = again
        if any(pending):
            time.sleep(LIST_OFFSETS_RETRY_SECONDS)
    return found


EARLIEST = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]
