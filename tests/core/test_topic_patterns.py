"""Topic patterns (``--topic-pattern``, ``subscribePattern``): the topics are those Kafka has whose
whole name matches, resolved every batch.

Pure tests of matching and of where joining topics start first; then jobs on Apache Kafka: topics
created while the job runs and while it is down, a topic deleted, one recreated, a pattern that
matches nothing yet, two jobs whose patterns overlap, and the ``count_topic`` command's flag.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import REPO, produce, send
from tests.helpers.cli import txstore
from tests.helpers.counting import Counting, log_ends, offsets, spark_job_count, totals
from tests.helpers.job_processes import JOB, job_env
from tests.helpers.streams import QueryFailed, sink, stream
from tests.helpers.topics import topic_name
from tests.ops.test_metrics import scrape
from txstore.core.errors import ConfigError, TopicRecreated, UnknownTopic
from txstore.core.patterns import (
    compile_topic_pattern,
    joining_starts,
    matching_topics,
    resolve_pattern,
)
from txstore.core.ranges import PartitionWatermarks, topic_missing_now
from txstore.core.starting import LATEST, StartingOffsets
from txstore.core.subscription import Subscription
from txstore.count_topic import count_messages
from txstore.job import JobSettings, TransactionalJob
from txstore.options import add_job_options, job_settings
from txstore.postgres import store
from txstore.spark.source.read_options import parse_read_options
from txstore.spark.source.read_planning import plan
from txstore.spark.stream.stream_advice import NEW_CHECKPOINT, for_stream
from txstore.spark.stream.stream_options import parse_stream_options
from txstore.testing.mock_kafka import MockKafkaCluster
from txstore.testing.real_kafka import RealKafkaCluster

# -- pure: matching, joining, the flag -------------------------------------------------------------


def test_a_pattern_matches_whole_topic_names_and_never_kafka_s_internal_topics() -> None:
    pattern = compile_topic_pattern("orders-.*|_.*", "--topic-pattern")
    topics = ["orders-eu", "orders-us", "old-orders-eu", "orders", "__consumer_offsets", "_private"]
    assert matching_topics(pattern, topics) == ("_private", "orders-eu", "orders-us")
    assert matching_topics(compile_topic_pattern("orders", "--topic-pattern"), topics) == ("orders",)
    assert matching_topics(compile_topic_pattern(".*", "x"), ["__transaction_state", "a"]) == ("a",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "orders-[",
            "--topic-pattern 'orders-[' is not a valid regular expression (unterminated character set",
        ),
        ("(a", "--topic-pattern '(a' is not a valid regular expression (missing ), unterminated subpattern"),
        ("  ", "--topic-pattern must not be empty"),
    ],
)
def test_a_pattern_that_does_not_compile_is_refused_in_one_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        settings_from("--topic-pattern", text)
    assert str(raised.value).startswith(expected) and "\n" not in str(raised.value)
    assert "Python's re syntax" in str(raised.value) or not text.strip()


def settings_from(*argv: str) -> Any:
    parser = argparse.ArgumentParser()
    add_job_options(parser, "j")
    given = ["--bootstrap-servers", "k:9092", "--database-url", "postgresql://u@h/db", *argv]
    return job_settings(parser.parse_args(given))


def test_the_jobs_topic_pattern_flag_is_exclusive_with_topic_and_assign() -> None:
    settings = settings_from("--topic-pattern", "orders-.*")
    assert settings.topic_pattern == "orders-.*" and settings.topics == ()
    for other in (("--topic", "t"), ("--assign", '{"t": [0]}')):
        with pytest.raises(ConfigError) as raised:
            settings_from("--topic-pattern", "orders-.*", *other)
        assert str(raised.value) == (
            f"give either {other[0]} or --topic-pattern, not both: the topics to read, or a regular "
            "expression their names match"
        )
    with pytest.raises(ConfigError, match="not both"):
        JobSettings("j", ("t",), "k:9092", "postgresql://u@h/db", topic_pattern="t.*")


def test_starting_offsets_are_for_the_first_run_and_a_topic_matching_later_joins_at_earliest() -> None:
    pattern = re.compile("t-.*")
    new = [PartitionWatermarks("t-new", 0, 4, 9), PartitionWatermarks("t-old", 3, 2, 5)]
    first = resolve_pattern(pattern, ["t-new", "t-old"], [])
    assert first.first_run and joining_starts(first, new, "--topic-pattern") == []
    later = resolve_pattern(pattern, ["t-new", "t-old"], ["t-old", "unrelated"])
    assert not later.first_run and later.topics == ("t-new", "t-old")
    joins = joining_starts(later, new, "--topic-pattern")
    assert [(d.topic, d.partition, d.offset) for d in joins] == [("t-new", 0, 4)]  # t-old/3: a new partition
    assert joins[0].reason == "earliest offset 4 (topic newly matching --topic-pattern)"
    gone = resolve_pattern(pattern, ["t-new"], ["t-old"])
    assert gone.topics == ("t-new", "t-old") and gone.vanished == ("t-old",)


# -- jobs on Apache Kafka --------------------------------------------------------------------------


def pattern_job(counting: Counting, pattern: str, **settings: Any) -> TransactionalJob:
    """``counting``'s count_topic job of the topics ``pattern`` matches (job ``pattern_job`` unless named)."""
    return counting.job(job=settings.pop("job", "pattern_job"), topic_pattern=pattern, **settings)


