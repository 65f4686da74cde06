"""Reading ranges and watermarks from the Kafka-protocol test broker."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import pytest

from tests.conftest import produce, produce_in_transactions
from txstore.core.errors import DataLoss, KafkaReadError
from txstore.core.ranges import OffsetRange
from txstore.kafka import reader as reader_module
from txstore.kafka.client import fetch_watermarks
from txstore.kafka.client_settings import client_config, reader_config
from txstore.kafka.reader import CONSUMERS_KEPT, RangeReader, gc_paused, last_messages
from txstore.testing.mock_kafka import MockKafkaCluster


def offsets_read(kafka: MockKafkaCluster, r: OffsetRange, **kwargs: float) -> list[int]:
    reader = RangeReader(client_config(kafka.bootstrap_servers), r, **kwargs)  # type: ignore[arg-type]
    got = [m.offset() for batch in reader for m in batch]
    assert reader.messages == len(got)
    return got


def test_watermarks_cover_every_partition_of_every_topic(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    a, b = new_topic(3), new_topic(1)
    produce(kafka.bootstrap_servers, a, {0: 5, 2: 7})
    marks = fetch_watermarks(client_config(kafka.bootstrap_servers), [a, b])
    assert [(m.topic, m.partition, m.low, m.high) for m in marks] == [
        (a, 0, 0, 5),
        (a, 1, 0, 0),
        (a, 2, 0, 7),
        (b, 0, 0, 0),
    ]


def test_reads_exactly_the_range_even_when_the_partition_goes_on(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 100})
    assert offsets_read(kafka, OffsetRange(topic, 0, 10, 60)) == list(range(10, 60))
    assert offsets_read(kafka, OffsetRange(topic, 0, 60, 100)) == list(range(60, 100))
    assert offsets_read(kafka, OffsetRange(topic, 0, 5, 5)) == []


def test_reads_in_batches_no_larger_than_asked(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 250})
    reader = RangeReader(client_config(kafka.bootstrap_servers), OffsetRange(topic, 0, 0, 250), batch_size=64)
    sizes = [len(b) for b in reader]
    assert sum(sizes) == 250
    assert max(sizes) <= 64
    assert len(sizes) >= 4


def test_offsets_with_holes_stop_by_offset_not_by_count(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """Transaction markers leave holes, one of them at the very end of the range."""
    topic = new_topic(1)
    produce_in_transactions(kafka.bootstrap_servers, topic, transactions=3, per_transaction=4, partitions=1)
    marks = fetch_watermarks(client_config(kafka.bootstrap_servers), [topic])[0]
    assert marks.high > 12  # 12 messages plus markers
    got = offsets_read(kafka, OffsetRange(topic, 0, 0, marks.high), idle_timeout=5)
    assert len(got) == 12
    assert got[-1] < marks.high - 1  # the last offset of the range is a marker, not a message


def test_messages_aged_out_by_retention_fail_loudly(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    # The broker keeps about 5 MiB per partition: 8 MiB pushes the oldest out.
    produce(kafka.bootstrap_servers, topic, {0: 80}, value=b"x" * 100_000)
    marks = fetch_watermarks(client_config(kafka.bootstrap_servers), [topic])[0]
    assert marks.low > 0
    with pytest.raises(DataLoss, match=rf"'{topic}' partition 0: offset 0 is no longer in Kafka"):
        offsets_read(kafka, OffsetRange(topic, 0, 0, marks.high))


@pytest.mark.slow
def test_a_broker_that_stays_down_ends_the_read_with_a_timeout(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 10})
    kafka.set_broker_down(1)
    try:
        with pytest.raises(
            KafkaReadError, match=r"no data from Kafka .* for 3s while reading .* at offset 0"
        ):
            offsets_read(kafka, OffsetRange(topic, 0, 0, 10), idle_timeout=3)
    finally:
        kafka.set_broker_up(1)


def test_one_process_reuses_its_consumer_and_still_reads_exactly_each_range(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 100, 1: 30})
    conf = client_config(kafka.bootstrap_servers)
    # The partition goes on past the first range (data beyond `until` is prefetched),
    # the next ranges switch partition, go back to lower offsets, and read to the end.
    assert offsets_read(kafka, OffsetRange(topic, 0, 0, 50)) == list(range(50))
    pooled, topics = reader_module._consumers.take(reader_config(conf))
    reader_module._consumers.give_back(reader_config(conf), pooled, topics)
    assert offsets_read(kafka, OffsetRange(topic, 1, 5, 15)) == list(range(5, 15))
    assert offsets_read(kafka, OffsetRange(topic, 0, 10, 20)) == list(range(10, 20))
    assert offsets_read(kafka, OffsetRange(topic, 0, 50, 100)) == list(range(50, 100))
    assert offsets_read(kafka, OffsetRange(topic, 1, 0, 30)) == list(range(30))
    again, topics = reader_module._consumers.take(reader_config(conf))
    try:
        assert again is pooled  # the same consumer served every range
    finally:
        reader_module._consumers.give_back(reader_config(conf), again, topics)


@pytest.mark.slow
def test_last_messages_reads_every_tail_at_once_and_gives_each_range_its_own_last_message(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(10)
    produce(kafka.bootstrap_servers, topic, {p: 20 + p for p in range(9)})  # partition 9 stays empty
    for p in range(9):  # a different last message in every partition
        produce(kafka.bootstrap_servers, topic, {p: 1}, value=f"last of {p}".encode(), key=str(p).encode())
    conf = reader_config(client_config(kafka.bootstrap_servers))
    ranges = [OffsetRange(topic, p, 0, 21 + p) for p in range(9)]
    ranges += [OffsetRange(topic, 9, 0, 0), OffsetRange(topic, 0, 3, 3)]  # nothing to read: no entry

    def alone(r: OffsetRange) -> object:  # one range, read whole, on this thread
        reader = RangeReader(conf, r, pause_gc=False)
        for _ in reader:
            pass
        return reader.last

    found = last_messages(conf, ranges, "tails")
    assert found == {r.key: alone(r) for r in ranges[:9]}
    assert len(set(found.values())) == 9
    # The threads' consumers are kept for the next batch's tails, up to CONSUMERS_KEPT of them.
    kept = [reader_module._consumers.take(conf) for _ in range(CONSUMERS_KEPT)]
    try:
        assert len({id(consumer) for consumer, _ in kept}) == CONSUMERS_KEPT
        assert all(topic in topics for _, topics in kept)  # each has read the topic: no idle metadata wait
    finally:
        for consumer, topics in kept:
            reader_module._consumers.give_back(conf, consumer, topics)
    assert last_messages(conf, ranges, "tails") == found


def test_a_consumer_that_failed_or_was_abandoned_is_closed_not_reused(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 20})
    conf = reader_config(client_config(kafka.bootstrap_servers))
    assert offsets_read(kafka, OffsetRange(topic, 0, 0, 5)) == list(range(5))
    first, topics = reader_module._consumers.take(conf)
    reader_module._consumers.give_back(conf, first, topics)

    reader = iter(RangeReader(conf, OffsetRange(topic, 0, 0, 20), batch_size=4))
    assert len(next(reader)) == 4
    reader.close()  # the caller stops half-way: the consumer may hold half a range
    with pytest.raises(RuntimeError):
        first.assignment()  # closed
    second, topics = reader_module._consumers.take(conf)
    assert second is not first
    reader_module._consumers.give_back(conf, second, topics)
    assert offsets_read(kafka, OffsetRange(topic, 0, 3, 9)) == list(range(3, 9))


def test_a_reused_consumer_starts_a_topic_it_never_read_at_once(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """Not after librdkafka's once-a-second metadata refresh for unknown topics."""
    first = new_topic(1)
    produce(kafka.bootstrap_servers, first, {0: 3})
    assert offsets_read(kafka, OffsetRange(first, 0, 0, 3)) == [0, 1, 2]  # a consumer is pooled
    seconds = []
    for _ in range(3):
        topic = new_topic(1)
        produce(kafka.bootstrap_servers, topic, {0: 3})
        started = time.monotonic()
        assert offsets_read(kafka, OffsetRange(topic, 0, 0, 3)) == [0, 1, 2]
        seconds.append(time.monotonic() - started)
    assert min(seconds) < 0.5, seconds


