"""What real Apache Kafka showed (tests/kafka/test_real_kafka.py), pinned down on the mock broker.

Right after a broker restarts, its metadata already names each partition's new
leader epoch while the partition has not taken it up: ListOffsets answers
UNKNOWN_LEADER_EPOCH for a moment (about half of the real restarts tried, for
under a second). librdkafka's admin client fails the partition at once where
Kafka's own retries, so planning failed a ``--once`` job saying Kafka "did not
answer within 15s". The mock answers the same errors on demand, every time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition

from tests.conftest import produce
from tests.helpers.fake_kafka import FakeLog, install_with_admin
from txstore.core.errors import KafkaUnavailable
from txstore.kafka import client as client_module
from txstore.kafka.client import Watermarks, fetch_watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.list_offsets import (
    EARLIEST,
    LATEST,
    OffsetsQuestion,
    list_offsets_together,
    offsets_for_timestamp,
)
from txstore.kafka.log_offsets import (
    LOOKUP_CHUNK,
    LOOKUP_CONSUMERS,
    ConsumerMetadataBehind,
    LookupConsumers,
    consumer_lookup,
    consumers_for,
)
from txstore.testing.mock_kafka import MockKafkaCluster

LIST_OFFSETS_API = 2


def test_list_offsets_during_a_leadership_move_is_asked_again_within_the_timeout(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 2})
    moving = [
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
    ]
    conf = client_config(kafka.bootstrap_servers)
    kafka.push_request_errors(LIST_OFFSETS_API, *moving)
    try:
        marks = fetch_watermarks(conf, [topic])
        kafka.push_request_errors(LIST_OFFSETS_API, KafkaError.UNKNOWN_LEADER_EPOCH)
        found = offsets_for_timestamp(conf, [(topic, 0)], 0)
    finally:
        kafka.clear_request_errors(LIST_OFFSETS_API)
    assert {m.partition: (m.low, m.high) for m in marks} == {0: (0, 3), 1: (0, 2)}
    assert found == {(topic, 0): -1}  # answered (the mock answers -1 to every time lookup)


def test_a_kept_watermarks_consumer_asks_a_moving_leadership_again_and_reads_the_same_offsets(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """A running job's :class:`Watermarks` asks the log offsets with its kept consumer: the same
    answers as a one-off call, and the same patience with a leadership that is moving."""
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 2})
    conf = client_config(kafka.bootstrap_servers)
    kept = Watermarks()
    try:
        first = kept(conf, [topic])
        kafka.push_request_errors(
            LIST_OFFSETS_API,
            KafkaError.UNKNOWN_LEADER_EPOCH,
            KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError.LEADER_NOT_AVAILABLE,
        )
        moving = kept(conf, [topic])
    finally:
        kafka.clear_request_errors(LIST_OFFSETS_API)
        kept.close()
    assert first == moving == fetch_watermarks(conf, [topic])
    assert {m.partition: (m.low, m.high) for m in moving} == {0: (0, 3), 1: (0, 2)}


class _AnsweringConsumer:
    """confluent-kafka's Consumer.offsets_for_times answering from a list of answers, as the
    restarted Apache Kafka of :class:`_AnsweringAdmin` did (-1001 while a log was loading)."""

    def __init__(self, answers: list[dict[tuple[str, int], int]]) -> None:
        self.answers = answers
        self.asked: list[list[tuple[str, int, int]]] = []
        self.timeouts: list[float] = []  # each call's timeout

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        self.asked.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])
        self.timeouts.append(timeout)
        answer = self.answers[min(len(self.asked) - 1, len(self.answers) - 1)]
        return [TopicPartition(tp.topic, tp.partition, answer[(tp.topic, tp.partition)]) for tp in partitions]


def kept_by(consumer: _AnsweringConsumer) -> LookupConsumers:
    """Kept consumers that are all ``consumer`` (a test's answers)."""
    return LookupConsumers(lambda: consumer)  # type: ignore[arg-type,return-value]


def test_the_kept_consumer_asks_a_log_offset_below_zero_again_and_never_takes_it_as_the_log() -> None:
    partitions = [TopicPartition("t", 0), TopicPartition("t", 1)]
    consumer = _AnsweringConsumer(
        [
            {("t", 0): -1001, ("t", 1): 7},  # log end, partition 0 still loading
            {("t", 0): 12, ("t", 1): 99},  # partition 0 asked again
            {("t", 0): 0, ("t", 1): 0},  # log start
        ]
    )
    low, high = kept_by(consumer).log_offsets(partitions, timeout=5.0)
    assert low == {("t", 0): 0, ("t", 1): 0}
    assert high == {("t", 0): 12, ("t", 1): 7}
    # The end is timestamp -1 and the log start -2 in Kafka's ListOffsets; only partition 0 again.
    assert consumer.asked == [[("t", 0, -1), ("t", 1, -1)], [("t", 0, -1)], [("t", 0, -2), ("t", 1, -2)]]
    stuck = _AnsweringConsumer([{("t", 0): -1001}])
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"t/0.*-1001"):
        kept_by(stuck).log_offsets([TopicPartition("t", 0)], timeout=1.0)
    assert 0.8 < time.monotonic() - started < 5