def family(prefix: str) -> tuple[str, str]:
    """A prefix no other test's topics have, and the pattern matching ``prefix-<anything>``."""
    base = topic_name(prefix)
    return base, re.escape(base) + "-.+"


def exact(db: psycopg.Connection, kafka: RealKafkaCluster, job: str, produced: dict[str, int]) -> None:
    """The job holds exactly ``produced``'s topics, each counted once, its offsets at Kafka's log ends."""
    assert store.job_topics(db, job) == sorted(produced)
    for topic in produced:
        assert offsets(db, topic, job=job) == log_ends(kafka, topic)
    assert totals(db, *produced, job=job) == produced


def test_topics_created_while_the_job_runs_and_while_it_is_down_join_at_their_earliest_offset(
    real_counting: Counting,
) -> None:
    kafka, db = real_counting.kafka, real_counting.db
    base, pattern = family("pat-life")
    servers = kafka.bootstrap_servers
    first = f"{base}-a"
    kafka.create_topic(first, 2)
    kafka.create_topic(f"{base}x", 1)  # matches a prefix only: never read
    produce(servers, first, {0: 5, 1: 6})
    produce(servers, f"{base}x", {0: 3})
    # First run: --starting-offsets latest applies to every matched topic.
    pattern_job(real_counting, pattern, starting_offsets=StartingOffsets(LATEST)).run()
    assert offsets(db, first, job="pattern_job") == {0: 5, 1: 6}
    assert totals(db, first, job="pattern_job") == {first: 0}

    # Running (--interval): a topic created meanwhile joins at earliest, though latest was asked.
    job = pattern_job(real_counting, pattern, starting_offsets=StartingOffsets(LATEST), interval=0.5)
    stop = threading.Event()
    running = threading.Thread(target=job.run, args=(stop,))
    running.start()
    try:
        second = f"{base}-b"
        kafka.create_topic(second, 3)
        produce(servers, second, {0: 4, 1: 0, 2: 7})
        produce(servers, first, {1: 2})
        wait_for(lambda: offsets(db, second, job="pattern_job") == {0: 4, 1: 0, 2: 7})
        wait_for(lambda: offsets(db, first, job="pattern_job") == {0: 5, 1: 8})
    finally:
        stop.set()
        running.join(60)
    assert not running.is_alive()
    exact(db, kafka, "pattern_job", {first: 2, second: 11})

    # Down: a topic created and written meanwhile is counted whole at the next run.
    third = f"{base}-c"
    kafka.create_topic(third, 1)
    produce(servers, third, {0: 9})
    pattern_job(real_counting, pattern, starting_offsets=StartingOffsets(LATEST)).run()
    exact(db, kafka, "pattern_job", {first: 2, second: 11, third: 9})

    # A second job whose pattern overlaps owns its own offsets: it counts the b and c topics again.
    other = pattern_job(real_counting, re.escape(base) + "-[bc]", job="other_pattern_job")
    other.run()
    exact(db, kafka, "other_pattern_job", {second: 11, third: 9})
    exact(db, kafka, "pattern_job", {first: 2, second: 11, third: 9})