def test_the_cyclic_gc_is_paused_while_a_range_is_read_and_restored_after(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 20})
    conf = client_config(kafka.bootstrap_servers)
    assert gc.isenabled()
    reader = iter(RangeReader(conf, OffsetRange(topic, 0, 0, 20), batch_size=5))
    next(reader)
    assert not gc.isenabled()
    assert sum(len(batch) for batch in reader) == 15
    assert gc.isenabled()

    abandoned = iter(RangeReader(conf, OffsetRange(topic, 0, 0, 20), batch_size=5))
    next(abandoned)
    abandoned.close()
    assert gc.isenabled()


def test_record_batches_pause_the_gc_per_batch_only_so_a_read_left_suspended_leaves_it_on(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    from txstore.spark.source.arrow import record_batches

    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 20})
    conf = client_config(kafka.bootstrap_servers)
    seen_enabled = []
    rows = 0
    for batch in record_batches(
        RangeReader(conf, OffsetRange(topic, 0, 0, 20), batch_size=5, pause_gc=False)
    ):
        seen_enabled.append(gc.isenabled())
        rows += batch.num_rows
    assert rows == 20 and seen_enabled == [True] * 4
    left = record_batches(RangeReader(conf, OffsetRange(topic, 0, 0, 20), batch_size=5, pause_gc=False))
    assert next(left).num_rows == 5
    assert gc.isenabled()  # Spark stopped pulling (a limit): the collector is on while it waits
    left.close()
    assert gc.isenabled()


def test_gc_pauses_nest_and_leave_a_disabled_collector_disabled() -> None:
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_reader_asked_not_to_pause_the_gc_leaves_it_running(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 10})
    reader = iter(
        RangeReader(
            client_config(kafka.bootstrap_servers), OffsetRange(topic, 0, 0, 10), batch_size=5, pause_gc=False
        )
    )
    next(reader)
    assert gc.isenabled()
    reader.close()
