"""The offsets-for-times lookup never sends Kafka one of its sentinel timestamps."""

from __future__ import annotations

from txstore.kafka.list_offsets import lookup_timestamp


def test_an_instant_before_1970_is_looked_up_as_the_epoch_not_as_a_kafka_sentinel() -> None:
    # Kafka reads -1 as "latest" and -2 as "earliest": 1969-12-31T23:59:59.999Z (-1) would
    # start a job at the log end, skipping every message. No message is older than the epoch
    # (producers refuse negative timestamps), so the epoch finds the same first message.
    assert [lookup_timestamp(ms) for ms in (-1, -2, -3, -86_400_000)] == [0, 0, 0, 0]
    assert [lookup_timestamp(ms) for ms in (0, 1, 1_079_337_347_472)] == [0, 1, 1_079_337_347_472]