def wait_for(condition: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.2)


def test_a_pattern_matching_nothing_yet_reads_nothing_says_so_and_counts_the_first_topic_that_matches(
    real_counting: Counting, caplog: pytest.LogCaptureFixture
) -> None:
    kafka, db = real_counting.kafka, real_counting.db
    base, pattern = family("pat-none")
    jobs_before = spark_job_count(real_counting.spark)
    with caplog.at_level(logging.INFO, logger="txstore"):
        report = pattern_job(real_counting, pattern, job="early_pattern_job").run_batch()
    assert report.ranges == ()
    assert spark_job_count(real_counting.spark) == jobs_before  # no Spark job
    assert store.job_topics(db, "early_pattern_job") == []
    said = [r.getMessage() for r in caplog.records if "matches no topic" in r.getMessage()]
    assert said == [
        f"job early_pattern_job: --topic-pattern {pattern!r} matches no topic on Kafka yet; nothing to read"
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records if "matches no topic" in r.getMessage())

    topic = f"{base}-late"
    kafka.create_topic(topic, 2)
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 4})
    pattern_job(real_counting, pattern, job="early_pattern_job").run()
    exact(db, kafka, "early_pattern_job", {topic: 7})


def test_a_deleted_topic_stops_a_pattern_job_with_the_vanished_topic_line_and_forgetting_it_lets_it_go_on(
    real_counting: Counting,
) -> None:
    kafka, db = real_counting.kafka, real_counting.db
    base, pattern = family("pat-gone")
    kept, gone = f"{base}-kept", f"{base}-gone"
    for topic in (kept, gone):
        kafka.create_topic(topic, 2)
        produce(kafka.bootstrap_servers, topic, {0: 2, 1: 3})
    pattern_job(real_counting, pattern, job="gone_pattern_job").run()
    exact(db, kafka, "gone_pattern_job", {kept: 5, gone: 5})
    kafka.delete_topic(gone)
    produce(kafka.bootstrap_servers, kept, {0: 1})

    with pytest.raises(UnknownTopic) as raised:
        pattern_job(real_counting, pattern, job="gone_pattern_job").run()
    assert str(raised.value) == (
        f"job 'gone_pattern_job' topic {gone!r} does not exist on Kafka at {kafka.bootstrap_servers} "
        "now, though the job stored offsets for 2 of its partitions: it may be being deleted and recreated. "
        "Run the job again once the topic exists (a recreated topic then stops it in one line naming "
        "the reset to run); if it was deleted for good, forget its offsets: "
        f"txstore reset --job gone_pattern_job --topic {gone} --forget --execute"
    )
    assert offsets(db, kept, job="gone_pattern_job") == {0: 2, 1: 3}  # nothing counted meanwhile
    # A batch read of the job's next batch stops on the same line.
    job_read = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "subscribePattern": pattern,
        "txstore.job": "gone_pattern_job",
        "txstore.databaseUrl": real_counting.database_url,
    }
    with pytest.raises(UnknownTopic) as by_read:
        plan(parse_read_options(job_read, {}))
    assert str(by_read.value) == str(raised.value)

    forget = txstore(
        *f"reset --job gone_pattern_job --topic {gone} --forget --execute".split(),
        url=real_counting.database_url,
        kafka=kafka,
    )
    assert forget.returncode == 0, forget.stderr
    pattern_job(real_counting, pattern, job="gone_pattern_job").run()
    assert store.job_topics(db, "gone_pattern_job") == [kept]
    assert offsets(db, kept, job="gone_pattern_job") == log_ends(kafka, kept)
    assert totals(db, kept, job="gone_pattern_job") == {kept: 6}


