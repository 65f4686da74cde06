"""Kafka adapter: admin calls, watermarks and offsets-for-times (the settings: :mod:`txstore.kafka.client_settings`).

Every call has a timeout. Reading a range is :mod:`txstore.kafka.reader`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from txstore.core.env import BOOTSTRAP_ENV as BOOTSTRAP_ENV
from txstore.core.errors import (
    ConfigError,
    KafkaUnavailable,
    UnknownTopic,
)
from txstore.core.ranges import PartitionWatermarks
from txstore.kafka.certificates import certificate_refusal
from txstore.kafka.client_settings import CLIENT_LOGGER, reader_config, servers_of
from txstore.kafka.log_offsets import (
    LIST_OFFSETS_RETRY_SECONDS,
    LOG_END_TIMESTAMP,
    ConsumerMetadataBehind,
    LeadershipUnsettled,
    LookupConsumers,
    answer_settled,
    moving_within,
    unsettled,
)

METADATA_TIMEOUT_SECONDS = 15.0
ENDS_TIMEOUT_SECONDS = 2.0
"""How long an idle plan's log-end lookup (:meth:`Watermarks.ends`) may take before the plan is
made the whole way, which waits up to :data:`METADATA_TIMEOUT_SECONDS` and says what is wrong."""


class _Admin:
    """An AdminClient for one driver-side call, which keeps the errors librdkafka reports.

    librdkafka retries a broker it cannot reach or talk to (refused, TLS or SASL
    handshake failed) until the call times out, and would print a line to stderr
    for every attempt. Here its log lines go to :data:`CLIENT_LOG` (at DEBUG) and its errors
    are kept, so a failed call becomes one line that says what the broker said.
    Metadata requests never create topics, whatever the broker allows.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self.errors: list[KafkaError] = []
        self.settings = settings = {
            **conf,
            "allow.auto.create.topics": False,
            "error_cb": self.errors.append,
            "logger": CLIENT_LOGGER,
        }
        try:
            self.client = AdminClient(settings)
        except (KafkaException, ValueError, TypeError) as e:
            raise ConfigError(
                f"Kafka client settings refused: {_error_text(e)}; check --kafka-option"
            ) from None

    def last_error(self) -> str | None:
        """The last error librdkafka reported (not "all brokers down"), after serving its queue."""
        try:
            self.client.poll(0)
        except Exception:  # serving callbacks must never hide the original failure
            return None
        for error in reversed(self.errors):
            if error.code() != KafkaError._ALL_BROKERS_DOWN:
                return str(error.str())
        return None

    def refusal(self, servers: str) -> KafkaUnavailable | None:
        """The broker answered and refused this client for good (after serving its queue):
        :func:`refusal`. Waiting longer cannot help, so the call stops at once, saying which."""
        try:
            self.client.poll(0)
        except Exception:
            return None
        return refusal(self.errors, servers, self.settings)

    def metadata(self, servers: str, topic: str | None, timeout: float) -> Any:
        """``list_topics(topic)`` within ``timeout``. While librdkafka reports errors it is asked
        in slices of a second, so that a refusal (:meth:`refusal`) ends the call at once rather
        than when the timeout is spent; a broker that is only slow (no error) gets the rest of
        the timeout in one request."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return self.client.list_topics(topic, timeout=max(min(1.0, left), 0.001))
            except KafkaException:
                refused = self.refusal(servers)
                if refused is not None:
                    raise refused from None
                if time.monotonic() + 0.001 >= deadline:
                    raise
                if not self.errors:  # slow, not failing: one request for the rest of the time
                    return self.client.list_topics(topic, timeout=max(deadline - time.monotonic(), 0.001))

    def unavailable(self, servers: str, what: str, timeout: float, error: BaseException) -> KafkaUnavailable:
        refused = self.refusal(servers)
        if refused is not None:
            return refused
        if isinstance(error, LeadershipUnsettled):
            return KafkaUnavailable(
                f"Kafka at {servers} answered {what}, but the leadership of {error.where} was still "
                f"moving after {timeout:g}s ({error.error.str()}): a topic just created or a broker "
                "restarting settles in seconds; run again, and if it persists check the topic's "
                "leaders (kafka-topics.sh --describe)"
            )
        reason = self.last_error() or _error_text(error)
        return KafkaUnavailable(
            f"Kafka at {servers} did not answer {what} within {timeout:g}s ({reason}); check "
            f"--bootstrap-servers / {BOOTSTRAP_ENV}, the network, and --kafka-option security settings"
        )


def refusal(errors: Sequence[KafkaError], servers: str, conf: Mapping[str, Any]) -> KafkaUnavailable | None:
    """Whether ``errors`` (what a client's ``error_cb`` was given) say the broker at ``servers``
    answered and refused the client for good: a login it does not accept, or a certificate the
    client does not trust (what was wrong with it is found with the client's settings ``conf``:
    :func:`~txstore.kafka.certificates.certificate_refusal`). Every client txstore makes stops at
    once on these, in the same line: planning (:class:`_Admin`) and publishing
    (:mod:`txstore.postgres.outbox`)."""
    for error in errors:
        reason = _CLIENT_PREFIX.sub("", str(error.str()))
        if error.code() == KafkaError._AUTHENTICATION:
            return KafkaUnavailable(
                f"Kafka at {servers} refused the login ({reason}); check --kafka-option "
                "sasl.username, sasl.password and sasl.mechanisms"
            )
        if error.code() == KafkaError._SSL and "certificate verify failed" in reason:
            return certificate_refusal(servers, conf, reason)
    return None


# How librdkafka begins a broker's error: "sasl_ssl://127.0.0.1:9093/bootstrap: " (the broker is named).
_CLIENT_PREFIX = re.compile(r"^[a-z_]+://[^ ]+/[^ :]+: ")


def _error_text(error: BaseException) -> str:
    first = error.args[0] if error.args else error
    return str(first.str()) if isinstance(first, KafkaError) else str(first)


Admin = _Admin
"""The admin client type, by the name other modules use: one client for several calls of
:func:`fetch_watermarks` and :func:`fetch_topic_names` (their ``admin``), as a command asking
topic by topic needs. A new librdkafka client waits about 55 ms for its first answer (on one
machine with Apache Kafka), so ``txstore status`` with a client per topic took 1.4 s for a job
of 20 topics."""


def _kept(admin: _Admin | None, conf: Mapping[str, Any]) -> _Admin:
    """``admin`` with its errors cleared (only this call's explain its failure), else a new client."""
    if admin is None:
        return _Admin(conf)
    admin.errors.clear()
    return admin


def fetch_watermarks(
    conf: Mapping[str, Any],
    topics: Sequence[str],
    timeout: float = METADATA_TIMEOUT_SECONDS,
    admin: _Admin | None = None,
) -> list[PartitionWatermarks]:
    """Every partition of ``topics`` with its log-start and log-end offsets.

    One metadata request and two batched ListOffsets requests, whatever the
    partition count. Raises :class:`UnknownTopic` for a topic Kafka does not
    have (it is never created), :class:`KafkaUnavailable` (with the broker
    address and the broker's last error) on timeout. ``admin``: ask through this
    client (:data:`Admin`), else through a new one.
    """
    return _watermarks(_kept(admin, conf), conf, topics, timeout)


class Watermarks:
    """:func:`fetch_watermarks` with one AdminClient kept across calls.

    A job plans a batch every interval; keeping the client saves its start
    and connection setup each time. After a failed call the client is
    dropped and the next call starts a new one.
    """

    def __init__(self) -> None:
        self._admin: _Admin | None = None
        self._lookups: LookupConsumers | None = None
        self._conf: dict[str, Any] = {}

    def __call__(
        self,
        conf: Mapping[str, Any],
        topics: Sequence[str],
        timeout: float = METADATA_TIMEOUT_SECONDS,
        settled: Mapping[tuple[str, int], int] | None = None,
    ) -> list[PartitionWatermarks]:
        """The partitions of ``topics`` and their log offsets. ``settled``: a planner's committed
        offsets; a partition whose committed offset is its log end now is not asked its log start
        (:func:`~txstore.core.ranges.log_start_wanted`) and is reported as ``[end, end)``, all it
        has to read: an idle job asks one ListOffsets a plan, not two."""
        admin = self._admin_for(conf)
        if self._lookups is None:
            self._lookups = LookupConsumers(self._new_consumer)
        try:
            try:
                return _watermarks(admin, conf, topics, timeout, self._lookups, settled)
            except ConsumerMetadataBehind:
                # Partitions added (or a topic created) since the kept consumer last learned the
                # topics: the admin client, whose metadata named them just now, answers this
                # call; a new consumer learns them for the next.
                self._close_consumer()
                return _watermarks(admin, conf, topics, timeout)
        except BaseException:
            self.close()
            raise

    def ends(
        self,
        conf: Mapping[str, Any],
        partitions: Sequence[tuple[str, int]],
        timeout: float = ENDS_TIMEOUT_SECONDS,
    ) -> dict[tuple[str, int], int] | None:
        """The read-committed log ends of ``partitions`` alone, asked with the kept consumer and
        no metadata request: what an idle plan compares (:mod:`txstore.core.idle`). None when
        there is no kept consumer for ``conf`` or the lookup did not answer within ``timeout``
        (a partition or topic gone, a broker down or slow): the caller then plans the whole
        way, whose call says what is wrong."""
        if self._lookups is None or not self._lookups.started or self._conf != dict(conf):
            return None
        try:
            return self._lookups.lookup(partitions, LOG_END_TIMESTAMP, time.monotonic() + timeout)
        except (KafkaException, TimeoutError, ConsumerMetadataBehind, ConfigError):
            return None

    def topic_names(self, conf: Mapping[str, Any], timeout: float = METADATA_TIMEOUT_SECONDS) -> list[str]:
        """:func:`fetch_topic_names` with the kept client."""
        admin = self._admin_for(conf)
        try:
            return _topic_names(admin, conf, timeout)
        except BaseException:
            self.close()
            raise

    def _admin_for(self, conf: Mapping[str, Any]) -> _Admin:
        """The kept admin client, made anew (with the consumer) when the settings changed; its
        errors cleared, since only this call's errors explain its failure."""
        if self._admin is None or self._conf != dict(conf):
            self.close()  # the kept consumer too: it was made with the other settings
            self._conf = dict(conf)
            self._admin = _Admin(self._conf)
        self._admin.errors.clear()
        return self._admin

    def close(self) -> None:
        self._admin = None  # librdkafka destroys the client with the last reference
        self._close_consumer()

    def _new_consumer(self) -> Consumer:
        """One more kept consumer for :class:`~txstore.kafka.log_offsets.LookupConsumers`."""
        try:
            return Consumer(reader_config(self._conf))
        except (KafkaException, ValueError, TypeError) as e:
            raise ConfigError(
                f"Kafka client settings refused: {_error_text(e)}; check --kafka-option"
            ) from None

    def _close_consumer(self) -> None:
        lookups, self._lookups = self._lookups, None
        if lookups is not None:
            lookups.close()


def fetch_topic_names(
    conf: Mapping[str, Any], timeout: float = METADATA_TIMEOUT_SECONDS, admin: _Admin | None = None
) -> list[str]:
    """Every topic Kafka lists (internal ones too: :mod:`txstore.core.patterns` leaves them out),
    in one metadata request answered within ``timeout``, else :class:`KafkaUnavailable` in one
    line. What a topic pattern is resolved against. ``admin``: as :func:`fetch_watermarks`."""
    return _topic_names(_kept(admin, conf), conf, timeout)


def _topic_names(admin: _Admin, conf: Mapping[str, Any], timeout: float) -> list[str]:
    servers = servers_of(conf)
    try:
        metadata = admin.metadata(servers, None, timeout)
    except (KafkaException, TimeoutError) as e:
        raise admin.unavailable(servers, "a metadata request (the topics' list)", timeout, e) from None
    return sorted(
        name
        for name, topic in metadata.topics.items()
        if topic.error is None or topic.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART
    )


def _watermarks(
    admin: _Admin,
    conf: Mapping[str, Any],
    topics: Sequence[str],
    timeout: float,
    lookups: LookupConsumers | None = None,
    settled: Mapping[tuple[str, int], int] | None = None,
) -> list[PartitionWatermarks]:
    """The partitions of ``topics`` (one metadata request per topic) and their log start and end.

    The log offsets are asked with kept consumers where there are (``lookups``:
    :class:`Watermarks`, a running job): their offsets-for-times lookup takes a whole list in
    one call and answers with one list, where the admin client makes a Python future per
    partition and question (at 1,024 partitions, 41 ms against 80 ms for both questions on
    Apache Kafka). A one-off call uses the admin client, whose connection the metadata request
    has just made. With ``settled`` (kept consumers only) the log ends are asked first, then
    the log starts of the partitions :func:`~txstore.core.ranges.log_start_wanted` names.
    """
    servers = servers_of(conf)
    partitions: list[TopicPartition] = []
    try:
        for topic in topics:
            metadata = admin.metadata(servers, topic, timeout)
            found = metadata.topics.get(topic)
            missing = found is None or (
                found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            )
            if missing:
                raise UnknownTopic(
                    f"topic {topic!r} does not exist on Kafka at {servers}; check --topic "
                    "(txstore never creates topics)",
                    topic,
                    servers,
                )
            assert found is not None
            if found.error is not None or not found.partitions:
                reason = found.error.str() if found.error is not None else "no partitions"
                raise KafkaUnavailable(
                    f"topic {topic!r} is not available on Kafka at {servers}: {reason}; "
                    "check that its partitions have leaders"
                )
            partitions.extend(TopicPartition(topic, p) for p in sorted(found.partitions))
        # Both questions in flight at once (a partition is asked once per request, so the log
        # start and end are two requests): the planning round trip is one wait, not two.
        # Read-committed end (the last stable offset): reading never waits on open transactions.
        if lookups is not None:
            low, high = lookups.log_offsets(partitions, timeout, settled)
        else:
            low, high = _list_offsets_together(
                admin.client,
                (
                    _OffsetsQuestion(partitions, _EARLIEST, log_offsets=True),
                    _OffsetsQuestion(partitions, _LATEST, committed=True, log_offsets=True),
                ),
                timeout,
            )
    except (KafkaException, TimeoutError) as e:
        raise admin.unavailable(servers, "a metadata request", timeout, e) from None
    return [
        PartitionWatermarks(
            tp.topic, tp.partition, low[(tp.topic, tp.partition)], high[(tp.topic, tp.partition)]
        )
        for tp in partitions
    ]


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
) -> dict[tuple[str, int], int]:
    """Per partition, the first offset whose timestamp is at or after ``timestamp_ms``.

    Kafka's offsets-for-times lookup; a partition with no such message gets -1.
    The lookup is read-uncommitted, so an answer can lie past the last stable
    offset: callers place it with :func:`txstore.core.starting.offset_for_time`,
    which caps it (and -1) at the planner's read-committed end.
    """
    if not partitions:
        return {}
    admin = _Admin(conf)
    spec = OffsetSpec.for_timestamp(lookup_timestamp(timestamp_ms))  # type: ignore[no-untyped-call]
    try:
        return _list_offsets(admin.client, [TopicPartition(t, p) for t, p in partitions], spec, timeout)
    except (KafkaException, TimeoutError) as e:
        raise admin.unavailable(servers_of(conf), "the offsets-for-times lookup", timeout, e) from None


def offsets_for_times(
    conf: Mapping[str, Any], wanted: Mapping[tuple[str, int], int], timeout: float = METADATA_TIMEOUT_SECONDS
) -> dict[tuple[str, int], int]:
    """:func:`offsets_for_timestamp` for partitions each with its own time
    (``startingOffsetsByTimestamp``): one lookup per distinct time, -1 where no message is that late."""
    by_time: dict[int, list[tuple[str, int]]] = {}
    for key, when in wanted.items():
        by_time.setdefault(when, []).append(key)
    found: dict[tuple[str, int], int] = {}
    for when, keys in sorted(by_time.items()):
        found.update(offsets_for_timestamp(conf, sorted(keys), when, timeout))
    return found


@dataclass(frozen=True)
class _OffsetsQuestion:
    """One ListOffsets question: these partitions at ``spec`` (earliest, latest or a time).

    ``committed``: the read-committed answer (the last stable offset for latest).
    ``log_offsets``: the answer is a log start or end, never a time lookup (whose -1 means
    "no message that late"), so an answer below 0 is no offset of any log.
    """

    partitions: Sequence[TopicPartition]
    spec: Any
    committed: bool = False
    log_offsets: bool = False


def _list_offsets(
    admin: AdminClient,
    partitions: list[TopicPartition],
    spec: Any,
    timeout: float,
    committed: bool = False,
    log_offsets: bool = False,
) -> dict[tuple[str, int], int]:
    """One ListOffsets answer per partition (:func:`_list_offsets_together` with one question)."""
    question = _OffsetsQuestion(partitions, spec, committed, log_offsets)
    return _list_offsets_together(admin, (question,), timeout)[0]


def _list_offsets_together(
    admin: AdminClient, questions: Sequence[_OffsetsQuestion], timeout: float
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


_EARLIEST = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]
