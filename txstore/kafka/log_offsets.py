"""Log offsets asked with a running job's kept consumers, and the rules of every ListOffsets answer.

A running job asks its partitions' log ends every plan (and their log starts when it has
something to read): with Kafka's offsets-for-times lookup of kept consumers
(:class:`LookupConsumers`), which takes a list and answers a list, where the admin client makes
a Python future per partition. The steps of a lookup (:func:`consumer_lookup`):

1. the partitions are cut into chunks of :data:`LOOKUP_CHUNK` (librdkafka matches answers to
   questions by a linear search, so one long list costs its length squared);
2. the chunks are shared among up to :data:`LOOKUP_CONSUMERS` consumers, each asking its
   share one chunk after another, side by side on their own connections (Kafka answers one
   connection's requests one at a time): the second and later consumers' shares on threads;
3. a partition whose leadership is moving, or answered with an offset below 0, is asked again
   until the deadline (the rules below, which the admin client's lookups in
   :mod:`txstore.kafka.list_offsets` follow too); any other error is raised.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from txstore.core.ranges import log_start_wanted

Key = tuple[str, int]

# A partition's leadership is moving (a broker restarted, a leader elected): asked again, the
# broker answers once it has taken up the leader epoch its metadata already names. Kafka's own
# admin client retries these; librdkafka's fails the partition's future at once.
LEADERSHIP_MOVING = frozenset(
    {
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)
LIST_OFFSETS_RETRY_SECONDS = 0.1


class LeadershipUnsettled(TimeoutError):
    """Kafka answered, but a partition's leadership was still moving (:data:`LEADERSHIP_MOVING`)
    when the timeout was spent: a topic just created whose leaders are being elected, or a
    broker restarting. A :class:`TimeoutError`, so every caller's "did not answer" handling
    catches it; :meth:`txstore.kafka.admin.Admin.unavailable` words it for what it is."""

    def __init__(self, where: str, error: KafkaError) -> None:
        super().__init__(f"{where}: {error.str()}")
        self.where, self.error = where, error


def moving_leadership(error: KafkaException) -> KafkaError | None:
    """``error``'s Kafka error if it is a partition's leadership moving (:data:`LEADERSHIP_MOVING`)."""
    first = error.args[0] if error.args else None
    return first if isinstance(first, KafkaError) and first.code() in LEADERSHIP_MOVING else None


def unsettled(where: str, error: KafkaException) -> KafkaException | LeadershipUnsettled:
    """What to raise for ``error`` once it may not be asked again: a moving leadership as
    :class:`LeadershipUnsettled` (naming ``where``), anything else as it is."""
    moving = moving_leadership(error)
    return error if moving is None else LeadershipUnsettled(where, moving)


class ConsumerMetadataBehind(Exception):
    """The kept consumer does not know a partition (or topic) the admin client's metadata has
    just named: its own metadata is older than the partitions' creation."""


# What librdkafka's lookup answers for a partition or topic its cached metadata does not have.
UNKNOWN_TO_CONSUMER = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC})

# Kafka's ListOffsets reads these timestamps as the log start and the log end (for a
# read-committed client, the last stable offset).
LOG_START_TIMESTAMP = -2
LOG_END_TIMESTAMP = -1

LOOKUP_CHUNK = 256
"""Partitions asked in one offsets-for-times call of a kept consumer. librdkafka matches each
answer to its question by a linear search of the list asked, so one call of n partitions costs
about n squared: on Apache Kafka, 1,024 partitions took 6.8 ms in one call and 3.6 ms in four
calls of 256 (one after another, on the same connection)."""

LOOKUP_CONSUMERS = 4
"""At most this many kept consumers ask one lookup's chunks side by side. Kafka answers one
connection's requests one after another, so chunks asked by one consumer (even from several
threads) wait for each other: on Apache Kafka on this project's 2-core machine, 1,024 log ends
took 5.2-6.5 ms in four chunks by one consumer and 3.5-3.8 ms by four, one chunk each."""