def test_a_topic_recreated_under_the_same_name_stops_a_pattern_job_by_its_topic_id(
    real_counting: Counting,
) -> None:
    kafka, db = real_counting.kafka, real_counting.db
    base, pattern = family("pat-again")
    topic = f"{base}-t"
    kafka.create_topic(topic, 1)
    produce(kafka.bootstrap_servers, topic, {0: 3})
    pattern_job(real_counting, pattern, job="again_pattern_job").run()
    kafka.recreate_topic(topic, 1)
    produce(kafka.bootstrap_servers, topic, {0: 3})  # the same offsets as before: only the ID tells
    with pytest.raises(TopicRecreated) as raised:
        pattern_job(real_counting, pattern, job="again_pattern_job").run()
    assert "topic ID" in str(raised.value) and topic in str(raised.value)
    assert totals(db, topic, job="again_pattern_job") == {topic: 3}


@pytest.mark.spark
@pytest.mark.real_kafka
def test_the_count_topic_command_takes_topic_pattern_and_counts_a_topic_created_while_it_runs(
    real_kafka: RealKafkaCluster, database_url: str, db: psycopg.Connection
) -> None:
    base, pattern = family("pat-cli")
    servers = real_kafka.bootstrap_servers
    first = f"{base}-1"
    real_kafka.create_topic(first, 1)
    produce(servers, first, {0: 4})
    args = ["--bootstrap-servers", servers, "--database-url", database_url, "--job", "cli_pattern_job"]
    # This branch's txstore, not the installed one (job_env drops PYTHONPATH).
    env = job_env(PYTHONPATH=str(REPO))
    process = subprocess.Popen(
        [sys.executable, JOB, *args, "--topic-pattern", pattern, "--interval", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: offsets(db, first, job="cli_pattern_job") == {0: 4}, timeout=180)
        second = f"{base}-2"
        real_kafka.create_topic(second, 2)
        produce(servers, second, {0: 5, 1: 6})
        wait_for(lambda: offsets(db, second, job="cli_pattern_job") == {0: 5, 1: 6})
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    exact(db, real_kafka, "cli_pattern_job", {first: 4, second: 11})
    assert f"--topic-pattern {pattern!r} matches 1 topic: {first}" in err
    assert f"{second}/0 starts at earliest offset 0 (topic newly matching --topic-pattern)" in err


def test_a_batch_read_of_a_pattern_job_asks_kafka_through_one_client_and_tells_a_recreated_topic_by_its_id(
    real_counting: Counting, admin_clients: list[Any]
) -> None:
    """A read's plan asked Kafka's topics, log offsets and topic IDs each through a client of its
    own (a new one waited about 55 ms for its first answer then); librdkafka's own class, counted."""
    kafka = real_counting.kafka
    base, pattern = family("pat-one-client")
    topic = f"{base}-t"
    kafka.create_topic(topic, 2)
    produce(kafka.bootstrap_servers, topic, {0: 2, 1: 1})
    pattern_job(real_counting, pattern, job="one_client_read").run()
    produce(kafka.bootstrap_servers, topic, {0: 3})
    job_read = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "subscribePattern": pattern,
        "txstore.job": "one_client_read",
        "txstore.databaseUrl": real_counting.database_url,
    }
    admin_clients.clear()  # the job's own, before the read
    assert [
        (r.topic, r.partition, r.from_offset, r.until_offset) for r in plan(parse_read_options(job_read, {}))
    ] == [(topic, 0, 2, 5)]
    assert len(admin_clients) == 1

    kafka.recreate_topic(topic, 2)
    produce(kafka.bootstrap_servers, topic, {0: 2, 1: 1})  # the same offsets as before: only the ID tells
    with pytest.raises(TopicRecreated) as raised:
        plan(parse_read_options(job_read, {}))
    assert "topic ID" in str(raised.value) and topic in str(raised.value)
    assert len(admin_clients) == 2


# -- format("txstore"): subscribePattern ------------------------------------------------------------

BASE = {"kafka.bootstrap.servers": "k:9092"}


