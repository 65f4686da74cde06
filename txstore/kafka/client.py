"""Kafka adapter: partitions and their watermarks, and the topics Kafka lists (the client:
:mod:`txstore.kafka.admin`; offsets for times: :mod:`txstore.kafka.list_offsets`; the settings:
:mod:`txstore.kafka.client_settings`).

Every call has a timeout. Reading a range is :mod:`txstore.kafka.reader`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from txstore.core.env import BOOTSTRAP_ENV as BOOTSTRAP_ENV
from txstore.core.errors import ConfigError, KafkaUnavailable, UnknownTopic
from txstore.core.ranges import PartitionWatermarks
from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS, Admin, error_text, kept
from txstore.kafka.client_settings import reader_config, servers_of
from txstore.kafka.list_offsets import EARLIEST, LATEST, OffsetsQuestion, list_offsets_together
from txstore.kafka.log_offsets import (
    LOG_END_TIMESTAMP,
    ConsumerMetadataBehind,
    LookupConsumers,
)

ENDS_TIMEOUT_SECONDS = 2.0
"""How long an idle plan's log-end lookup (:meth:`Watermarks.ends`) may take before the plan is
made the whole way, which waits up to :data:`METADATA_TIMEOUT_SECONDS` and says what is wrong."""


def fetch_watermarks(
    conf: Mapping[str, Any],
    topics: Sequence[str],
    timeout: float = METADATA_TIMEOUT_SECONDS,
    admin: Admin | None = None,
) -> list[PartitionWatermarks]:
    """Every partition of ``topics`` with its log-start and log-end offsets.

    One metadata request and two batched ListOffsets requests, whatever the
    partition count. Raises :class:`UnknownTopic` for a topic Kafka does not
    have (it is never created), :class:`KafkaUnavailable` (with the broker
    address and the broker's last error) on timeout. ``admin``: ask through this
    client (:class:`~txstore.kafka.admin.Admin`), else through a new one.
    """
    return _watermarks(kept(admin, conf), conf, topics, timeout)


class Watermarks:
    """:func:`fetch_watermarks` with one AdminClient kept across calls.

    A job plans a batch every interval; keeping the client saves its start
    and connection setup each time. After a failed call the client is
    dropped and the next call starts a new one.
    """

    def __init__(self) -> None:
        self._admin: Admin | None = None
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
        admin = self.admin_for(conf)
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
        admin = self.admin_for(conf)
        try:
            return _topic_names(admin, conf, timeout)
        except BaseException:
            self.close()
            raise

    def admin_for(self, conf: Mapping[str, Any]) -> Admin:
        """The kept admin client, made anew (with the consumer) when the settings changed; its
        errors cleared, since only this call's errors explain its failure. A job's
        :class:`~txstore.kafka.topic_ids.TopicIds` asks through it too: a new client waits for its
        first answer (:class:`~txstore.kafka.admin.Admin`), a kept one about 2 ms."""
        if self._admin is None or self._conf != dict(conf):
            self.close()  # the kept consumer too: it was made with the other settings
            self._conf = dict(conf)
            self._admin = Admin(self._conf)
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
                f"Kafka client settings refused: {error_text(e)}; check --kafka-option"
            ) from None

    def _close_consumer(self) -> None:
        lookups, self._lookups = self._lookups, None
        if lookups is not None:
            lookups.close()


def fetch_topic_names(
    conf: Mapping[str, Any], timeout: float = METADATA_TIMEOUT_SECONDS, admin: Admin | None = None
) -> list[str]:
    """Every topic Kafka lists (internal ones too: :mod:`txstore.core.patterns` leaves them out),
    in one metadata request answered within ``timeout``, else :class:`KafkaUnavailable` in one
    line. What a topic pattern is resolved against. ``admin``: as :func:`fetch_watermarks`."""
    return _topic_names(kept(admin, conf), conf, timeout)


def _topic_names(admin: Admin, conf: Mapping[str, Any], timeout: float) -> list[str]:
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
    admin: Admin,
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
            low, high = list_offsets_together(
                admin.client,
                (
                    OffsetsQuestion(partitions, EARLIEST, log_offsets=True),
                    OffsetsQuestion(partitions, LATEST, committed=True, log_offsets=True),
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
