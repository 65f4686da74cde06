"""Deleted and recreated topics: old and new messages told apart, and the lines a job stops with."""

from __future__ import annotations

import psycopg

from tests.conftest import send
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.core.fingerprint import digest

OLD_TS = 1_700_000_000_000
NEW_TS = 1_800_000_000_000


def fill(kafka: AnyKafka, topic: str, n: int, partitions: int, tag: bytes, ts: int) -> None:
    """``n`` messages per partition, value ``tag-<partition>-<i>``, timestamp ``ts + i``."""
    send(
        kafka.bootstrap_servers,
        topic,
        ((p, b"k", b"%s-%d-%d" % (tag, p, i), ts + i) for p in range(partitions) for i in range(n)),
    )


def snapshot(db: psycopg.Connection) -> tuple[list[tuple], list[tuple], list[tuple]]:
    return (
        db.execute("SELECT * FROM txn_offsets ORDER BY topic, part").fetchall(),
        db.execute("SELECT * FROM txn_data ORDER BY topic, grain, key").fetchall(),
        db.execute(
            "SELECT job, topic, part, generation, off FROM txn_messages ORDER BY 1, 2, 3, 4, 5"
        ).fetchall(),
    )


def mismatch_line(job: str, topic: str, partition: int, last: int) -> str:
    old = digest(b"k", b"old-%d-%d" % (partition, last))
    new = digest(b"k", b"new-%d-%d" % (partition, last))
    return (
        f"job '{job}' topic '{topic}' partition {partition}: the topic was deleted and recreated "
        f"(stored last counted message offset {last}, timestamp {OLD_TS + last}, digest {old}; "
        f"found offset {last}, timestamp {NEW_TS + last}, digest {new}); nothing was counted. "
        "To count the new topic from its start as a new generation: "
        f"txstore reset --job {job} --topic {topic} --partition {partition} --to-earliest --execute"
    )


def topic_id_changed_line(topic: str, old_id: str, new_id: str) -> str:
    """count_topic's line for partition 0 of a topic recreated under another topic ID."""
    return (
        f"job 'count_topic' topic '{topic}' partition 0: the topic was deleted and recreated "
        f"(stored topic ID {old_id}; found topic ID {new_id}); nothing was counted. To count the new "
        "topic from its start as a new generation: "
        f"txstore reset --job count_topic --topic {topic} --partition 0 --to-earliest --execute"
    )