def read_refusal(given: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as raised:
        parse_read_options({**BASE, **given}, {})
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_subscribe_pattern_is_one_of_subscribe_assign_and_subscribe_pattern_and_must_compile() -> None:
    read = parse_read_options({**BASE, "subscribePattern": "orders-.*"}, {})
    assert read.pattern == "orders-.*" and read.topics == ()
    assert read_refusal({"subscribe": "a", "subscribePattern": "a.*"}).startswith(
        "give one of option subscribe and option subscribePattern, not both (as in Spark)"
    )
    assert read_refusal({"assign": '{"a": [0]}', "subscribepattern": "a.*"}).startswith(
        "give one of option assign and option subscribePattern, not both (as in Spark)"
    )
    assert read_refusal({"subscribePattern": "a["}).startswith(
        "option subscribePattern 'a[' is not a valid regular expression (unterminated character set"
    )
    assert read_refusal({"subscribePattern": "a.*", "startingOffsets": '{"b": {"0": 1}}'}) == (
        "option startingOffsets names topics option subscribePattern 'a.*' does not match: 'b'; "
        "remove them from the JSON"
    )
    stream = parse_stream_options(
        {**BASE, "subscribePattern": "a.*", "txstore.job": "j", "txstore.databaseUrl": "postgresql://u@h/d"},
        {},
    )
    assert stream.read.pattern == "a.*"


def test_a_batch_read_with_subscribe_pattern_reads_every_matching_topic_and_nothing_before_one_exists(
    real_counting: Counting,
) -> None:
    kafka, db = real_counting.kafka, real_counting.db
    txstore_register(real_counting.spark)
    base, pattern = family("pat-read")
    servers = kafka.bootstrap_servers

    def read(**more: str) -> list[tuple[str, int, int]]:
        reader = real_counting.spark.read.format("txstore").option("kafka.bootstrap.servers", servers)
        for name, value in {"subscribePattern": pattern, **more}.items():
            reader = reader.option(name, value)
        frame = reader.load().select("topic", "partition", "offset")
        return sorted((r.topic, r.partition, r.offset) for r in frame.collect())

    assert read() == []  # nothing matches yet: an empty read, not an error
    a, b = f"{base}-a", f"{base}-b"
    for topic, counts in ((a, {0: 2, 1: 1}), (b, {0: 3})):
        kafka.create_topic(topic, len(counts))
        produce(servers, topic, counts)
    kafka.create_topic(f"{base}", 1)  # the prefix alone: no match
    produce(servers, base, {0: 4})
    expected = [(a, 0, 0), (a, 0, 1), (a, 1, 0), (b, 0, 0), (b, 0, 1), (b, 0, 2)]
    assert read() == expected

    # With txstore.job: what that job's next batch reads; a topic joining after its first run at earliest.
    pattern_job(real_counting, re.escape(base) + "-a", job="read_pattern_job").run()
    produce(servers, a, {1: 1})
    job_read = {
        "txstore.job": "read_pattern_job",
        "txstore.databaseUrl": real_counting.database_url,
        "startingOffsets": "latest",
    }
    assert read(**job_read) == [(a, 1, 1), (b, 0, 0), (b, 0, 1), (b, 0, 2)]
    assert store.job_topics(db, "read_pattern_job") == [a]  # read-only: no row created
    assert store.subscriptions(db, "read_pattern_job") == {  # the job's own record, not the read's
        "read_pattern_job": Subscription("pattern", pattern=re.escape(base) + "-a")
    }


def txstore_register(spark: Any) -> None:
    import txstore

    txstore.register(spark)


@pytest.mark.spark
@pytest.mark.real_kafka
def test_a_stream_with_subscribe_pattern_counts_topics_created_while_it_runs_starting_with_none(
    any_spark: Any, real_kafka: RealKafkaCluster, database_url: str, db: psycopg.Connection, tmp_path: Any
) -> None:
    """On classic Spark and through a Spark Connect client (the source and sink on its server)."""
    spark = any_spark
    txstore_register(spark)
    base, pattern = family("pat-stream")
    servers = real_kafka.bootstrap_servers
    job = "pattern_stream_job"
    frame = stream(spark, real_kafka, database_url, pattern, job=job, by="subscribePattern")
    query = sink(frame, database_url, tmp_path / "chk", job=job).trigger(processingTime="1 second").start()
    try:
        time.sleep(3)  # a few triggers with nothing matching: the same (empty) offsets, no batch
        assert query.exception() is None and store.job_topics(db, job) == []
        a = f"{base}-a"
        real_kafka.create_topic(a, 2)
        produce(servers, a, {0: 3, 1: 4})
        wait_for(lambda: offsets(db, a, job=job) == {0: 3, 1: 4})
        b = f"{base}-b"
        real_kafka.create_topic(b, 1)
        produce(servers, b, {0: 5})
        produce(servers, a, {1: 1})
        wait_for(lambda: offsets(db, b, job=job) == {0: 5} and offsets(db, a, job=job) == {0: 3, 1: 5})
        assert query.exception() is None
    finally:
        query.stop()
    exact(db, real_kafka, job, {a: 8, b: 5})


def test_a_pattern_stream_s_line_for_a_deleted_topic_asks_for_no_change_of_subscribe() -> None:
    gone = topic_missing_now("j", "t", "k:9092", 2)
    line = str(for_stream(gone, "j", pattern=True))
    assert line.endswith(f"txstore reset --job j --topic t --forget --execute, then {NEW_CHECKPOINT}")
    assert "Restart the query once the topic exists" in line
    assert "in subscribe" in str(for_stream(gone, "j"))  # a subscribe query must drop the topic


# -- what a pattern job holds: metrics and txstore status ---------------------------------------------


def partitions_shown(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[str, float]:
    """``txstore_topic_partitions`` by topic, from a scrape's samples (tests/ops/test_metrics.py)."""
    return {
        dict(labels)["topic"]: v
        for (name, labels), v in samples.items()
        if name == "txstore_topic_partitions"
    }


@pytest.mark.spark
def test_metrics_and_status_show_the_topics_a_pattern_job_holds_as_they_join(
    spark: Any, kafka: MockKafkaCluster, database_url: str, db: psycopg.Connection
) -> None:
    base, pattern = family("pat-shown")
    a, b, c = f"{base}-a", f"{base}-b", f"{base}-c"
    kafka.create_topic(a, 2)
    kafka.create_topic(b, 1)
    produce(kafka.bootstrap_servers, a, {0: 5, 1: 7})
    produce(kafka.bootstrap_servers, b, {0: 3})
    job = TransactionalJob(
        spark,
        JobSettings(
            "shown_pattern_job",
            (),
            kafka.bootstrap_servers,
            database_url,
            topic_pattern=pattern,
            metrics_port=0,
        ),
        count_messages,
    )
    with job:
        job.run_batch()
        _, samples = scrape(job)
        assert partitions_shown(samples) == {a: 2, b: 1}
        lag = {
            (dict(labels)["topic"], dict(labels)["partition"]): v
            for (name, labels), v in samples.items()
            if name == "txstore_lag_messages"
        }
        assert lag == {(a, "0"): 5, (a, "1"): 7, (b, "0"): 3}

        kafka.create_topic(c, 1)  # joins while the job runs
        produce(kafka.bootstrap_servers, c, {0: 4})
        job.run_batch()
        _, samples = scrape(job)
        assert partitions_shown(samples) == {a: 2, b: 1, c: 1}
        assert (
            samples[
                (
                    "txstore_lag_messages",
                    frozenset({"job": "shown_pattern_job", "topic": c, "partition": "0"}.items()),
                )
            ]
            == 4
        )
        assert (
            samples[("txstore_messages_total", frozenset({"job": "shown_pattern_job", "topic": c}.items()))]
            == 4
        )

    status = txstore("status", "--job", "shown_pattern_job", "--json", url=database_url, kafka=kafka)
    assert status.returncode == 0, status.stderr
    rows = {
        (r["topic"], r["partition"]): (r["offset"], r["log_end"], r["lag"]) for r in json.loads(status.stdout)
    }
    assert rows == {(a, 0): (5, 5, 0), (a, 1): (7, 7, 0), (b, 0): (3, 3, 0), (c, 0): (4, 4, 0)}

    # A topic that starts matching while the job is down is the job's too: status shows it with
    # no offset yet and its whole log as lag, and --check stops on it (no instance to start it).
    d = f"{base}-d"
    kafka.create_topic(d, 1)
    produce(kafka.bootstrap_servers, d, {0: 2})
    status = txstore("status", "--job", "shown_pattern_job", "--json", url=database_url, kafka=kafka)
    assert status.returncode == 0, status.stderr
    rows = {
        (r["topic"], r["partition"]): (r["offset"], r["log_end"], r["lag"]) for r in json.loads(status.stdout)
    }
    assert rows[(d, 0)] == (None, 2, 2) and len(rows) == 5
    check = txstore("status", "--job", "shown_pattern_job", "--check", url=database_url, kafka=kafka)
    assert check.returncode == 2, check.stdout + check.stderr
    assert check.stdout.splitlines()[0] == "CRITICAL: job 'shown_pattern_job': 1 STOP, 4 OK", check.stdout
    assert f"topic {d!r} partition 0: lag 2 and no instance of the job is running" in check.stdout


def pattern_stream_available_now(counting: Counting, pattern: str, job: str, checkpoint: Path) -> str:
    """One Trigger.AvailableNow run of a ``subscribePattern`` stream into the txstore sink: "" when
    it ends, else the line it stopped with."""
    try:
        counting.run_available_now(pattern, checkpoint, job=job, by="subscribePattern")
    except QueryFailed as e:  # the source's line
        return str(e)
    return ""


def test_a_pattern_stream_counts_a_topic_created_while_it_was_down_and_stops_on_a_deleted_one(
    real_counting: Counting, tmp_path: Path
) -> None:
    kafka, db = real_counting.kafka, real_counting.db
    txstore_register(real_counting.spark)
    base, pattern = family("pat-down")
    servers = kafka.bootstrap_servers
    job, checkpoint = "down_pattern_stream", tmp_path / "chk"
    a, b = f"{base}-a", f"{base}-b"
    kafka.create_topic(a, 1)
    produce(servers, a, {0: 6})
    assert pattern_stream_available_now(real_counting, pattern, job, checkpoint) == ""
    exact(db, kafka, job, {a: 6})

    kafka.create_topic(b, 2)  # while the query is down
    produce(servers, b, {0: 2, 1: 3})
    assert pattern_stream_available_now(real_counting, pattern, job, checkpoint) == ""
    exact(db, kafka, job, {a: 6, b: 5})

    kafka.delete_topic(b)
    produce(servers, a, {0: 1})
    stopped = pattern_stream_available_now(real_counting, pattern, job, checkpoint)
    assert (
        f"job {job!r} topic {b!r} does not exist on Kafka at {servers} now, though the job stored offsets for 2 "
        "of its partitions" in stopped
    ), stopped
    assert f"txstore reset --job {job} --topic {b} --forget --execute, then {NEW_CHECKPOINT}" in stopped
    assert "subscribe" not in stopped.split("--forget")[1].split("\n")[0]  # the pattern needs no change
    assert offsets(db, a, job=job) == {0: 6}  # nothing read meanwhile


def test_a_starting_timestamp_applies_to_a_pattern_job_s_first_topics_and_a_later_topic_joins_at_earliest(
    real_counting: Counting,
) -> None:
    kafka, db = real_counting.kafka, real_counting.db
    base, pattern = family("pat-time")
    a, b = f"{base}-a", f"{base}-b"
    kafka.create_topic(a, 1)
    new = int(time.time() * 1000) - 3_600_000  # Kafka refuses timestamps more than an hour ahead
    old = new - 86_400_000
    send(kafka.bootstrap_servers, a, [(0, b"k", b"v", old)] * 3 + [(0, b"k", b"v", new)] * 2)
    starting = StartingOffsets(timestamp_ms=new)
    pattern_job(real_counting, pattern, job="time_pattern_job", starting_offsets=starting).run()
    assert offsets(db, a, job="time_pattern_job") == {0: 5}
    assert totals(db, a, job="time_pattern_job") == {a: 2}  # the first run: from the time on

    kafka.create_topic(b, 1)
    send(kafka.bootstrap_servers, b, [(0, b"k", b"v", old)] * 4)  # all before the time: still counted
    pattern_job(real_counting, pattern, job="time_pattern_job", starting_offsets=starting).run()
    assert offsets(db, b, job="time_pattern_job") == {0: 4}
    assert totals(db, b, job="time_pattern_job") == {b: 4}
