"""`txstore status` (and ``reset``'s plan) asks Kafka about many topics and partitions in few
round trips: a job's topics through one client, not one per topic (a new librdkafka client waited
about 55 ms for its first answer then, so a job of 20 topics took 1.4 s where one of a single topic
took 0.35 s); a stalled job's first unread messages through one assignment, not one per
partition (45 s at 1,024 partitions)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from confluent_kafka import TopicCollection

import txstore.kafka.admin
import txstore.kafka.reader
from tests.conftest import produce, send
from txstore.core.ranges import PartitionWatermarks
from txstore.core.starting import StartDecision
from txstore.kafka.client_settings import client_config
from txstore.kafka.topic_ids import messages_at_last_counted, read_message_at
from txstore.ops.health_facts import first_unread_written, health_facts
from txstore.ops.reset import plan_job_reset
from txstore.ops.reset_plan import ResetTarget
from txstore.ops.status import status
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.locks import hold_job_lock
from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import RealKafkaCluster


def test_status_and_its_check_ask_every_topic_of_a_job_through_one_kafka_client(
    database_url: str, kafka: MockKafkaCluster, new_topic: Callable[..., str], admin_clients: list[Any]
) -> None:
    topics = [new_topic(2, prefix=f"t{i}") for i in range(4)]
    for i, topic in enumerate(topics):
        produce(kafka.bootstrap_servers, topic, {0: i + 1, 1: 2 * i + 1})
    with connect(database_url) as conn:
        store.create_start_rows(
            conn, "four_topics", [StartDecision(t, p, 0, "test") for t in topics for p in range(2)]
        )
        conf = client_config(kafka.bootstrap_servers)

        shown, problem = status(conn, conf, "four_topics")
        assert problem is None
        assert [(s.topic, s.partition, s.log_end, s.lag) for s in shown] == [
            (t, p, n, n) for i, t in enumerate(topics) for p, n in ((0, i + 1), (1, 2 * i + 1))
        ]
        assert len(admin_clients) == 1

        facts, _ = health_facts(conn, conf, "four_topics", timedelta(minutes=5))
        assert [(f.topic, f.partition, f.watermarks.high if f.watermarks else None) for f in facts] == [
            (t, p, n) for i, t in enumerate(topics) for p, n in ((0, i + 1), (1, 2 * i + 1))
        ]
        # one more: the same client for every topic's log offsets and their topic IDs (none here)
        assert len(admin_clients) == 2


def test_check_asks_apache_kafka_the_log_offsets_and_topic_ids_of_a_job_through_one_client(
    database_url: str,
    real_kafka: RealKafkaCluster,
    new_real_topic: Callable[..., str],
    admin_clients: list[Any],
) -> None:
    """The mock broker has no topic IDs: on Apache Kafka the check gets each topic's real ID through
    the client that asked the log offsets."""
    topics = [new_real_topic(2, prefix=f"ids{i}") for i in range(2)]
    for topic in topics:
        produce(real_kafka.bootstrap_servers, topic, {0: 2, 1: 1})
    with connect(database_url) as conn:
        store.create_start_rows(
            conn, "ids", [StartDecision(t, p, 0, "test") for t in topics for p in range(2)]
        )
        facts, _ = health_facts(
            conn, client_config(real_kafka.bootstrap_servers), "ids", timedelta(minutes=5)
        )
    assert all(f.watermarks is not None for f in facts)  # Kafka answered
    assert len(admin_clients) == 1
    described = real_kafka.admin().describe_topics(TopicCollection(topics), request_timeout=10)
    ids = {t: str(f.result(10).topic_id) for t, f in described.items()}
    assert len(set(ids.values())) == 2
    assert [(f.topic, f.partition, f.topic_id) for f in facts] == [
        (t, p, ids[t]) for t in topics for p in range(2)
    ]


def test_a_reset_plan_asks_apache_kafka_the_topic_s_log_offsets_and_id_through_one_client(
    database_url: str,
    real_kafka: RealKafkaCluster,
    new_real_topic: Callable[..., str],
    admin_clients: list[Any],
) -> None:
    """The rows hold another topic ID than Kafka's: the plan starts a new generation with Kafka's
    ID, asked through the client that asked the log offsets."""
    topic = new_real_topic(2, prefix="reset-ids")
    produce(real_kafka.bootstrap_servers, topic, {0: 2, 1: 1})
    with connect(database_url) as conn:
        store.create_start_rows(conn, "reset_ids", [StartDecision(topic, p, 0, "test") for p in range(2)])
        store.record_topic_ids(conn, "reset_ids", {topic: "an-older-topic-id"})
        conn.commit()
        moves = plan_job_reset(
            conn, client_config(real_kafka.bootstrap_servers), "reset_ids", topic, None, ResetTarget("latest")
        )
    assert len(admin_clients) == 1
    described = real_kafka.admin().describe_topics(TopicCollection([topic]), request_timeout=10)
    topic_id = str(described[topic].result(10).topic_id)
    assert [(m.partition, m.old, m.new, m.new_generation, m.topic_id) for m in moves] == [
        (0, 0, 2, 1, topic_id),
        (1, 0, 1, 1, topic_id),
    ]


def test_a_reset_to_a_datetime_asks_apache_kafka_all_it_needs_through_one_client(
    database_url: str,
    real_kafka: RealKafkaCluster,
    new_real_topic: Callable[..., str],
    admin_clients: list[Any],
) -> None:
    """The log offsets, the topic ID, the time lookup and, for a partition with no message that
    late, the lookup of 1970 that tells "none that late" from "cannot look times up"."""
    topic = new_real_topic(2, prefix="reset-time")
    t0 = 1_767_225_600_000
    send(real_kafka.bootstrap_servers, topic, [(0, b"k", b"v", t0 + s * 1000) for s in range(5)])
    send(real_kafka.bootstrap_servers, topic, [(1, b"k", b"v", t0 + s * 1000) for s in range(2)])
    with connect(database_url) as conn:
        store.create_start_rows(conn, "reset_time", [StartDecision(topic, p, 5, "test") for p in range(2)])
        conn.execute(
            "UPDATE txn_offsets SET off = CASE part WHEN 0 THEN 5 ELSE 2 END WHERE job = 'reset_time'"
        )
        conn.commit()
        moves = plan_job_reset(
            conn,
            client_config(real_kafka.bootstrap_servers),
            "reset_time",
            topic,
            None,
            ResetTarget("datetime", t0 + 3_000),
        )
    assert len(admin_clients) == 1
    # partition 0: its first message at or after 3 s is offset 3; partition 1 has none that late
    # (its last is at 1 s) and answers for 1970, so it moves to its end
    assert [(m.partition, m.old, m.new, m.unanswered) for m in moves] == [(0, 5, 3, False), (1, 2, 2, False)]


@pytest.fixture
def assignments(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The partitions of every ``assign`` of the consumers txstore's reader makes from now on
    (librdkafka's own class, listened to, not replaced)."""
    made: list[list[Any]] = []

    class Listened(txstore.kafka.reader.Consumer):  # type: ignore[misc]
        def assign(self, partitions: list[Any]) -> None:
            made.append(list(partitions))
            super().assign(partitions)

    monkeypatch.setattr(txstore.kafka.reader, "Consumer", Listened)
    return made


