"""Every line a streaming query prints tells its user what a stream can do: no job flags.

The shared planning, reading and committing code says "rerun with --fail-on-data-loss false",
"check --topic", "Run the job again"; a streaming query has no flags and is not rerun
(txstore/spark/stream/stream_advice.py restates them). Each line here is made by the code that
raises it; the data-loss one also on a query on real Apache Kafka (DeleteRecords), whose advice
is then followed and works.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import txstore as txstore_cli
from tests.helpers.counting import Counting
from tests.helpers.streams import CLASSIC_AND_CONNECT, JOB, QueryFailed
from tests.kafka.test_real_kafka_lifecycle import delete_records
from txstore.core.errors import (
    ConfigError,
    DataLoss,
    KafkaUnavailable,
    OffsetGap,
    OffsetOverlap,
    ResultsTableInvalid,
    TxstoreError,
    UnknownTopic,
)
from txstore.core.fingerprint import recreated_error
from txstore.core.ranges import (
    OffsetRange,
    PartitionWatermarks,
    plan_ranges,
    reset_command,
    topic_missing_now,
)
from txstore.core.starting import StartingOffsets, resolve_starting_offsets
from txstore.kafka.client import Watermarks
from txstore.kafka.client_settings import client_config
from txstore.postgres.locks import START_WAIT_SECONDS, JobLocked
from txstore.spark.stream import stream_advice
from txstore.spark.stream.stream_advice import data_loss_advice, for_stream, restate
from txstore.testing.mock_kafka import MockKafkaCluster

ROOT = Path(__file__).resolve().parents[3]
NEW_CHECKPOINT = "then restart the query with a new checkpointLocation (or delete this one)"
RESET = re.compile(r"txstore reset --job .*?--execute")


def raised(call: Callable[[], Any]) -> TxstoreError:
    with pytest.raises(TxstoreError) as e:
        call()
    return e.value


def no_job_flags(line: str) -> None:
    """One line; no ``--flag`` left but in the ``txstore reset`` commands it names."""
    assert "\n" not in line, line
    flags = re.findall(r"(?<![\w-])--[a-z][\w-]*", RESET.sub("", line))
    assert not flags, f"{flags} in {line!r}"


def test_aged_out_messages_name_the_stream_s_option_and_the_reset_not_the_job_s_flag() -> None:
    error = raised(lambda: plan_ranges("j", {("t", 0): 3}, [PartitionWatermarks("t", 0, 8, 13)]))
    assert "rerun with --fail-on-data-loss false" in str(error)  # the job's line
    stream = for_stream(error)
    assert isinstance(stream, DataLoss)
    assert str(stream) == (
        "job 'j' topic 't' partition 0: stored offset 3 is below the log-start offset 8; 5 messages aged "
        "out of Kafka before they were counted. To go on, restart the query with option failOnDataLoss "
        "false (the same checkpoint): it skips them and records them in txn_lost_ranges; or skip them "
        "unrecorded: txstore reset --job j --topic t --partition 0 --to-earliest --execute, then restart "
        "the query with a new checkpointLocation (or delete this one): it then starts at the offsets "
        "in txn_offsets"
    )
    assert str(stream).endswith(data_loss_advice("j", "t", 0))
    no_job_flags(str(stream))


def test_messages_gone_while_a_task_read_them_name_the_job_the_reset_and_the_restart() -> None:
    """A reading task's line (txstore/kafka/reader.py, records deleted after planning) does not
    name the job: the stream's does, and what to do."""
    read = DataLoss(
        "'t' partition 0: offset 3 is no longer in Kafka (range 3 -> 10); messages aged out before "
        "they were counted (Broker: Offset out of range)"
    )
    line = str(for_stream(read, "j"))
    assert line == (
        "job 'j' topic 't' partition 0: offset 3 is no longer in Kafka (range 3 -> 10); messages aged "
        "out before they were counted (Broker: Offset out of range). " + data_loss_advice("j", "t", 0)
    )
    no_job_flags(line)


def test_a_reset_to_run_is_followed_by_restarting_the_query_with_a_new_checkpoint() -> None:
    beyond = raised(lambda: plan_ranges("j", {("t", 0): 8}, [PartitionWatermarks("t", 0, 0, 2)]))
    gone = raised(lambda: plan_ranges("j", {("t", 0): 8, ("t", 1): 3}, [PartitionWatermarks("t", 0, 0, 9)]))
    recreated = recreated_error(
        "j", "t", 0, "topic ID a", "topic ID b", reset_command("j", "t", 0, "--to-earliest --new-generation")
    )
    for error, command in (
        (beyond, "txstore reset --job j --topic t --partition 0 --to-earliest --execute"),
        (gone, "txstore reset --job j --topic t --partition 1 --forget --execute"),
        (recreated, "txstore reset --job j --topic t --partition 0 --to-earliest --new-generation --execute"),
    ):
        line = str(for_stream(error))
        assert f"{command}, {NEW_CHECKPOINT}: it then starts at the offsets in txn_offsets" in line
        assert type(for_stream(error)) is type(error)
        no_job_flags(line)


