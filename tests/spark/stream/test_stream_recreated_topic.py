"""A topic deleted and recreated under ``readStream.format("txstore")``, on real Apache Kafka.

Kafka gives the recreated topic a new topic ID: the source records the IDs in the job's
``txn_offsets`` rows and compares them before each micro-batch is read, as ``count_topic``
does, so a new log refilled past the stored offsets is never read on from the old offsets
(which would skip its first messages). Refilled below them, the stored offset is beyond the
log end. Either way the query stops before reading, in one line naming the reset to run and
then a new checkpointLocation; after both the new topic is counted from its start.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from tests.helpers.cli import txstore as txstore_cli
from tests.helpers.counting import Counting
from tests.helpers.recreated import snapshot
from tests.helpers.streams import JOB, QueryFailed, sink

pytestmark = pytest.mark.spark

SOURCES = pytest.mark.parametrize(
    "source",
    [{}, {"txstore.countMessages": "true"}],
    ids=["per-message", "counted"],
)
RESET = f"txstore reset --job {JOB} --topic {{topic}} --partition 0 --to-earliest --execute"
THEN = ", then restart the query with a new checkpointLocation"


def below_line(topic: str, stored: int, end: int) -> str:
    return (
        f"job '{JOB}' topic '{topic}' partition 0: stored offset {stored} is beyond the log-end offset "
        f"{end} (topic deleted and recreated, or an unclean leader election); to start over from its "
        f"earliest offset: {RESET.format(topic=topic)}{THEN}"
    )


def recreated_pattern(topic: str) -> str:
    return (
        rf"job '{JOB}' topic '{topic}' partition 0: the topic was deleted and recreated \(stored topic ID "
        rf"[^;]+; found topic ID [^)]+\); nothing was counted. To count the new topic from its start "
        rf"as a new generation: {re.escape(RESET.format(topic=topic) + THEN)}"
    )


def stored_topic_id(db: psycopg.Connection, topic: str) -> str | None:
    row = db.execute(
        "SELECT topic_id FROM txn_offsets WHERE job = %s AND topic = %s", (JOB, topic)
    ).fetchone()
    return None if row is None else row[0]


def reset_and_count_the_new_topic(
    streaming: Counting, topic: str, checkpoint: Path, counted_before: int, source: dict[str, str]
) -> None:
    """The line's advice: the reset, then a new checkpointLocation. Every message of the new log
    is then counted once, in a new generation, and the results before are kept."""
    done = txstore_cli(
        *RESET.format(topic=topic).split()[1:], url=streaming.database_url, kafka=streaming.kafka
    )
    assert done.returncode == 0, done.stderr
    streaming.run_available_now(topic, checkpoint.with_name(checkpoint.name + "-new"), **source)
    assert streaming.offsets(topic, job=JOB) == streaming.log_ends(topic)
    assert streaming.totals(topic, job=JOB) == {topic: counted_before + streaming.log_ends(topic)[0]}
    generation = "SELECT generation FROM txn_offsets WHERE job = %s"
    assert streaming.db.execute(generation, (JOB,)).fetchone() == (1,)


@SOURCES
def test_a_recreated_topic_refilled_below_then_past_the_stored_offset_stops_a_restarted_query(
    real_streaming: Counting, tmp_path: Path, source: dict[str, str]
) -> None:
    kafka, db = real_streaming.kafka, real_streaming.db
    topic = real_streaming.new_topic(1, prefix="srecreate")
    checkpoint = tmp_path / "chk"
    real_streaming.produce(topic, {0: 200})
    real_streaming.run_available_now(topic, checkpoint, **source)
    assert real_streaming.totals(topic, job=JOB) == {topic: 200}
    first_id = stored_topic_id(db, topic)
    assert first_id  # recorded with the job's row
    before = snapshot(db)

    kafka.recreate_topic(topic, 1)
    real_streaming.produce(topic, {0: 150})  # below the stored offset 200
    with pytest.raises(QueryFailed) as e:
        real_streaming.run_available_now(topic, checkpoint, **source)
    assert below_line(topic, 200, 150) in str(e.value), str(e.value)
    assert snapshot(db) == before

    real_streaming.produce(topic, {0: 450})  # 600 now: past it, 200 of them before it
    with pytest.raises(QueryFailed) as e:
        real_streaming.run_available_now(topic, checkpoint, **source)
    assert re.search(recreated_pattern(topic), str(e.value)), str(e.value)
    assert first_id in str(e.value)
    assert snapshot(db) == before

    reset_and_count_the_new_topic(real_streaming, topic, checkpoint, 200, source)
    assert stored_topic_id(db, topic) not in (None, first_id)


@SOURCES
def test_a_topic_recreated_under_a_running_query_stops_it_before_the_new_log_is_read(
    real_streaming: Counting, tmp_path: Path, source: dict[str, str]
) -> None:
    """Recreated and refilled between two micro-batches of a running query. Which line stops
    it depends on when its next micro-batch is planned: while the topic is gone, before the
    new log reached the stored offset, or after (the new topic ID). None reads anything; the
    query restarted on its checkpoint then stops on the topic ID."""
    kafka, db = real_streaming.kafka, real_streaming.db
    topic = real_streaming.new_topic(1, prefix="srunning")
    checkpoint = tmp_path / "chk"
    real_streaming.produce(topic, {0: 200})
    query = (
        sink(real_streaming.stream(topic, **source), real_streaming.database_url, checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        assert real_streaming.totals(topic, job=JOB) == {topic: 200}
        before = snapshot(db)
        kafka.recreate_topic(topic, 1)
        real_streaming.produce(topic, {0: 600})
        try:
            query.awaitTermination(120)
            message = ""
        except Exception as e:  # StreamingQueryException: the source's line
            message = str(e)
    finally:
        query.stop()
    assert message, "the query kept running over the recreated topic"
    stops = (
        "does not exist on Kafka",
        "is not available on Kafka",  # created, its partition's leader not elected yet
        below_line(topic, 200, 0).split(" is beyond")[0] + " is beyond the log-end offset",
        "the topic was deleted and recreated (stored topic ID",
    )
    assert any(s in message for s in stops), message
    assert snapshot(db) == before

    with pytest.raises(QueryFailed) as restarted:
        real_streaming.run_available_now(topic, checkpoint, **source)
    assert re.search(recreated_pattern(topic), str(restarted.value)), str(restarted.value)
    assert snapshot(db) == before
    reset_and_count_the_new_topic(real_streaming, topic, checkpoint, 200, source)


def test_a_micro_batch_replayed_by_a_restart_is_checked_against_the_recreated_topic_before_it_is_read(
    real_streaming: Counting, tmp_path: Path
) -> None:
    """A micro-batch planned on the old log, its tasks failed (nothing committed), the topic then
    recreated and refilled: the restart replays that batch from the checkpoint, straight to
    ``partitions()`` (no ``latestOffset()`` first). It is checked there, before its tasks read
    offsets 50 -> 70 of the new log as the old one's."""
    counted = {"txstore.countMessages": "true"}
    topic = real_streaming.new_topic(1, prefix="sreplay")
    checkpoint = tmp_path / "chk"
    real_streaming.produce(topic, {0: 50})
    real_streaming.run_available_now(topic, checkpoint, **counted)
    real_streaming.produce(topic, {0: 20})
    with pytest.raises(QueryFailed, match="fail point after-first-range"):
        real_streaming.run_available_now(
            topic, checkpoint, **{**counted, "txstore.failpoints": "after-first-range"}
        )
    assert real_streaming.totals(topic, job=JOB) == {topic: 50}
    before = snapshot(real_streaming.db)

    real_streaming.kafka.recreate_topic(topic, 1)
    real_streaming.produce(topic, {0: 100})
    with pytest.raises(QueryFailed) as e:
        real_streaming.run_available_now(topic, checkpoint, **counted)
    assert re.search(recreated_pattern(topic), str(e.value)), str(e.value)
    assert snapshot(real_streaming.db) == before


def test_a_topic_recreated_at_exactly_its_stored_log_end_stops_the_next_query_before_reading(
    real_streaming: Counting, tmp_path: Path
) -> None:
    """Refilled to exactly the stored offsets, the new log has nothing past them to read; only its
    topic ID tells (its 200 messages would otherwise wait, uncounted and untold): a query asks an
    idle topic's ID at its first plan, then every few seconds (the running query's case is
    tests/spark/stream/test_stream_guards.py)."""
    topic = real_streaming.new_topic(1, prefix="ssame")
    checkpoint = tmp_path / "chk"
    real_streaming.produce(topic, {0: 200})
    real_streaming.run_available_now(topic, checkpoint)
    first_id = stored_topic_id(real_streaming.db, topic)
    before = snapshot(real_streaming.db)

    real_streaming.kafka.recreate_topic(topic, 1)
    real_streaming.produce(topic, {0: 200})  # the same log end: nothing to read
    with pytest.raises(QueryFailed) as e:
        real_streaming.run_available_now(topic, checkpoint)
    assert re.search(recreated_pattern(topic), str(e.value)), str(e.value)
    assert first_id is not None and first_id in str(e.value)
    assert snapshot(real_streaming.db) == before
