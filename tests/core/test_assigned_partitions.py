"""Assigned partitions (``assign``, ``--assign``): a read or a job that owns only some partitions.

Pure tests of the parsing and planning first; then two jobs splitting a topic's partitions,
on the embedded broker and on Apache Kafka, count every message once between them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

import txstore
from tests.helpers.cli import txstore as txstore_cli
from tests.helpers.counting import BrokerDb, Counting
from txstore.core.assignment import assigned_only, check_assigned_starts, parse_assignment
from txstore.core.errors import ConfigError
from txstore.core.ranges import OffsetRange, PartitionWatermarks
from txstore.core.starting import StartingOffsets
from txstore.options import add_job_options, job_settings
from txstore.spark.source.read_options import parse_read_options
from txstore.spark.source.read_planning import plan_job_ranges, plan_read_ranges

SERVERS = {"kafka.bootstrap.servers": "k:9092"}
URL = "postgresql://u@127.0.0.1/db"
WATERMARKS = [PartitionWatermarks("t", p, 0, 10 + p) for p in range(4)] + [PartitionWatermarks("u", 0, 0, 3)]


def refusal(given: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_read_options({**SERVERS, **given}, {})
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_spark_s_assign_json_is_parsed_as_topics_and_their_partitions_in_order() -> None:
    assert parse_assignment('{"t": [3, 1], "u": [0]}', "option assign") == {"t": (1, 3), "u": (0,)}
    read = parse_read_options({**SERVERS, "assign": '{"t": [2, 0]}'}, {})
    assert read.topics == ("t",) and read.assignment == {"t": (0, 2)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{oops", "option assign is not valid JSON"),
        ("{}", "option assign must be a JSON object naming at least one topic"),
        ('["t"]', "option assign must be a JSON object naming at least one topic"),
        ('{"t": []}', "option assign: topic 't' must map to a non-empty list of partitions"),
        ('{"t": 0}', "option assign: topic 't' must map to a non-empty list of partitions"),
        ('{"t": [-1]}', "option assign: topic 't': partition -1 is not a whole number of at least 0"),
        ('{"t": ["0"]}', "option assign: topic 't': partition '0' is not a whole number of at least 0"),
        ('{"t": [1, 1]}', "option assign: topic 't' names a partition twice: [1, 1]"),
        ('{"a b": [0]}', "option assign: 'a b' is not a valid Kafka topic name"),
    ],
)
def test_a_bad_assignment_is_refused_in_one_line(text: str, expected: str) -> None:
    assert expected in refusal({"assign": text})


def test_exactly_one_of_subscribe_and_assign() -> None:
    assert refusal({"subscribe": "t", "assign": '{"t": [0]}'}).startswith(
        "give one of option subscribe and option assign, not both (as in Spark)"
    )
    assert refusal({}).startswith("option subscribe (or assign) is required")


def test_starting_offsets_json_names_exactly_the_assigned_partitions_as_spark_requires() -> None:
    assigned = {"assign": '{"t": [0, 2]}'}
    fine = parse_read_options({**SERVERS, **assigned, "startingOffsets": '{"t": {"0": 4, "2": -2}}'}, {})
    assert fine.starting.specific == {("t", 0): 4, ("t", 2): -2}
    for words in ("earliest", "latest"):  # no JSON: nothing to name
        parse_read_options({**SERVERS, **assigned, "startingOffsets": words}, {})
    assert refusal({**assigned, "startingOffsets": '{"t": {"0": 4}}'}) == (
        "option startingOffsets leaves out assigned 't' partition 2; with option assign its JSON must "
        "name exactly the assigned partitions, as in Spark (-2 earliest, -1 latest)"
    )
    assert "names 't' partition 1, not assigned by option assign" in refusal(
        {**assigned, "startingOffsets": '{"t": {"0": 4, "1": 0, "2": 0}}'}
    )
    assert "option endingOffsets leaves out assigned 't' partition 0" in refusal(
        {**assigned, "endingOffsets": '{"t": {"2": 5}}'}
    )
    with pytest.raises(ConfigError, match=r"^--starting-offsets leaves out assigned 't' partition 2"):
        check_assigned_starts({"t": (0, 2)}, [("t", 0)], "--assign", "--starting-offsets")


def test_a_read_plans_only_the_assigned_partitions() -> None:
    read = parse_read_options({**SERVERS, "assign": '{"t": [1, 3]}'}, {})
    assert plan_read_ranges(read, WATERMARKS) == [OffsetRange("t", 1, 0, 11), OffsetRange("t", 3, 0, 13)]
    other = parse_read_options({**SERVERS, "assign": '{"t": [0, 2], "u": [0]}'}, {})
    planned = plan_read_ranges(read, WATERMARKS) + plan_read_ranges(other, WATERMARKS)
    assert sorted(r.key for r in planned) == sorted(w.key for w in WATERMARKS)  # a split: all, once


def planning_refusal(assign: str) -> str:
    """The line planning a read with option assign ``assign`` over ``WATERMARKS`` is refused with."""
    read = parse_read_options({**SERVERS, "assign": assign}, {})
    with pytest.raises(ConfigError) as caught:
        plan_read_ranges(read, WATERMARKS)
    return str(caught.value)


def test_an_assigned_partition_kafka_does_not_have_is_refused_unless_the_job_committed_it() -> None:
    assert planning_refusal('{"t": [1, 7]}') == (
        "option assign names 't' partition 7, which Kafka does not report ('t' has 4 partitions; "
        "numbered from 0); assign partitions the topic has"
    )
    assert planning_refusal('{"u": [0, 1], "t": [9]}') == (
        "option assign names 't' partition 9, 'u' partition 1, which Kafka does not report "
        "('t' has 4 partitions, 'u' has 1 partition; numbered from 0); assign partitions the topics have"
    )
    # Committed and gone: the planner's vanished-partition line tells it (not this one).
    kept, committed = assigned_only({"t": (1, 7)}, WATERMARKS, {("t", 7): 5, ("t", 0): 3})
    assert [w.key for w in kept] == [("t", 1)] and committed == {("t", 7): 5}


def test_a_job_reading_assigned_partitions_plans_only_those_and_leaves_its_other_rows_alone() -> None:
    kept, committed = assigned_only({"t": (0, 1)}, WATERMARKS, {("t", 0): 4, ("t", 3): 2})
    assert committed == {("t", 0): 4}  # t/3 is no longer assigned: not planned, its row kept
    assert plan_job_ranges("j", committed, kept, StartingOffsets()) == [
        OffsetRange("t", 0, 4, 10),
        OffsetRange("t", 1, 0, 11),
    ]
    everything, all_committed = assigned_only(None, WATERMARKS, {("t", 3): 2})
    assert everything == WATERMARKS and all_committed == {("t", 3): 2}


# -- the jobs' --assign ----------------------------------------------------------------------


def settings_from(*argv: str) -> Any:
    parser = argparse.ArgumentParser()
    add_job_options(parser, "count_topic")
    return job_settings(parser.parse_args(["--bootstrap-servers", "k:9092", "--database-url", URL, *argv]))


def test_the_jobs_assign_flag_takes_spark_s_json_instead_of_topics() -> None:
    settings = settings_from("--assign", '{"t": [3, 1]}')
    assert settings.topics == ("t",) and settings.assignment == {"t": (1, 3)}
    assert settings_from("--topic", "t").assignment is None


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("--topic", "t", "--assign", '{"t": [0]}'), "give either --topic or --assign, not both"),
        ((), "no topic given: pass --topic TOPIC (repeatable), or --assign"),
        (("--assign", '{"t": [0, 0]}'), "--assign: topic 't' names a partition twice"),
        (("--assign", '{"t b": [0]}'), "--assign: 't b' is not a valid Kafka topic name"),
        (
            ("--assign", '{"t": [0, 1]}', "--starting-offsets", '{"t": {"0": 5}}'),
            "--starting-offsets leaves out assigned 't' partition 1; with --assign its JSON must name "
            "exactly the assigned partitions",
        ),
    ],
)
def test_a_bad_assign_flag_is_refused_in_one_line(argv: tuple[str, ...], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from(*argv)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


# -- two jobs splitting a topic's partitions, on the embedded broker and on Apache Kafka ----


@pytest.mark.spark
def test_two_jobs_splitting_a_topic_s_partitions_count_every_message_once_between_them(
    any_counting: Counting,
) -> None:
    topic = any_counting.new_topic(4)
    halves = {"left": {topic: (0, 2)}, "right": {topic: (1, 3)}}
    produced: dict[int, int] = {p: 0 for p in range(4)}
    for counts in ({0: 30, 1: 20, 2: 10, 3: 1}, {1: 5, 2: 7}, {3: 40}):
        any_counting.produce(topic, counts)
        for p, n in counts.items():
            produced[p] += n
        for job, assignment in halves.items():
            any_counting.job(topic, job=job, assignment=assignment).run_batch()
        left, right = any_counting.offsets(topic, job="left"), any_counting.offsets(topic, job="right")
        assert set(left) == {0, 2} and set(right) == {1, 3}  # each job's rows: its partitions only
        assert {**left, **right} == any_counting.log_ends(topic)
        counted = sum(any_counting.totals(topic, job=job)[topic] for job in halves)
        assert counted == sum(produced.values())
        assert any_counting.totals(topic, job="left") == {topic: produced[0] + produced[2]}

    # Neither job is running, and each has counted all of its partitions: txstore status shows
    # each job's own partitions only, and --check finds nothing to start (the other job's
    # partitions are not this one's lag).
    for job, mine in (("left", [0, 2]), ("right", [1, 3])):
        shown = any_counting.txstore("status", "--job", job, "--json")
        assert shown.returncode == 0, shown.stderr
        assert [(r["partition"], r["lag"]) for r in json.loads(shown.stdout)] == [(p, 0) for p in mine]
        check = any_counting.txstore("status", "--job", job, "--check")
        assert (check.returncode, check.stdout.splitlines()[0]) == (0, f"OK: job {job!r}: 2 OK"), check.stdout

    # The batch source reads the same split: its two halves are every message, once.
    def read(assign: str) -> list[tuple[int, int]]:
        frame = (
            any_counting.spark.read.format("txstore")
            .option("kafka.bootstrap.servers", any_counting.kafka.bootstrap_servers)
            .option("assign", assign)
            .load()
        )
        return [(r.partition, r.offset) for r in frame.select("partition", "offset").collect()]

    txstore.register(any_counting.spark)
    both = read(json.dumps({topic: [0, 2]})) + read(json.dumps({topic: [3, 1]}))
    assert sorted(both) == sorted((p, o) for p, n in produced.items() for o in range(n))
    assert {p for p, _ in read(json.dumps({topic: [3]}))} == {3}


@pytest.mark.spark
def test_a_stream_with_assign_reads_and_commits_only_its_partitions(
    any_spark: Any, broker_db: BrokerDb, tmp_path: Path
) -> None:
    """On classic Spark and through a Spark Connect client (the source and sink on its server)."""
    spark = any_spark
    txstore.register(spark)
    topic = broker_db.new_topic(3)
    broker_db.produce(topic, {0: 4, 1: 5, 2: 6})
    frame = (
        spark.readStream.format("txstore")
        .option("kafka.bootstrap.servers", broker_db.kafka.bootstrap_servers)
        .option("assign", json.dumps({topic: [0, 2]}))
        .option("txstore.job", "assigned")
        .option("txstore.databaseUrl", broker_db.database_url)
        .load()
    )
    query = (
        frame.writeStream.format("txstore")
        .option("txstore.job", "assigned")
        .option("txstore.databaseUrl", broker_db.database_url)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert broker_db.offsets(topic, job="assigned") == {0: 4, 2: 6}
    assert broker_db.totals(topic, job="assigned") == {topic: 10}
    # Recorded for txstore status: partition 1 is not this job's to start.
    shown = txstore_cli(
        "status", "--job", "assigned", "--json", url=broker_db.database_url, kafka=broker_db.kafka
    )
    assert [(r["partition"], r["lag"]) for r in json.loads(shown.stdout)] == [(0, 0), (2, 0)], shown.stderr