def test_a_topic_gone_says_restart_the_query_or_forget_it_and_drop_it_from_subscribe() -> None:
    line = str(for_stream(topic_missing_now("j", "t", "k:9092", 2)))
    assert "Restart the query once the topic exists" in line and "Run the job" not in line
    assert line.endswith(
        "txstore reset --job j --topic t --forget --execute, then restart the query without that topic "
        "in subscribe and with a new checkpointLocation (or delete this one)"
    )
    no_job_flags(line)


def test_kafka_lines_name_the_streams_options(kafka: MockKafkaCluster) -> None:
    missing = raised(lambda: Watermarks()(client_config(kafka.bootstrap_servers), ["no_such_topic_here"]))
    assert isinstance(missing, UnknownTopic) and "check --topic" in str(missing)
    line = str(for_stream(missing))
    assert "check .option('subscribe', ...) (txstore never creates topics)" in line
    no_job_flags(line)
    # The other Kafka lines, as txstore/kafka/admin.py words them (checked to be its words below).
    for text, expected in (
        (
            "Kafka at k:1 did not answer a metadata request within 5s (x); check --bootstrap-servers / "
            "KAFKA_BOOTSTRAP_SERVERS, the network, and --kafka-option security settings",
            "check .option('kafka.bootstrap.servers', ...), the network, and the kafka.* security options",
        ),
        (
            "Kafka at k:1 refused the login (x); check --kafka-option sasl.username, sasl.password and "
            "sasl.mechanisms",
            "check .option('kafka.sasl.username', ...), kafka.sasl.password and kafka.sasl.mechanisms",
        ),
        (
            "Kafka at k:1 sent a certificate this client does not trust (x); check --kafka-option "
            "ssl.ca.location (the CA that signed the broker's certificate)",
            "check .option('kafka.ssl.ca.location', ...) (the CA",
        ),
        ("Kafka client settings refused: x; check --kafka-option", "check the kafka.* options"),
    ):
        line = str(for_stream(KafkaUnavailable(text)))
        assert expected in line, line
        no_job_flags(line)


def test_the_job_lock_the_sinks_conflicts_and_starting_offsets_name_the_query() -> None:
    locked = JobLocked(
        f"job 'j': a `txstore reset` of this job is in progress (waited {START_WAIT_SECONDS}s); "
        "start the job again when it has finished"
    )
    assert str(for_stream(locked)).endswith("restart the query when it has finished")
    r = OffsetRange("t", 0, 5, 9)
    for conflict in (OffsetGap("j", r, 3), OffsetOverlap("j", r, 7)):
        line = str(for_stream(conflict))
        assert "Rerun" not in line
        assert "To plan from the stored offset, restart the query with a new checkpointLocation" in line
        assert type(for_stream(conflict)) is type(conflict)
        no_job_flags(line)
    unknown = raised(  # the stream source names the option it subscribes by (ReadOptions.subscribed_by)
        lambda: resolve_starting_offsets(
            StartingOffsets(specific={("t", 7): 3}), [], [("t", 0)], set(), subscribed="subscribe"
        )
    )
    line = str(for_stream(unknown))
    assert line.startswith("option startingOffsets names 't' partition 7") and "(subscribe)" in line
    assert isinstance(for_stream(unknown), ConfigError)
    no_job_flags(line)
    table = for_stream(ResultsTableInvalid(["--key country: the query has no column country (it has x)"]))
    assert isinstance(table, ResultsTableInvalid)
    assert table.problems == ("txstore.key country: the query has no column country (it has x)",)


def test_every_job_phrase_restated_is_still_the_shared_codes() -> None:
    """A phrase reworded where it is raised would slip through unrestated: each must still be in
    txstore's code (the Kafka client's environment variable as its constant)."""
    code = "\n".join(
        p.read_text() for p in (ROOT / "txstore").rglob("*.py") if p.name != "stream_advice.py"
    ).replace("{BOOTSTRAP_ENV}", "KAFKA_BOOTSTRAP_SERVERS")
    flat = re.sub(r'"\s*\n\s*f?"', "", code)  # implicit concatenation of string literals
    for phrase, _ in stream_advice._PHRASES:
        assert phrase in flat, phrase
    assert "rerun with --fail-on-data-loss false" in flat
    assert (
        "is no longer in Kafka (range {r.from_offset} -> {r.until_offset}); messages aged out before they were counted ("
        in flat
    )
    assert restate("no advice here") == "no advice here"


