"""Kafka's side of telling a recreated topic: topic IDs (KIP-516) and the message at an offset.

Topic IDs are an extra check beside the last-message fingerprint
(:mod:`txstore.core.fingerprint`), never a reason to fail: a broker that has none,
or cannot answer (librdkafka's mock broker names no controller and never
answers DescribeTopics), yields no ID, and a job asks such a broker only once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection

from txstore.core.errors import KafkaReadError
from txstore.core.fingerprint import Fingerprint, fingerprint
from txstore.core.ranges import OffsetRange, PartitionWatermarks
from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS, Admin
from txstore.kafka.client_settings import servers_of
from txstore.kafka.first_messages import first_messages
from txstore.kafka.reader import RangeReader, _out_of_range

TOPIC_ID_TIMEOUT_SECONDS = 3.0
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the all-zero UUID: the broker has no ID for the topic


def fetch_topic_ids(
    conf: Mapping[str, Any],
    topics: Sequence[str],
    timeout: float = TOPIC_ID_TIMEOUT_SECONDS,
    admin: Admin | None = None,
) -> dict[str, str]:
    """Kafka's topic ID per topic, for the topics the broker reports one for (else empty).
    ``admin``: a client the caller already asked through (else a new one)."""
    if not topics:
        return {}
    return _topic_ids(admin if admin is not None else Admin(conf), topics, timeout) or {}


class TopicIds:
    """:func:`fetch_topic_ids` for a job's life: one AdminClient, and once a broker has
    not answered it is never asked again, so planning never waits for it twice. Once it has
    answered, its controller is not checked again (a metadata request per plan: at 1,024
    partitions, about 4 ms of building each partition's metadata)."""

    def __init__(self, admins: Callable[[Mapping[str, Any]], Admin] | None = None) -> None:
        """``admins``: the admin client to ask through, for the settings given, e.g. the job's
        :meth:`Watermarks.admin_for <txstore.kafka.client.Watermarks.admin_for>`, so that its
        log offsets and topic IDs share one client (a query's start waited for a second client's
        first answer: :class:`~txstore.kafka.admin.Admin`); by default a client of its own."""
        self._admins = admins
        self._admin: Admin | None = None
        self._conf: dict[str, Any] = {}
        self._supported: bool | None = None  # None: not asked yet

    def __call__(
        self, conf: Mapping[str, Any], topics: Sequence[str], timeout: float = TOPIC_ID_TIMEOUT_SECONDS
    ) -> dict[str, str]:
        if self._supported is False or not topics:
            return {}
        ids = _topic_ids(self._admin_for(conf), topics, timeout, check_controller=not self._supported)
        if ids is None:
            if self._supported is None:
                self._supported = False
            return {}  # answered before: a passing failure, checked again next time
        self._supported = True
        return ids

    def _admin_for(self, conf: Mapping[str, Any]) -> Admin:
        if self._admins is not None:
            return self._admins(conf)
        if self._admin is None or self._conf != dict(conf):
            self._conf = dict(conf)
            self._admin = Admin(self._conf)
        return self._admin

    def close(self) -> None:
        self._admin = None


def _topic_ids(
    admin: Admin, topics: Sequence[str], timeout: float, check_controller: bool = True
) -> dict[str, str] | None:
    """Topic IDs from DescribeTopics, or None if the broker cannot answer it.

    The cheap check first (``check_controller``): DescribeTopics goes to the controller, and a
    broker whose metadata names no controller among its brokers cannot answer it.
    """
    try:
        if check_controller:
            metadata = admin.client.list_topics(topics[0], timeout=timeout)
            if metadata.controller_id not in metadata.brokers:
                return None
        futures = admin.client.describe_topics(TopicCollection(list(topics)), request_timeout=timeout)
        found = {name: str(f.result(timeout=timeout).topic_id) for name, f in futures.items()}
    except (KafkaException, TimeoutError):
        return None
    return {name: topic_id for name, topic_id in found.items() if topic_id and topic_id != _NO_TOPIC_ID}


def read_message_at(
    conf: Mapping[str, Any],
    topic: str,
    partition: int,
    offset: int,
    timeout: float = METADATA_TIMEOUT_SECONDS,
) -> Fingerprint | None:
    """The fingerprint of the message at ``offset``, or None if there is none (compacted, a marker)."""
    reader = RangeReader(conf, OffsetRange(topic, partition, offset, offset + 1), idle_timeout=timeout)
    for batch in reader:
        for message in batch:
            if message.offset() == offset:
                return fingerprint(message)
    return None


def message_at_last_counted(
    conf: Mapping[str, Any],
    topic: str,
    partition: int,
    last: Fingerprint | None,
    marks: PartitionWatermarks | None,
    timeout: float = METADATA_TIMEOUT_SECONDS,
) -> Fingerprint | None:
    """The message now at the offset of the last one counted (``last``), where the log
    (``marks``) still holds that offset; None otherwise. What ``reset`` and ``status --check``
    compare with ``last`` to tell a recreated topic."""
    if last is None or marks is None or not marks.low <= last.offset < marks.high:
        return None
    return read_message_at(conf, topic, partition, last.offset, timeout)


def messages_at_last_counted(
    conf: Mapping[str, Any],
    wanted: Sequence[tuple[str, int, Fingerprint | None, PartitionWatermarks | None]],
    timeout: float = METADATA_TIMEOUT_SECONDS,
) -> dict[tuple[str, int], Fingerprint | None]:
    """:func:`message_at_last_counted` of many partitions (topic, partition, last counted, watermarks)
    at once, with one consumer: what ``status --check`` and ``reset`` compare on a thousand
    partitions (one read each took about 55 ms: a minute at 1,024).

    Steps: read every partition whose log still holds its last-counted offset from that offset
    (:func:`~txstore.kafka.first_messages.first_messages`, one assignment); judge what each gave
    first: the message at the offset (a later one when that offset is a transaction marker or was
    compacted away: None), its end (None), out of range (None). Another error, or no answer from a
    partition for ``timeout`` seconds, raises :class:`KafkaReadError` in one line."""
    found: dict[tuple[str, int], Fingerprint | None] = {(t, p): None for t, p, _, _ in wanted}
    pending = {
        (t, p): last.offset
        for t, p, last, marks in wanted
        if last is not None and marks is not None and marks.low <= last.offset < marks.high
    }
    answers = first_messages(conf, pending, timeout)
    silent = sorted(set(pending) - set(answers))
    if silent:
        t, p = silent[0]
        raise KafkaReadError(
            f"no data from Kafka at {servers_of(conf)} for {timeout:g}s while reading the last "
            f"counted messages of {len(silent)} partitions (first: {t!r} partition {p} at offset "
            f"{pending[(t, p)]}); is the broker up?"
        )
    for key, m in sorted(answers.items()):
        error = m.error()
        if error is not None and error.code() != KafkaError._PARTITION_EOF and not _out_of_range(error):
            raise KafkaReadError(
                f"reading the last counted message of {key[0]!r} partition {key[1]} at offset "
                f"{pending[key]} from Kafka at {servers_of(conf)}: {error.str()}"
            )
        if error is None and m.offset() == pending[key]:
            found[key] = fingerprint(m)
    return found
