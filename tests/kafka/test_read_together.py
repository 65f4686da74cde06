"""Many small ranges read on one consumer at once (txstore/kafka/together.py): exactly what each
range alone delivers, on the mock broker and on Apache Kafka, and every unusual range left to
the one-range reader, which classifies it as before."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import produce, produce_in_transactions, send
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.core.errors import DataLoss, KafkaReadError, TopicRecreated
from txstore.core.fingerprint import Fingerprint
from txstore.core.ranges import OffsetRange
from txstore.kafka import reader as reader_module
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config, reader_config
from txstore.kafka.reader import RangeReader
from txstore.kafka.together import BufferedRange, check_same_logs, read_together, together_candidates
from txstore.testing.mock_kafka import MockKafkaCluster


def alone(
    conf: dict[str, Any], r: OffsetRange
) -> tuple[list[tuple[int, bytes | None]], int, Fingerprint | None]:
    reader = RangeReader(conf, r, job="j")
    got = [(m.offset(), m.value()) for batch in reader for m in batch]
    return got, reader.messages, reader.last


def buffered(b: BufferedRange) -> tuple[list[tuple[int, bytes | None]], int, Fingerprint | None]:
    got = [(m.offset(), m.value()) for batch in b for m in batch]
    return got, b.messages, b.last


def test_ranges_read_together_deliver_exactly_what_each_range_delivers_alone(
    any_kafka: AnyKafka, new_any_topic: Callable[..., str]
) -> None:
    """Ranges ending below a log that goes on, at the log end, with transaction markers as holes
    (one at a range's end), one message long, and starting past the log start."""
    plain, marked = new_any_topic(6), new_any_topic(2)
    conf = client_config(any_kafka.bootstrap_servers)
    send(
        any_kafka.bootstrap_servers,
        plain,
        ((p, b"k", f"{p}:{i}".encode(), None) for p in range(6) for i in range(10 + 7 * p)),
    )
    produce_in_transactions(
        any_kafka.bootstrap_servers, marked, transactions=6, per_transaction=4, partitions=2
    )
    ends = {(m.topic, m.partition): m.high for m in fetch_watermarks(conf, [plain, marked])}
    ranges = [
        OffsetRange(plain, 0, 0, 5),  # the log goes on past the range
        OffsetRange(plain, 1, 3, ends[(plain, 1)]),  # to the log end
        OffsetRange(plain, 2, 7, 8),  # one message
        OffsetRange(plain, 3, 30, ends[(plain, 3)]),
        OffsetRange(plain, 4, 0, ends[(plain, 4)]),
        OffsetRange(plain, 5, 11, 11),  # nothing to read: left to the one-range reader
        OffsetRange(marked, 0, 0, ends[(marked, 0)]),  # ends on a commit marker
        OffsetRange(marked, 1, 2, ends[(marked, 1)] - 1),
    ]
    candidates = together_candidates(ranges)
    assert [r.key for r in candidates] == [r.key for r in ranges if r.size > 0]
    read = read_together(conf, candidates, job="j")
    assert sorted(read) == sorted(r.key for r in candidates)
    for r in candidates:
        assert buffered(read[r.key]) == alone(conf, r), r
    assert read[(marked, 0)].messages == 12  # 6 transactions of 4 over 2 partitions, markers skipped
    counted = read_together(conf, candidates, job="j", keep=False)  # a counting stream keeps no message
    for r in candidates:
        assert (list(counted[r.key]), counted[r.key].messages, counted[r.key].last) == (
            [],
            *alone(conf, r)[1:],
        ), r


def test_a_verified_range_compares_the_last_counted_message_and_a_different_one_is_read_alone(
    any_kafka: AnyKafka, new_any_topic: Callable[..., str]
) -> None:
    topic = new_any_topic(2)
    conf = client_config(any_kafka.bootstrap_servers)
    produce(any_kafka.bootstrap_servers, topic, {0: 20, 1: 20})
    _, _, last0 = alone(conf, OffsetRange(topic, 0, 0, 10))
    _, _, last1 = alone(conf, OffsetRange(topic, 1, 0, 10))
    assert last0 is not None and last1 is not None
    other = Fingerprint(last1.offset, last1.timestamp, "another message")
    good, bad = OffsetRange(topic, 0, 10, 20, verify=last0), OffsetRange(topic, 1, 10, 20, verify=other)
    read = read_together(conf, [good, bad], job="j")
    assert list(read) == [good.key]  # the differing one is left to the one-range reader ...
    assert buffered(read[good.key]) == alone(conf, good)
    assert read[good.key].anchor == last0
    with pytest.raises(TopicRecreated, match=r"partition 1: the topic was deleted and recreated"):
        alone(conf, bad)  # ... which refuses it, as for any range


def test_a_topic_recreated_after_the_read_is_found_by_the_check_of_every_range_at_once(
    any_kafka: AnyKafka, new_any_topic: Callable[..., str]
) -> None:
    """The check after the read (the consumer follows a topic's name into a new log): each range's
    first message, fetched again, is another one; iterating the range then raises."""
    topic = new_any_topic(3)
    conf = client_config(any_kafka.bootstrap_servers)
    produce(any_kafka.bootstrap_servers, topic, {0: 5, 1: 5, 2: 5}, value=b"old")
    ranges = [OffsetRange(topic, p, 0, 5) for p in range(3)]
    read = read_together(conf, ranges, job="j")
    assert all(b.error is None for b in read.values())
    any_kafka.recreate_topic(topic, 3)
    produce(any_kafka.bootstrap_servers, topic, {0: 5, 1: 5}, value=b"new")  # partition 2 stays empty
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # clients may name the old topic for a moment
        check_same_logs(conf, read, job="j", idle_timeout=10)
        if read[(topic, 0)].error is not None and read[(topic, 1)].error is not None:
            break
        time.sleep(0.5)
    for p in (0, 1):
        with pytest.raises(
            TopicRecreated,
            match=rf"partition {p}: the topic was deleted and recreated while offsets 0 -> 5 were read \(first read message",
        ):
            buffered(read[(topic, p)])
    assert read[(topic, 2)].error is None  # its log now ends below the message: nothing to compare


def test_past_the_byte_bound_the_ranges_not_yet_whole_are_left_to_the_one_range_reader(
    any_kafka: AnyKafka, new_any_topic: Callable[..., str]
) -> None:
    topic = new_any_topic(4)
    conf = client_config(any_kafka.bootstrap_servers)
    produce(any_kafka.bootstrap_servers, topic, {p: 50 for p in range(4)}, value=b"x" * 1000)
    ranges = [OffsetRange(topic, p, 0, 50) for p in range(4)]
    read = read_together(conf, ranges, job="j", max_bytes=120_000)  # about 2.4 ranges' bytes
    assert len(read) <= 2
    for key, b in read.items():  # what was kept is whole
        assert buffered(b) == alone(conf, b.range), key
    assert len(read_together(conf, ranges, job="j", max_bytes=250_000)) == 4


def test_a_range_whose_messages_aged_out_is_left_to_the_one_range_reader_which_says_data_loss(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    conf = client_config(kafka.bootstrap_servers)
    # The mock keeps about 5 MiB per partition: 8 MiB pushes partition 0's oldest out.
    produce(kafka.bootstrap_servers, topic, {0: 80}, value=b"x" * 100_000)
    produce(kafka.bootstrap_servers, topic, {1: 5})
    low = fetch_watermarks(conf, [topic])[0].low
    assert low > 0
    gone, kept = OffsetRange(topic, 0, 0, 80), OffsetRange(topic, 1, 0, 5)
    settings = reader_config(conf)
    pooled, topics = reader_module._consumers.take(settings)  # the consumer read_together takes next
    reader_module._consumers.give_back(settings, pooled, topics)
    read = read_together(conf, [gone, kept], job="j")
    assert list(read) == [kept.key]
    with pytest.raises(RuntimeError):
        pooled.assignment()  # it saw the partition's error: closed, as the one-range reader's rule
    with pytest.raises(DataLoss, match=rf"'{topic}' partition 0: offset 0 is no longer in Kafka"):
        alone(conf, gone)


def test_a_range_planned_past_its_log_end_is_left_to_the_one_range_reader_at_once(
    any_kafka: AnyKafka, new_any_topic: Callable[..., str]
) -> None:
    """A log that ends below ``until`` (truncated, or another log): the one-range reader waits and
    names it; the read together does not wait for it first."""
    topic = new_any_topic(2)
    conf = client_config(any_kafka.bootstrap_servers)
    produce(any_kafka.bootstrap_servers, topic, {0: 5, 1: 5})
    short, kept = OffsetRange(topic, 0, 0, 9), OffsetRange(topic, 1, 0, 5)
    started = time.monotonic()
    read = read_together(conf, [short, kept], job="j", idle_timeout=20)
    assert time.monotonic() - started < 10
    assert list(read) == [kept.key]


def test_a_partition_twice_in_one_task_and_empty_or_wide_ranges_are_not_read_together() -> None:
    twice = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 0, 5)]
    assert together_candidates(twice) == [OffsetRange("t", 1, 0, 5)]
    assert together_candidates([OffsetRange("t", 0, 3, 3), OffsetRange("t", 1, 0, 10_001)]) == []


@pytest.mark.slow
def test_a_broker_that_stays_down_ends_the_read_together_with_one_timeout_naming_a_range(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    conf = client_config(kafka.bootstrap_servers)
    produce(kafka.bootstrap_servers, topic, {0: 10, 1: 10})
    ranges = [OffsetRange(topic, 0, 0, 10), OffsetRange(topic, 1, 0, 10)]
    read_together(conf, ranges, job="j")  # the consumer knows the topic: the wait is the read's
    kafka.set_broker_down(1)
    started = time.monotonic()
    try:
        with pytest.raises(
            KafkaReadError,
            match=rf"no data from Kafka .* for 3s while reading '{topic}' partition \d at offset 0 "
            r"\(range 0 -> 10, and 1 more ranges read together\)",
        ):
            read_together(conf, ranges, job="j", idle_timeout=3)
    finally:
        kafka.set_broker_up(1)
    assert time.monotonic() - started < 15  # one timeout, not one a range