def test_a_stalled_running_jobs_check_reads_every_partitions_first_unread_message_in_one_assignment(
    database_url: str, kafka: MockKafkaCluster, new_topic: Callable[..., str], assignments: list[list[Any]]
) -> None:
    """When the oldest message not counted was written, for each partition of a running job whose
    last commit is older than ``--stall-after`` (and each partition it has not started): the
    first message at or after its offset, by its own timestamp; none where there is no lag."""
    topic = new_topic(4)
    written = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
    stamp = int(written.timestamp() * 1000)
    # partition p holds 3 messages, written p minutes apart from one partition to the next and a
    # second apart within it; the job stores offset 1 in partitions 0 and 1, 3 (all counted) in
    # partition 2, and has not started partition 3.
    send(
        kafka.bootstrap_servers,
        topic,
        [(p, b"k", b"v", stamp + p * 60_000 + i * 1000) for p in range(4) for i in range(3)],
    )
    with connect(database_url) as conn, connect(database_url) as running:
        store.create_start_rows(conn, "stalled", [StartDecision(topic, p, 0, "test") for p in range(3)])
        conn.execute(
            "UPDATE txn_offsets SET off = CASE part WHEN 2 THEN 3 ELSE 1 END, "
            "updated_at = now() - interval '1 hour' WHERE job = 'stalled'"
        )
        conn.commit()
        hold_job_lock(running, "stalled")

        facts, _ = health_facts(conn, client_config(kafka.bootstrap_servers), "stalled", timedelta(minutes=5))

    assert [(f.partition, f.offset, f.unread_since) for f in facts] == [
        (0, 1, written + timedelta(seconds=1)),
        (1, 1, written + timedelta(minutes=1, seconds=1)),
        (2, 3, None),  # no lag
        (3, None, written + timedelta(minutes=3)),  # not started: from its log start
    ]
    reads = [a for a in assignments if {tp.topic for tp in a} == {topic}]
    assert [sorted((tp.partition, tp.offset) for tp in a) for a in reads] == [[(0, 1), (1, 1), (3, 0)]]


def test_reading_the_last_counted_and_first_unread_messages_waits_for_no_message_that_is_not_coming(
    kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """A caught-up job's last counted message is the last in its partition, and a stalled job's
    first unread one may be too: each partition then gives one message and its end. Reading them
    took a whole extra second (``consume`` asked for four events a partition and waited for them),
    in every ``status --check`` of a caught-up job; now as long as reading from the middle of the log."""
    topic = new_topic(8)
    produce(kafka.bootstrap_servers, topic, dict.fromkeys(range(8), 3))
    conf = client_config(kafka.bootstrap_servers)
    marks = [PartitionWatermarks(topic, p, 0, 3) for p in range(8)]
    at = {o: {p: read_message_at(conf, topic, p, o) for p in range(8)} for o in (0, 2)}

    def timed(read: Callable[[], Any]) -> tuple[float, Any]:
        started = time.monotonic()
        found = read()
        return time.monotonic() - started, found

    middle, _ = timed(
        lambda: messages_at_last_counted(conf, [(topic, m.partition, at[0][m.partition], m) for m in marks])
    )
    last, found = timed(
        lambda: messages_at_last_counted(conf, [(topic, m.partition, at[2][m.partition], m) for m in marks])
    )
    assert found == {(topic, p): at[2][p] for p in range(8)}
    assert last < middle + 0.5, (last, middle)

    middle, _ = timed(lambda: first_unread_written(conf, [(topic, m.partition, 0, m) for m in marks]))
    last, written = timed(lambda: first_unread_written(conf, [(topic, m.partition, 2, m) for m in marks]))
    assert all(written[(topic, p)] is not None for p in range(8))
    assert last < middle + 0.5, (last, middle)