@pytest.mark.spark
@pytest.mark.real_kafka
def test_messages_aged_out_before_a_stream_counted_them_stop_it_with_advice_that_works(
    real_streaming: Counting, tmp_path: Path
) -> None:
    """DeleteRecords on Apache Kafka takes messages the stream had not counted: the query stops in
    one line naming the reset; the same checkpoint stops again (it starts where the messages were
    lost); the reset, then a new checkpointLocation, count the rest exactly."""
    topic = real_streaming.new_topic(1, prefix="stream_trim")
    checkpoint = tmp_path / "chk"
    real_streaming.produce(topic, {0: 3})
    real_streaming.run_available_now(topic, checkpoint)
    assert real_streaming.totals(topic, job=JOB) == {topic: 3}
    real_streaming.produce(topic, {0: 7})
    delete_records(real_streaming.kafka, topic, 0, 8)  # offsets 3-7 gone before they were counted

    expected = (
        f"job '{JOB}' topic '{topic}' partition 0: stored offset 3 is below the log-start offset 8; "
        "5 messages aged out of Kafka before they were counted. To go on, restart the query with option "
        "failOnDataLoss false (the same checkpoint): it skips them and records them in txn_lost_ranges; "
        f"or skip them unrecorded: txstore reset --job {JOB} --topic {topic} --partition 0 --to-earliest "
        "--execute, then restart the query with a new checkpointLocation (or delete this one): it then "
        "starts at the offsets in txn_offsets"
    )
    for _ in range(2):  # the same checkpoint stops the query again: the new checkpoint is needed
        with pytest.raises(QueryFailed) as e:
            real_streaming.run_available_now(topic, checkpoint)
        line = next(
            (x for x in str(e.value).splitlines() if "is below the log-start offset" in x), str(e.value)
        )
        assert expected in line, line
        assert "--fail-on-data-loss" not in str(e.value)
        assert real_streaming.totals(topic, job=JOB) == {topic: 3}

    reset = txstore_cli(
        *("reset", "--job", JOB, "--topic", topic, "--partition", "0", "--to-earliest", "--execute"),
        url=real_streaming.database_url,
        kafka=real_streaming.kafka,
    )
    assert reset.returncode == 0, reset.stderr
    real_streaming.run_available_now(topic, tmp_path / "new")
    assert real_streaming.totals(topic, job=JOB) == {topic: 5}  # 3, then offsets 8 and 9
    assert real_streaming.offsets(topic, job=JOB) == real_streaming.log_ends(topic) == {0: 10}


@pytest.mark.spark
@pytest.mark.real_kafka
@CLASSIC_AND_CONNECT
def test_a_stream_stopped_by_aged_out_messages_goes_on_with_fail_on_data_loss_false_and_records_them(
    real_streaming: Counting, tmp_path: Path
) -> None:
    """The first way the stop names: the same checkpoint, failOnDataLoss false. DeleteRecords on
    Apache Kafka takes offsets 3-7; the query records them in txn_lost_ranges, counts the rest once,
    and goes on counting what comes after. On classic Spark and through a Spark Connect client (the
    source and sink on its server)."""
    topic = real_streaming.new_topic(2, prefix="stream_skip")
    checkpoint = tmp_path / "chk"
    real_streaming.produce(topic, {0: 3, 1: 2})
    real_streaming.run_available_now(topic, checkpoint)
    real_streaming.produce(topic, {0: 7, 1: 1})
    delete_records(real_streaming.kafka, topic, 0, 8)  # offsets 3-7 gone before they were counted
    with pytest.raises(QueryFailed, match="failOnDataLoss false"):
        real_streaming.run_available_now(topic, checkpoint)

    skip = {"failOnDataLoss": "false"}
    real_streaming.run_available_now(topic, checkpoint, **skip)
    assert real_streaming.totals(topic, job=JOB) == {
        topic: 3 + 2 + 2 + 1
    }  # partition 0: 8 and 9; partition 1: 2
    assert real_streaming.offsets(topic, job=JOB) == real_streaming.log_ends(topic) == {0: 10, 1: 3}
    lost = "SELECT part, from_off, until_off FROM txn_lost_ranges WHERE job = %s AND topic = %s"
    assert real_streaming.db.execute(lost, (JOB, topic)).fetchall() == [(0, 3, 8)]
    real_streaming.produce(topic, {0: 4})
    real_streaming.run_available_now(topic, checkpoint, **skip)
    assert real_streaming.totals(topic, job=JOB) == {topic: 12}
    assert real_streaming.db.execute(lost, (JOB, topic)).fetchall() == [(0, 3, 8)]