def test_the_kept_consumer_asks_the_log_start_only_of_partitions_not_at_their_committed_end() -> None:
    partitions = [TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)]
    ends = {("t", 0): 5, ("t", 1): 7, ("t", 2): 4}
    busy = _AnsweringConsumer([ends, {("t", 1): 2, ("t", 2): 1}])
    settled = {("t", 0): 5, ("t", 1): 3}  # 0 at its end; 1 below it; 2 has no committed offset
    low, high = kept_by(busy).log_offsets(partitions, 5.0, settled)
    assert high == ends and low == {("t", 0): 5, ("t", 1): 2, ("t", 2): 1}
    assert busy.asked == [[("t", 0, -1), ("t", 1, -1), ("t", 2, -1)], [("t", 1, -2), ("t", 2, -2)]]
    idle = _AnsweringConsumer([ends])
    low, high = kept_by(idle).log_offsets(partitions, 5.0, dict(ends))
    assert low == high == ends
    assert idle.asked == [[("t", 0, -1), ("t", 1, -1), ("t", 2, -1)]]  # one question, not two


def test_the_kept_consumer_asks_a_long_list_in_chunks_and_again_only_what_a_chunk_left() -> None:
    partitions = [("t", p) for p in range(5)]
    consumer = _AnsweringConsumer(
        [
            {("t", 0): 10, ("t", 1): 11},  # first chunk
            {("t", 2): 12, ("t", 3): -1001},  # second: partition 3 still loading
            {("t", 4): 14},  # third
            {("t", 3): 13},  # partition 3 asked again, alone
        ]
    )
    deadline = time.monotonic() + 5.0
    found = consumer_lookup([consumer], partitions, -1, deadline, chunk=2)  # type: ignore[list-item]
    assert found == {("t", p): 10 + p for p in range(5)}
    assert consumer.asked == [
        [("t", 0, -1), ("t", 1, -1)],
        [("t", 2, -1), ("t", 3, -1)],
        [("t", 4, -1)],
        [("t", 3, -1)],
    ]


def test_a_lookup_takes_one_kept_consumer_a_chunk_up_to_its_most() -> None:
    assert [consumers_for(n, 256) for n in (0, 1, 256, 257, 512, 1024, 1025, 100_000)] == [
        1,
        1,
        1,
        2,
        2,
        4,
        4,
        4,
    ]
    assert LOOKUP_CONSUMERS == 4 and consumers_for(LOOKUP_CHUNK + 1) == 2


