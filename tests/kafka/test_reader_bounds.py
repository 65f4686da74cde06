"""The range reader's bounds and checks, against a fake of confluent-kafka's Consumer
(tests/helpers/fake_kafka.py): every message ``from <= offset < until`` once, holes, end-of-partition
events, errors, the verified message before ``from``, the log re-checked after the read, and
the readers built on it (last messages, the message at an offset, bad-message isolation).
Milliseconds each; the broker-backed tests in test_kafka_reader.py and test_recreated_topic.py
check the same against a Kafka-protocol broker."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

from tests.helpers.fake_kafka import FakeKafka, FakeLog, install, message
from txstore.core.errors import DataLoss, KafkaReadError, TopicRecreated
from txstore.core.fingerprint import Fingerprint, fingerprint
from txstore.core.ranges import OffsetRange, PartitionWatermarks
from txstore.core.results import TOPIC_TOTAL, ResultKey
from txstore.kafka.bad_messages import aggregate_range
from txstore.kafka.reader import LAST_MESSAGE_LOOKBACK, RangeReader, _out_of_range, last_messages
from txstore.kafka.topic_ids import message_at_last_counted, messages_at_last_counted, read_message_at

CONF = {"bootstrap.servers": "fake:9092"}


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    return install(monkeypatch)


def read(r: OffsetRange, **kwargs: Any) -> tuple[list[int], RangeReader]:
    reader = RangeReader(CONF, r, **kwargs)
    got = [m.offset() for batch in reader for m in batch]
    assert reader.messages == len(got)
    return got, reader


def log_of(fake: FakeKafka, offsets: Iterable[int], **kwargs: Any) -> FakeLog:
    return fake.add(FakeLog.of("t", 0, offsets, **kwargs))


# Bounds.


def test_a_range_is_read_from_from_to_until_and_no_further(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(30))
    got, reader = read(OffsetRange("t", 0, 7, 19))
    assert got == list(range(7, 19))
    assert reader.last is not None and reader.last.offset == 18
    assert fake_kafka.consumers[0].assigned_at[0] == ("t", 0, 7)


def test_each_fetch_asks_for_at_most_the_rest_of_the_range_and_the_batch_size(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(30))
    got, _ = read(OffsetRange("t", 0, 0, 10), batch_size=4)
    assert got == list(range(10))
    assert fake_kafka.consumers[0].consumed[:3] == [4, 4, 2]
    sizes = [len(b) for b in RangeReader(CONF, OffsetRange("t", 0, 10, 21), batch_size=4)]
    assert sizes == [4, 4, 3]


def test_an_empty_range_reads_nothing_and_takes_no_consumer(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(5))
    got, reader = read(OffsetRange("t", 0, 3, 3))
    assert (got, reader.last, fake_kafka.consumers) == ([], None, [])


def test_a_range_whose_messages_are_all_holes_delivers_none(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, [0, 1, 5], high=6)
    got, reader = read(OffsetRange("t", 0, 2, 5))
    assert (got, reader.last) == ([], None)


def test_holes_inside_a_range_are_skipped_by_offset(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, [0, 2, 3, 6, 7, 9, 10, 11], high=12)
    assert read(OffsetRange("t", 0, 1, 10), batch_size=3)[0] == [2, 3, 6, 7, 9]


def test_a_message_exactly_at_until_is_left_for_the_next_range(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(12))
    assert read(OffsetRange("t", 0, 0, 11), batch_size=11)[0] == list(range(11))
    assert read(OffsetRange("t", 0, 11, 12))[0] == [11]


def test_a_read_with_no_progress_times_out_naming_where_it_was(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(10), visible_ends=[4] + [4] * 10_000)
    with pytest.raises(
        KafkaReadError,
        match=r"no data from Kafka at fake:9092 for 0.1s while reading 't' partition 0 at offset 4 \(range 0 -> 10\)",
    ):
        read(OffsetRange("t", 0, 0, 10), idle_timeout=0.1)


def test_progress_resets_the_idle_timeout(fake_kafka: FakeKafka) -> None:
    """Slow but steady: one message per fetch, each after a few empty ones."""
    ends = [e for end in range(1, 11) for e in [end] * 5]
    log_of(fake_kafka, range(10), visible_ends=ends)
    assert read(OffsetRange("t", 0, 0, 10), idle_timeout=0.1)[0] == list(range(10))


# Events and errors.


def test_an_aged_out_start_is_data_loss_and_the_consumer_is_not_reused(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(5, 20), low=5)
    with pytest.raises(DataLoss, match=r"offset 3 is no longer in Kafka \(range 3 -> 9\)"):
        read(OffsetRange("t", 0, 3, 9))
    assert fake_kafka.consumers[0].closed
    assert read(OffsetRange("t", 0, 5, 9))[0] == [5, 6, 7, 8]
    assert len(fake_kafka.consumers) == 2


def test_a_log_that_now_ends_below_the_range_is_a_recreated_topic(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(3))
    log.errors = [KafkaError._AUTO_OFFSET_RESET]
    with pytest.raises(
        TopicRecreated, match=r"the log now ends at offset 3, below offset 3 that the range 3 -> 9"
    ):
        read(OffsetRange("t", 0, 3, 9))
    log.errors = [KafkaError.OFFSET_OUT_OF_RANGE]
    with pytest.raises(TopicRecreated, match="the log now ends at offset 3, below offset 4"):
        read(OffsetRange("t", 0, 4, 9))


def test_out_of_range_below_the_log_end_is_data_loss_not_a_recreation(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(10))
    log.errors = [KafkaError.OFFSET_OUT_OF_RANGE]
    with pytest.raises(DataLoss):
        read(OffsetRange("t", 0, 9, 10))


def test_a_fatal_or_permanent_error_fails_the_read_and_a_passing_one_does_not(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(6))
    log.errors = [KafkaError(KafkaError._TRANSPORT, retriable=True), None]
    assert read(OffsetRange("t", 0, 0, 6))[0] == list(range(6))
    log.errors = [KafkaError(KafkaError._TRANSPORT, retriable=True, fatal=True)]
    with pytest.raises(KafkaReadError, match="reading 't' partition 0 at offset 0 failed"):
        read(OffsetRange("t", 0, 0, 6))
    log.errors = [KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)]
    with pytest.raises(KafkaReadError, match="reading 't' partition 0 at offset 2 failed"):
        read(OffsetRange("t", 0, 2, 6))


def test_both_out_of_range_codes_are_recognised() -> None:
    assert _out_of_range(KafkaError(KafkaError._AUTO_OFFSET_RESET))
    assert _out_of_range(KafkaError(KafkaError.OFFSET_OUT_OF_RANGE))
    assert not _out_of_range(KafkaError(KafkaError._PARTITION_EOF))


# Consumers and the collector.


def test_a_consumer_that_finished_a_read_is_reused_and_asks_for_a_topics_metadata_once(
    fake_kafka: FakeKafka,
) -> None:
    log_of(fake_kafka, range(10))
    fake_kafka.add(FakeLog.of("u", 0, range(4)))
    assert read(OffsetRange("t", 0, 0, 5))[0] == list(range(5))
    assert read(OffsetRange("t", 0, 5, 10))[0] == list(range(5, 10))
    assert read(OffsetRange("u", 0, 0, 4))[0] == list(range(4))
    (consumer,) = fake_kafka.consumers
    assert consumer.listed == ["t", "u"] and not consumer.closed
    assert consumer.conf["auto.offset.reset"] == "error" and consumer.conf["enable.partition.eof"] is True


def test_asking_for_a_topics_metadata_waits_no_longer_than_the_reads_idle_timeout(
    fake_kafka: FakeKafka,
) -> None:
    log_of(fake_kafka, range(3))
    read(OffsetRange("t", 0, 0, 3), idle_timeout=2)
    assert fake_kafka.consumers[0].list_timeouts == [2]


def test_a_read_left_early_closes_its_consumer(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(10))
    reader = iter(RangeReader(CONF, OffsetRange("t", 0, 0, 10), batch_size=2))
    next(reader)
    reader.close()  # type: ignore[attr-defined]
    assert fake_kafka.consumers[0].closed
    read(OffsetRange("t", 0, 0, 10))
    assert len(fake_kafka.consumers) == 2


def test_the_collector_is_paused_while_reading_unless_told_not_to(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(4))
    assert gc.isenabled()
    states = [gc.isenabled() for _ in RangeReader(CONF, OffsetRange("t", 0, 0, 4), batch_size=2)]
    assert states == [False, False] and gc.isenabled()
    states = [
        gc.isenabled() for _ in RangeReader(CONF, OffsetRange("t", 0, 0, 4), batch_size=2, pause_gc=False)
    ]
    assert states == [True, True]


# The last message counted, verified before the read.


def test_a_verified_range_starts_at_the_last_counted_message_and_delivers_from_from(
    fake_kafka: FakeKafka,
) -> None:
    log = log_of(fake_kafka, [0, 1, 2, 4, 6, 7, 8], high=9)
    last = fingerprint(log.messages[2])
    got, reader = read(OffsetRange("t", 0, 4, 8, verify=last))
    assert got == [4, 6, 7]
    assert fake_kafka.consumers[0].assigned_at[0] == ("t", 0, 2)
    assert reader.last == fingerprint(log.messages[7])


def test_a_verified_message_below_a_hole_before_from_is_skipped_with_everything_below_from(
    fake_kafka: FakeKafka,
) -> None:
    log = log_of(fake_kafka, [0, 1, 4, 5, 6], high=7)
    got, _ = read(OffsetRange("t", 0, 3, 7, verify=fingerprint(log.messages[1])), batch_size=10)
    assert got == [4, 5, 6]


def test_another_message_where_the_last_counted_one_was_is_a_recreated_topic(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(8))
    stored = Fingerprint(3, log.messages[3].timestamp()[1], "another digest")
    reader = RangeReader(CONF, OffsetRange("t", 0, 4, 8, verify=stored), job="j")
    with pytest.raises(
        TopicRecreated, match=r"stored last counted message offset 3, timestamp 1003, digest another"
    ):
        next(iter(reader))
    assert reader.messages == 0


def test_a_last_counted_message_compacted_away_is_not_compared(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, [0, 1, 2, 5, 6], high=7)
    gone = Fingerprint(3, 1, "compacted")
    assert read(OffsetRange("t", 0, 4, 7, verify=gone))[0] == [5, 6]


def test_a_last_counted_message_that_aged_out_is_not_compared_and_the_read_starts_at_from(
    fake_kafka: FakeKafka,
) -> None:
    log_of(fake_kafka, range(4, 10), low=4)
    got, _ = read(OffsetRange("t", 0, 4, 9, verify=Fingerprint(2, 1, "aged out")))
    assert got == [4, 5, 6, 7, 8]
    assert fake_kafka.consumers[0].assigned_at[:2] == [("t", 0, 2), ("t", 0, 4)]


# The log checked again after the read.


def test_a_topic_recreated_while_its_range_is_read_is_caught_after_the_read(fake_kafka: FakeKafka) -> None:
    """After the second fetch the log is another one (same offsets, other values): the first
    message read is read again at the end and differs."""
    other = FakeLog.of("t", 0, range(20), value=lambda o: b"new%d" % o)
    log_of(fake_kafka, range(20)).replaced_after = (2, other.messages)
    with pytest.raises(TopicRecreated, match="first read message offset 2, timestamp 1002"):
        read(OffsetRange("t", 0, 2, 12), batch_size=4, job="j")
    assert fake_kafka.consumers[0].assigned_at[-1] == ("t", 0, 2)


def test_a_recreation_during_a_verified_read_names_the_last_counted_message(fake_kafka: FakeKafka) -> None:
    other = FakeLog.of("t", 0, range(20), value=lambda o: b"new%d" % o)
    log = log_of(fake_kafka, range(20))
    log.replaced_after = (1, other.messages)
    with pytest.raises(TopicRecreated, match="last counted message offset 1"):
        read(OffsetRange("t", 0, 2, 12, verify=fingerprint(log.messages[1])), batch_size=4)


def test_the_first_message_compacted_or_gone_after_the_read_is_not_compared(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(10))
    log.replaced_after = (2, {o: m for o, m in log.messages.items() if o != 2})
    assert read(OffsetRange("t", 0, 2, 8), batch_size=3)[0] == list(range(2, 8))
    log = fake_kafka.add(FakeLog.of("t", 1, range(10)))
    log.replaced_after = (2, {})
    assert read(OffsetRange("t", 1, 2, 8), batch_size=3)[0] == list(range(2, 8))


def test_a_check_after_the_read_that_gets_no_answer_times_out(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(10))
    log.visible_ends = [10, 0] + [0] * 10_000
    log.replaced_after = (1, {})
    log.eof_never = True
    with pytest.raises(
        KafkaReadError, match="while checking 't' partition 0 at offset 0 after reading 0 -> 10"
    ):
        read(OffsetRange("t", 0, 0, 10), idle_timeout=0.1)


def test_the_check_after_the_read_fails_on_a_broker_error(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(10))
    log.errors = [None, KafkaError(KafkaError._TRANSPORT, fatal=True)]
    with pytest.raises(KafkaReadError, match="at offset 0 failed"):
        read(OffsetRange("t", 0, 0, 10))


def test_a_read_must_end_on_the_last_message_the_driver_saw(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(10))
    seen = fingerprint(log.messages[7])
    assert read(OffsetRange("t", 0, 0, 8), expect_last=seen)[0] == list(range(8))
    assert read(OffsetRange("t", 0, 0, 7), expect_last=seen)[0] == list(
        range(7)
    )  # removed since: not compared
    other = Fingerprint(7, seen.timestamp, "other")
    with pytest.raises(
        TopicRecreated, match="last message offset 7, timestamp 1007, digest other when the batch"
    ):
        read(OffsetRange("t", 0, 0, 8), expect_last=other, job="j")
    with pytest.raises(TopicRecreated):
        read(OffsetRange("t", 0, 0, 9), expect_last=seen)
    assert read(OffsetRange("t", 0, 3, 3), expect_last=seen)[0] == []


# Readers built on it.


def test_last_messages_reads_each_ranges_tail_and_skips_empty_ones(fake_kafka: FakeKafka) -> None:
    a = fake_kafka.add(FakeLog.of("t", 0, range(200)))
    b = fake_kafka.add(FakeLog.of("t", 1, [0, 1, 2, 3], high=10))
    c = fake_kafka.add(FakeLog.of("t", 2, range(5)))
    ranges = [
        OffsetRange("t", 0, 0, 150, generation=3),
        OffsetRange("t", 1, 5, 10),  # only holes
        OffsetRange("t", 2, 0, 5),
        OffsetRange("t", 2, 5, 5),
    ]
    found = last_messages(CONF, ranges)
    assert found == {("t", 0): fingerprint(a.messages[149]), ("t", 2): fingerprint(c.messages[4])}
    assert fake_kafka.logs[("t", 0)] is a and b.calls >= 1
    starts = sorted(at for consumer in fake_kafka.consumers for at in consumer.assigned_at)
    assert ("t", 0, 150 - LAST_MESSAGE_LOOKBACK) in starts and ("t", 2, 0) in starts
    assert last_messages(CONF, [OffsetRange("t", 2, 0, 5)]) == {("t", 2): fingerprint(c.messages[4])}
    assert last_messages(CONF, []) == {}


def test_a_failing_tail_read_raises_its_error(fake_kafka: FakeKafka) -> None:
    fake_kafka.add(FakeLog.of("t", 0, range(10), low=5))
    with pytest.raises(DataLoss):
        last_messages(CONF, [OffsetRange("t", 0, 0, 3)])


def test_the_message_at_an_offset_or_none_for_a_hole(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, [0, 1, 3, 4], high=5)
    assert read_message_at(CONF, "t", 0, 3) == fingerprint(log.messages[3])
    assert read_message_at(CONF, "t", 0, 2) is None
    last = fingerprint(log.messages[1])
    marks = PartitionWatermarks("t", 0, 1, 5)
    assert message_at_last_counted(CONF, "t", 0, last, marks) == last
    assert message_at_last_counted(CONF, "t", 0, Fingerprint(4, 0, "x"), marks) == fingerprint(
        log.messages[4]
    )
    assert message_at_last_counted(CONF, "t", 0, None, marks) is None
    assert message_at_last_counted(CONF, "t", 0, last, None) is None
    assert message_at_last_counted(CONF, "t", 0, Fingerprint(0, 0, "x"), marks) is None  # below the log start
    assert message_at_last_counted(CONF, "t", 0, Fingerprint(5, 0, "x"), marks) is None  # at the log end


def test_the_messages_at_many_partitions_last_counted_offsets_are_read_by_one_consumer(
    fake_kafka: FakeKafka,
) -> None:
    """What status --check and reset compare on a thousand partitions, in one consumer: the message
    at each last-counted offset, None for a hole there, one the log no longer holds, none counted."""
    logs = [fake_kafka.add(FakeLog.of("t", p, [0, 1, 3, 4], high=5)) for p in range(4)]
    fake_kafka.add(FakeLog.of("u", 0, range(3)))
    marks = {p: PartitionWatermarks("t", p, 1, 5) for p in range(4)}
    wanted = [
        ("t", 0, fingerprint(logs[0].messages[1]), marks[0]),  # there: compared
        ("t", 1, Fingerprint(2, 0, "x"), marks[1]),  # a hole (a marker): the next message is not it
        ("t", 2, Fingerprint(0, 0, "x"), marks[2]),  # below the log start: not read
        ("t", 3, None, marks[3]),  # nothing counted yet
        ("u", 0, Fingerprint(2, 0, "x"), PartitionWatermarks("u", 0, 0, 3)),
        ("v", 0, Fingerprint(0, 0, "x"), None),  # no watermarks (a topic gone): not read
    ]
    found = messages_at_last_counted(CONF, wanted)
    assert found == {
        ("t", 0): fingerprint(logs[0].messages[1]),
        ("t", 1): None,
        ("t", 2): None,
        ("t", 3): None,
        ("u", 0): fingerprint(fake_kafka.logs[("u", 0)].messages[2]),
        ("v", 0): None,
    }
    for t, p, last, m in wanted:  # the same answers as one read each
        assert found[(t, p)] == message_at_last_counted(CONF, t, p, last, m)
    consumer = fake_kafka.consumers[0]
    assert sorted(consumer.assigned_at) == [("t", 0, 1), ("t", 1, 2), ("u", 0, 2)] and consumer.closed
    assert messages_at_last_counted(CONF, []) == {}


def test_a_partition_that_never_answers_the_many_partitions_read_is_one_line_in_bounded_time(
    fake_kafka: FakeKafka,
) -> None:
    fake_kafka.add(FakeLog.of("t", 0, range(3)))
    silent = fake_kafka.add(FakeLog.of("t", 1, range(5), visible_ends=[3] * 10_000))
    silent.eof_never = True  # the message at offset 3 never comes, nor the end of the log
    started = time.monotonic()
    with pytest.raises(KafkaReadError) as e:
        messages_at_last_counted(
            CONF,
            [
                ("t", 0, Fingerprint(1, 0, "x"), PartitionWatermarks("t", 0, 0, 3)),
                ("t", 1, Fingerprint(3, 0, "x"), PartitionWatermarks("t", 1, 0, 5)),
            ],
            timeout=0.3,
        )
    assert time.monotonic() - started < 5
    assert str(e.value).endswith(
        "for 0.3s while reading the last counted messages of 1 partitions (first: 't' partition 1 at "
        "offset 3); is the broker up?"
    )


# Bad messages found by reading the range again.


def _count(bad: set[int], together: int | None = None) -> Any:
    def aggregate(r: OffsetRange, batches: Iterable[list[Message]]) -> Mapping[ResultKey, int]:
        n = 0
        for b in batches:
            for m in b:
                if m.offset() in bad:
                    raise ValueError(f"bad {m.offset()}")
                n += 1
        if together is not None and n >= together:
            raise RuntimeError("only the whole range fails")
        return {TOPIC_TOTAL: n}

    return aggregate


def test_a_range_with_bad_messages_is_read_again_and_the_good_ones_counted(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(20))
    r = OffsetRange("t", 0, 0, 20)
    skipped = aggregate_range(_count({3, 17}), RangeReader(CONF, r, batch_size=6), skip=True)
    assert skipped.deltas == {TOPIC_TOTAL: 18}
    assert [b.offset for b in skipped.bad] == [3, 17] and skipped.messages == 20
    assert skipped.last == fingerprint(log.messages[19])
    first = aggregate_range(_count({3, 17}), RangeReader(CONF, r, batch_size=6), skip=False)
    assert [b.offset for b in first.bad] == [3]
    clean = aggregate_range(_count(set()), RangeReader(CONF, r), skip=False)
    assert (clean.deltas, clean.messages, clean.bad, clean.last) == (
        {TOPIC_TOTAL: 20},
        20,
        (),
        fingerprint(log.messages[19]),
    )


def test_a_failure_no_single_message_causes_is_raised_as_it_was(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(12))
    with pytest.raises(RuntimeError, match="only the whole range fails"):
        aggregate_range(_count(set(), together=12), RangeReader(CONF, OffsetRange("t", 0, 0, 12)), skip=True)
    with pytest.raises(KafkaReadError):

        def broken(r: OffsetRange, batches: Iterable[list[Message]]) -> Mapping[ResultKey, int]:
            raise KafkaReadError("gone")

        aggregate_range(broken, RangeReader(CONF, OffsetRange("t", 0, 0, 12)), skip=True)


def test_messages_have_their_log_timestamps() -> None:
    assert message("t", 0, 3, timestamp=None).timestamp() == (0, -1)
    assert message("t", 0, 3, timestamp=5).timestamp() == (1, 5)


# More edges of the read (each found by ./dev mutate).


def test_a_verified_read_whose_start_also_aged_out_is_data_loss(fake_kafka: FakeKafka) -> None:
    log_of(fake_kafka, range(8, 12), low=8)
    with pytest.raises(DataLoss, match="offset 5 is no longer in Kafka"):
        read(OffsetRange("t", 0, 5, 12, verify=Fingerprint(3, 1, "gone")))


def test_an_offset_that_ages_out_in_the_middle_of_a_verified_read_is_data_loss_not_a_new_start(
    fake_kafka: FakeKafka,
) -> None:
    log = log_of(fake_kafka, range(12))
    log.errors = [None, KafkaError._AUTO_OFFSET_RESET]
    got: list[int] = []
    with pytest.raises(DataLoss, match="offset 7 is no longer in Kafka"):
        for batch in RangeReader(
            CONF, OffsetRange("t", 0, 3, 12, verify=fingerprint(log.messages[2])), batch_size=5
        ):
            got += [m.offset() for m in batch]
    assert got == [3, 4, 5, 6]


def test_a_passing_error_while_checking_the_log_after_the_read_is_waited_out(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(6))
    log.errors = [None, KafkaError(KafkaError._TRANSPORT, retriable=True)]
    assert read(OffsetRange("t", 0, 0, 6), idle_timeout=5)[0] == list(range(6))


def test_a_recreation_during_a_read_whose_verified_message_was_compacted_names_the_first_read(
    fake_kafka: FakeKafka,
) -> None:
    other = FakeLog.of("t", 0, range(20), value=lambda o: b"new%d" % o)
    log_of(fake_kafka, [0, 1, *range(4, 20)]).replaced_after = (1, other.messages)
    with pytest.raises(TopicRecreated, match="first read message offset 4"):
        read(OffsetRange("t", 0, 4, 12, verify=Fingerprint(3, 1, "compacted")), batch_size=4)


def test_a_verified_read_one_message_at_a_time(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(10))
    assert read(OffsetRange("t", 0, 5, 8, verify=fingerprint(log.messages[4])), batch_size=1)[0] == [5, 6, 7]


def test_asking_for_the_log_end_after_an_error_waits_no_longer_than_the_idle_timeout(
    fake_kafka: FakeKafka,
) -> None:
    log = log_of(fake_kafka, range(10))
    log.errors = [KafkaError.OFFSET_OUT_OF_RANGE]
    with pytest.raises(DataLoss):
        read(OffsetRange("t", 0, 2, 9), idle_timeout=3)
    assert fake_kafka.consumers[0].watermark_timeouts == [3]
    assert fake_kafka.consumers[0].watermarks_cached == [False]  # the log end now, not as last seen


def test_a_log_that_is_now_empty_is_a_recreated_topic(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, [], high=0)
    log.errors = [KafkaError._AUTO_OFFSET_RESET]
    with pytest.raises(TopicRecreated, match="the log now ends at offset 0"):
        read(OffsetRange("t", 0, 3, 9))


def test_a_one_message_range_has_its_last_message_read(fake_kafka: FakeKafka) -> None:
    log = log_of(fake_kafka, range(5))
    assert last_messages(CONF, [OffsetRange("t", 0, 2, 3)]) == {("t", 0): fingerprint(log.messages[2])}