def consumers_for(partitions: int, chunk: int = LOOKUP_CHUNK, most: int = LOOKUP_CONSUMERS) -> int:
    """How many consumers a lookup of ``partitions`` partitions is shared among: one a chunk, at
    least one, at most ``most`` (a job of at most one chunk keeps one consumer)."""
    return max(1, min(most, -(-partitions // chunk)))


class LookupConsumers:
    """A running job's kept consumers for log-offset lookups, made by ``make`` as a lookup first
    needs them (:func:`consumers_for`: one a ``chunk`` of partitions, at most ``most``), and the
    threads that ask the second and later ones' shares. Not for two callers at once: a job plans
    one batch at a time."""

    def __init__(
        self, make: Callable[[], Consumer], chunk: int = LOOKUP_CHUNK, most: int = LOOKUP_CONSUMERS
    ) -> None:
        self._make = make
        self._chunk, self._most = chunk, most
        self._consumers: list[Consumer] = []
        self._threads: ThreadPoolExecutor | None = None

    @property
    def started(self) -> bool:
        """Whether a consumer is kept (made by an earlier lookup)."""
        return bool(self._consumers)

    def log_offsets(
        self,
        partitions: Sequence[TopicPartition],
        timeout: float,
        settled: Mapping[Key, int] | None = None,
    ) -> tuple[dict[Key, int], dict[Key, int]]:
        """Each partition's log start and read-committed log end (:func:`consumer_log_offsets`)."""
        return consumer_log_offsets(self.lookup, partitions, timeout, settled)

    def lookup(self, partitions: Sequence[Key], timestamp: int, deadline: float) -> dict[Key, int]:
        """One question of every partition (:func:`consumer_lookup`), shared among the consumers
        its length needs."""
        wanted = consumers_for(len(partitions), self._chunk, self._most)
        while len(self._consumers) < wanted:
            self._consumers.append(self._make())
        if wanted > 1 and self._threads is None:
            self._threads = ThreadPoolExecutor(self._most - 1, thread_name_prefix="txstore-lookup")
        return consumer_lookup(
            self._consumers[:wanted], partitions, timestamp, deadline, self._chunk, self._threads
        )

    def close(self) -> None:
        """Stop the threads (after any share they ask), then close every consumer."""
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=True)
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            with contextlib.suppress(Exception):
                consumer.close()


Lookup = Callable[[Sequence[Key], int, float], dict[Key, int]]
"""A lookup of one question (a timestamp) of partitions until a deadline: :meth:`LookupConsumers.lookup`."""


def consumer_log_offsets(
    lookup: Lookup,
    partitions: Sequence[TopicPartition],
    timeout: float,
    settled: Mapping[Key, int] | None = None,
) -> tuple[dict[Key, int], dict[Key, int]]:
    """Each partition's log start and read-committed log end, with kept consumers'
    offsets-for-times lookups (``lookup``: one call a question).

    The ends are asked first; then the starts, only of the partitions
    :func:`~txstore.core.ranges.log_start_wanted` names for ``settled`` (None: every one).
    A partition not asked its start is given its end as its start: it has nothing to read.

    The consumers are readers (:func:`~txstore.kafka.client_settings.reader_config`): their ListOffsets
    requests carry ``isolation.level=read_committed``, so the end is the last stable offset, as
    the admin client's lookup asks it. The same rules as there: a partition whose leadership is
    moving, or answered with an offset below 0 (no log offset: a restarted broker loading its
    log), is asked again until ``timeout``; then the error is raised (:class:`TimeoutError` for
    the offset). librdkafka fails the whole lookup on one partition's moving leadership: then
    every partition of that call is asked again. A partition or topic a consumer's cached
    metadata does not have yet raises :class:`ConsumerMetadataBehind` (the caller asks the
    admin client instead).
    """
    deadline = time.monotonic() + timeout
    everything = [(tp.topic, tp.partition) for tp in partitions]
    high = lookup(everything, LOG_END_TIMESTAMP, deadline)
    wanted = everything if settled is None else log_start_wanted(settled, high)
    low = lookup(wanted, LOG_START_TIMESTAMP, deadline) if wanted else {}
    for key in everything:
        low.setdefault(key, high[key])  # not asked: at its end, nothing to read
    return low, high


def consumer_lookup(
    consumers: Sequence[Consumer],
    partitions: Sequence[Key],
    timestamp: int,
    deadline: float,
    chunk: int = LOOKUP_CHUNK,
    threads: ThreadPoolExecutor | None = None,
) -> dict[Key, int]:
    """One question (``timestamp``: the log start or end) of every partition, ``chunk``
    partitions a call, the chunks shared among ``consumers`` (chunk i to consumer i modulo
    their number; the first consumer's share asked on the calling thread, the others' on
    ``threads``, required for more than one), asked again where an answer is not settled,
    until ``deadline``: :func:`consumer_log_offsets`' rules. Every share is waited for before
    an error is raised: no consumer is still asking when its caller closes it."""
    found: dict[Key, int] = {}
    pending = list(partitions)
    while pending:
        chunks = [pending[start : start + chunk] for start in range(0, len(pending), chunk)]
        shares = [chunks[i :: len(consumers)] for i in range(min(len(consumers), len(chunks)))]
        asked: list[Future[list[Key]]] = []
        for consumer, share in zip(consumers[1 : len(shares)], shares[1:], strict=True):
            if threads is None:
                raise ValueError("consumer_lookup: a second consumer's share needs threads")
            asked.append(threads.submit(_ask_share, consumer, share, timestamp, deadline, found))
        try:
            again = _ask_share(consumers[0], shares[0], timestamp, deadline, found)
        finally:
            for answer in asked:  # every share ends before anything is raised
                answer.exception()
        for answer in asked:
            again += answer.result()
        if again:
            time.sleep(LIST_OFFSETS_RETRY_SECONDS)
        pending = again
    return found


def _ask_share(
    consumer: Consumer,
    chunks: Sequence[Sequence[Key]],
    timestamp: int,
    deadline: float,
    found: dict[Key, int],
) -> list[Key]:
    """One consumer's chunks, one call after another: their settled answers added to ``found``
    (each share adds its own partitions' keys), the partitions to ask again returned."""
    again: list[Key] = []
    for partitions in chunks:
        again += _lookup_once(consumer, partitions, timestamp, deadline, found)
    return again


def _lookup_once(
    consumer: Consumer,
    partitions: Sequence[tuple[str, int]],
    timestamp: int,
    deadline: float,
    found: dict[tuple[str, int], int],
) -> list[tuple[str, int]]:
    """One offsets-for-times call of ``partitions``: their settled answers added to ``found``,
    the partitions to ask again returned (all of them when librdkafka failed the whole call on
    one partition's moving leadership); any other error raised."""
    left = max(deadline - time.monotonic(), 0.001)
    asked = [TopicPartition(topic, partition, timestamp) for topic, partition in partitions]
    try:
        answered = consumer.offsets_for_times(asked, timeout=left)
    except KafkaException as e:  # librdkafka fails the whole lookup on a partition's error
        error = e.args[0] if e.args else None
        if isinstance(error, KafkaError) and error.code() in UNKNOWN_TO_CONSUMER:
            raise ConsumerMetadataBehind(str(error.str())) from None
        if not moving_within(e, deadline):
            raise unsettled(_partitions_text(partitions), e) from None
        return list(partitions)
    again: list[tuple[str, int]] = []
    for answer in answered:
        key = (answer.topic, answer.partition)
        error = answer.error
        if error is not None and error.code() in UNKNOWN_TO_CONSUMER:
            raise ConsumerMetadataBehind(str(error.str()))
        if error is not None:
            if not moving_within(KafkaException(error), deadline):
                raise unsettled(f"{answer.topic}/{answer.partition}", KafkaException(error))
            again.append(key)
        elif answer_settled(answer.topic, answer.partition, answer.offset, True, deadline):
            found[key] = int(answer.offset)
        else:
            again.append(key)
    return again


def _partitions_text(partitions: Sequence[tuple[str, int]], most: int = 3) -> str:
    """``t/0, t/1, t/2 and 5 more``: the partitions a failed lookup asked, for a one-line error."""
    named = ", ".join(f"{t}/{p}" for t, p in partitions[:most])
    return named + (f" and {len(partitions) - most} more" if len(partitions) > most else "")


def moving_within(error: KafkaException, deadline: float) -> bool:
    """Whether ``error`` is a partition's leadership moving, and may be asked again before
    ``deadline`` (else the caller raises it)."""
    return moving_leadership(error) is not None and ask_again(deadline)


def answer_settled(topic: str, partition: int, offset: int, log_offset: bool, deadline: float) -> bool:
    """Whether a partition's answer ``offset`` is taken: False to ask again, where a log offset
    (``log_offset``; a time lookup's -1 is an answer) is below 0, no offset of any log;
    :class:`TimeoutError` once it may not be asked again before ``deadline``."""
    if not log_offset or offset >= 0:
        return True
    if not ask_again(deadline):
        raise TimeoutError(
            f"ListOffsets answered {topic}/{partition} with offset {offset}, no log offset, until the timeout"
        )
    return False


def ask_again(deadline: float) -> bool:
    """Whether a partition's answer may be asked again: a retry's pause still ends before
    ``deadline`` (else the caller raises, having waited as long as it may)."""
    return time.monotonic() + LIST_OFFSETS_RETRY_SECONDS < deadline