def test_the_kept_consumers_ask_their_shares_of_chunks_side_by_side_and_again_only_what_each_left() -> None:
    """Chunk i goes to consumer i modulo their number, each consumer's chunks one after another;
    what a chunk left is shared again among the consumers; the answers are merged."""
    partitions = [("t", p) for p in range(7)]
    first = _AnsweringConsumer(
        [{("t", 0): 10, ("t", 1): 11}, {("t", 4): 14, ("t", 5): -1001}, {("t", 5): 15}]
    )
    second = _AnsweringConsumer([{("t", 2): 12, ("t", 3): 13}, {("t", 6): 16}])
    made = iter([first, second])
    kept = LookupConsumers(lambda: next(made), chunk=2, most=2)  # type: ignore[arg-type,return-value]
    try:
        found = kept.lookup(partitions, -1, time.monotonic() + 5.0)
    finally:
        kept.close()
    assert found == {("t", p): 10 + p for p in range(7)}
    assert all(0 < t <= 5.0 for t in first.timeouts + second.timeouts)  # each call within the deadline
    assert first.asked == [[("t", 0, -1), ("t", 1, -1)], [("t", 4, -1), ("t", 5, -1)], [("t", 5, -1)]]
    assert second.asked == [[("t", 2, -1), ("t", 3, -1)], [("t", 6, -1)]]


class _SlowConsumer(_AnsweringConsumer):
    """Answers after ``seconds``; remembers when it answered and whether it was closed."""

    def __init__(self, answers: list[dict[tuple[str, int], int]], seconds: float) -> None:
        super().__init__(answers)
        self.seconds, self.answered_at, self.closed = seconds, 0.0, False

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        time.sleep(self.seconds)
        self.answered_at = time.monotonic()
        return super().offsets_for_times(partitions, timeout)

    def close(self) -> None:
        self.closed = True


class _RefusingConsumer(_AnsweringConsumer):
    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))


def test_a_share_refused_is_raised_only_once_every_other_share_has_answered_and_close_stops_all() -> None:
    """No consumer is still asking when its caller, told of the error, closes them all."""
    refusing = _RefusingConsumer([])
    slow = _SlowConsumer([{("t", 1): 1}], seconds=0.3)
    made = iter([refusing, slow])
    kept = LookupConsumers(lambda: next(made), chunk=1, most=2)  # type: ignore[arg-type,return-value]
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        kept.lookup([("t", 0), ("t", 1)], -1, time.monotonic() + 5.0)
    raised_at = time.monotonic()
    assert 0 < slow.answered_at <= raised_at
    assert kept.started
    kept.close()
    assert slow.closed and not kept.started
    assert not [t for t in threading.enumerate() if t.name.startswith("txstore-lookup")]  # stopped


class _ErringConsumer(_AnsweringConsumer):
    """Answers every partition with ``error``, or fails the whole call with it (``whole``)."""

    def __init__(self, error: int, whole: bool) -> None:
        super().__init__([])
        self.error, self.whole = KafkaError(error), whole

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = 0) -> list[Any]:
        if self.whole:
            raise KafkaException(self.error)
        return [
            SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=-1, error=self.error)
            for tp in partitions
        ]


@pytest.mark.parametrize("whole", [True, False], ids=["the-whole-call", "a-partition"])
def test_a_partition_the_kept_consumer_does_not_know_is_told_apart_from_a_refusal(whole: bool) -> None:
    """A partition (or topic) the consumer's metadata does not have yet: the caller asks the
    admin client instead. Any other error is raised as it is."""
    unknown = kept_by(_ErringConsumer(KafkaError._UNKNOWN_PARTITION, whole))
    with pytest.raises(ConsumerMetadataBehind):
        unknown.lookup([("t", 0)], -1, time.monotonic() + 5.0)
    refused = kept_by(_ErringConsumer(KafkaError.TOPIC_AUTHORIZATION_FAILED, whole))
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        refused.lookup([("t", 0)], -1, time.monotonic() + 5.0)


def test_the_kept_consumer_answers_more_partitions_than_a_chunk_as_the_admin_client_does(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(LOOKUP_CHUNK + 44)
    produce(
        kafka.bootstrap_servers, topic, {0: 3, LOOKUP_CHUNK - 1: 2, LOOKUP_CHUNK: 5, LOOKUP_CHUNK + 43: 1}
    )
    conf = client_config(kafka.bootstrap_servers)
    kept = Watermarks()
    try:
        assert kept(conf, [topic]) == fetch_watermarks(conf, [topic])
        ends = {(w.topic, w.partition): w.high for w in kept(conf, [topic])}
    finally:
        kept.close()
    assert len(ends) == LOOKUP_CHUNK + 44 and sum(ends.values()) == 11
    assert ends[(topic, LOOKUP_CHUNK)] == 5


@pytest.mark.parametrize("client", ["one-off", "kept"])
def test_other_list_offsets_errors_still_fail_at_once(
    kafka: MockKafkaCluster, new_topic: Callable[..., str], client: str
) -> None:
    topic = new_topic(1)
    watermarks = fetch_watermarks if client == "one-off" else Watermarks()
    kafka.push_request_errors(LIST_OFFSETS_API, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailable, match="Topic authorization failed"):
            watermarks(client_config(kafka.bootstrap_servers), [topic])
    finally:
        kafka.clear_request_errors(LIST_OFFSETS_API)
    assert time.monotonic() - started < 5


def test_a_leadership_that_never_settles_fails_once_the_timeout_is_spent(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    kafka.push_request_errors(LIST_OFFSETS_API, *[KafkaError.UNKNOWN_LEADER_EPOCH] * 500)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailable, match="Leader epoch is newer than broker epoch"):
            fetch_watermarks(client_config(kafka.bootstrap_servers), [topic], timeout=1.0)
    finally:
        kafka.clear_request_errors(LIST_OFFSETS_API)
    assert 0.8 < time.monotonic() - started < 6


@pytest.mark.parametrize("client", ["one-off", "kept"])
def test_a_leadership_still_moving_at_the_timeout_is_named_as_such_not_as_a_broker_that_did_not_answer(
    kafka: MockKafkaCluster, new_topic: Callable[..., str], client: str
) -> None:
    """A topic just created (its leaders being elected) or a broker restarting: Kafka answers,
    NOT_LEADER_FOR_PARTITION, until the timeout. The line says that and what to do, with the
    topic, not "did not answer" (seen at 1,024 partitions on a freshly created topic)."""
    topic = new_topic(1)
    watermarks = fetch_watermarks if client == "one-off" else Watermarks()
    kafka.push_request_errors(LIST_OFFSETS_API, *[KafkaError.NOT_LEADER_FOR_PARTITION] * 500)
    try:
        with pytest.raises(KafkaUnavailable) as refused:
            watermarks(client_config(kafka.bootstrap_servers), [topic], timeout=1.0)
    finally:
        kafka.clear_request_errors(LIST_OFFSETS_API)
    line = str(refused.value)
    assert "did not answer" not in line and "\n" not in line
    assert f"{topic}/0" in line and "leadership" in line and "after 1s" in line
    assert "Not leader for partition" in line  # Kafka's own words, for a search
    assert "run again" in line  # what to do


class _AnsweringAdmin:
    """confluent-kafka's AdminClient.list_offsets as a restarted Apache Kafka answered it in a
    chaos trial (seed 131, broker killed mid-read): no error, offset -1001 (librdkafka's
    OFFSET_INVALID) for a partition whose log was still loading; then the real offsets."""

    def __init__(self, answers: list[dict[tuple[str, int], int]]) -> None:
        self.answers = answers
        self.calls = 0

    def list_offsets(self, requests: Any, isolation_level: Any = None, request_timeout: float = 0) -> Any:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        futures = {}
        for tp in requests:
            future: Future[Any] = Future()
            future.set_result(SimpleNamespace(offset=answer[(tp.topic, tp.partition)]))
            futures[tp] = future
        return futures


def test_an_invalid_offset_in_a_log_offsets_answer_is_asked_again_never_taken_as_the_log() -> None:
    # Taken as the log end, -1001 stopped the job: "stored offset 0 is beyond the log-end offset
    # -1001 (topic deleted and recreated ...)".
    partitions = [TopicPartition("t", 0), TopicPartition("t", 1)]
    admin = _AnsweringAdmin([{("t", 0): -1001, ("t", 1): 7}, {("t", 0): 12, ("t", 1): 7}])
    assert list_offsets_together(admin, [OffsetsQuestion(partitions, LATEST, log_offsets=True)], 5.0)[0] == {
        ("t", 0): 12,
        ("t", 1): 7,
    }
    assert admin.calls == 2


def test_an_invalid_log_offset_that_stays_fails_as_kafka_unavailable_once_the_timeout_is_spent() -> None:
    admin = _AnsweringAdmin([{("t", 0): -1001}])
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"t/0.*-1001"):
        list_offsets_together(
            admin, [OffsetsQuestion([TopicPartition("t", 0)], LATEST, log_offsets=True)], 1.0
        )
    assert 0.8 < time.monotonic() - started < 5


def test_a_time_lookups_minus_one_stays_an_answer() -> None:
    admin = _AnsweringAdmin([{("t", 0): -1}])
    assert list_offsets_together(admin, [OffsetsQuestion([TopicPartition("t", 0)], LATEST)], 1.0)[0] == {
        ("t", 0): -1
    }
    assert admin.calls == 1


class _RecordingAdmin(_AnsweringAdmin):
    """Records when each question is sent and when an answer is first waited for."""

    def __init__(self, answers: list[dict[tuple[str, int], int]]) -> None:
        super().__init__(answers)
        self.events: list[str] = []

    def list_offsets(self, requests: Any, isolation_level: Any = None, request_timeout: float = 0) -> Any:
        self.events.append(f"ask {sorted(tp.partition for tp in requests)} {isolation_level}")
        futures = super().list_offsets(requests, isolation_level, request_timeout)
        events = self.events

        return {tp: _WaitedFor(inner, events) for tp, inner in futures.items()}


class _WaitedFor:
    """A future that records in ``events`` each time its answer is waited for."""

    def __init__(self, inner: Future[Any], events: list[str]) -> None:
        self.inner = inner
        self.events = events

    def result(self, timeout: float | None = None) -> Any:
        self.events.append("wait")
        return self.inner.result(timeout)


def test_the_log_start_and_end_are_asked_at_once_and_only_a_questions_unsettled_partitions_again() -> None:
    partitions = [TopicPartition("t", 0), TopicPartition("t", 1)]
    admin = _RecordingAdmin(
        [
            {("t", 0): 0, ("t", 1): 0},  # log start
            {("t", 0): -1001, ("t", 1): 9},  # log end, partition 0 still loading
            {("t", 0): 12, ("t", 1): 99},  # partition 0 asked again
        ]
    )
    low, high = list_offsets_together(
        admin,
        (
            OffsetsQuestion(partitions, EARLIEST, log_offsets=True),
            OffsetsQuestion(partitions, LATEST, committed=True, log_offsets=True),
        ),
        timeout=5.0,
    )
    assert low == {("t", 0): 0, ("t", 1): 0}
    assert high == {("t", 0): 12, ("t", 1): 9}
    read_uncommitted, read_committed = IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED
    assert admin.events[:2] == [f"ask [0, 1] {read_uncommitted}", f"ask [0, 1] {read_committed}"]
    assert admin.events[2:] == ["wait"] * 4 + [f"ask [0] {read_committed}", "wait"]


def test_kept_watermarks_given_other_settings_ask_with_a_consumer_made_with_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer made with the old settings (another broker, other credentials) is never
    asked again, whichever of the kept client's calls saw the new settings first."""
    fake = install_with_admin(monkeypatch)
    fake.add(FakeLog.of("t", 0, range(3)))
    make = client_module.Consumer
    made: list[Any] = []
    monkeypatch.setattr(client_module, "Consumer", lambda conf: made.append(make(conf)) or made[-1])
    kept = Watermarks()
    first = {"bootstrap.servers": "one:9092"}
    second = {"bootstrap.servers": "two:9092"}
    assert [(w.low, w.high) for w in kept(first, ["t"])] == [(0, 3)]
    assert [c.conf["bootstrap.servers"] for c in made] == ["one:9092"]
    kept.topic_names(second)
    assert made[0].closed
    assert [(w.low, w.high) for w in kept(second, ["t"])] == [(0, 3)]
    assert [c.conf["bootstrap.servers"] for c in made] == ["one:9092", "two:9092"] and not made[1].closed
    kept.close()
    assert made[1].closed
