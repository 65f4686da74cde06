"""Against real Apache Kafka (txstore/testing/real_kafka.py): what the mock broker cannot show.

Real PostgreSQL and Spark as everywhere; the broker is Kafka itself (one KRaft
node per session, ``real_kafka``), so transactions have a last stable offset,
offsets-for-times answers, and topics have IDs. The first tests check the
broker module itself (jars, start failures, kill and restart), without Spark.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from tests.conftest import REPO, produce, send
from tests.helpers.cli import txstore
from tests.helpers.counting import Counting, job_for, log_ends, totals
from tests.helpers.kafka_transactions import TX_TIMEOUT, in_transaction, transactional
from tests.helpers.recreated import snapshot, topic_id_changed_line
from txstore.core.errors import TopicRecreated
from txstore.core.starting import StartingOffsets, parse_starting_offsets, parse_timestamp
from txstore.job import JobSettings, TransactionalJob
from txstore.kafka.client import Watermarks
from txstore.kafka.client_settings import client_config
from txstore.kafka.list_offsets import offsets_for_timestamp
from txstore.kafka.topic_ids import fetch_topic_ids
from txstore.ops.reset import apply_reset, plan_job_reset
from txstore.ops.reset_plan import ResetTarget
from txstore.ops.status import status
from txstore.postgres.db import connect
from txstore.postgres.results.results_table import ResultsTable
from txstore.settings import PER_BATCH
from txstore.testing.real_kafka import (
    KafkaJarsUnavailable,
    KafkaStartFailed,
    RealKafkaCluster,
    kafka_jars,
    make_certificates,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def high_watermarks(kafka: RealKafkaCluster, topic: str, partitions: int) -> dict[int, int]:
    """The read-uncommitted log ends (past open transactions), unlike :func:`log_ends`."""
    futures = kafka.admin().list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},  # type: ignore[no-untyped-call]
        isolation_level=IsolationLevel.READ_UNCOMMITTED,
        request_timeout=10,
    )
    return {tp.partition: f.result(10).offset for tp, f in futures.items()}


# -- the broker module ----------------------------------------------------------------------


def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """A ``mvn`` running ``script`` (sh), alone on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mvn"
    fake.write_text(f"#!/bin/sh\n{script}")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return fake


def test_without_maven_and_cached_jars_the_jars_are_unavailable_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TXSTORE_KAFKA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(KafkaJarsUnavailable) as raised:
        kafka_jars("4.1.2")
    message = str(raised.value)
    assert "\n" not in message
    assert message == (
        "Kafka 4.1.2's jars (org.apache.kafka:kafka_2.13:4.1.2) are not in "
        f"{tmp_path / 'cache' / 'kafka-4.1.2' / 'libs'} and Maven (mvn) is not on PATH to fetch them; "
        "install it (apt-get install maven)"
    )


def test_a_failing_maven_gives_its_first_error_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline: Maven's own error line, without its colours or help pointer."""
    fake_mvn(
        tmp_path,
        monkeypatch,
        "printf '\\033[0m[ERROR] Failed to execute goal on project kafka-broker: Could not resolve "
        "dependencies: Cannot access central in offline mode -> [Help 1]\\n[ERROR] \\n'\n"
        "exit 1\n",
    )
    monkeypatch.setenv("TXSTORE_KAFKA_CACHE", str(tmp_path / "cache"))
    with pytest.raises(KafkaJarsUnavailable) as raised:
        kafka_jars("4.1.2")
    log = tmp_path / "cache" / "kafka-4.1.2" / "mvn.log"
    assert str(raised.value) == (
        "Maven could not fetch Kafka 4.1.2's jars (org.apache.kafka:kafka_2.13:4.1.2) (exit 1, output in "
        f"{log}): Failed to execute goal on project kafka-broker: Could not resolve dependencies: "
        "Cannot access central in offline mode"
    )
    assert not (tmp_path / "cache" / "kafka-4.1.2" / "libs").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("ci", "outcome"), [("", "1 skipped"), ("true", "1 error")])
def test_the_fixture_skips_without_jars_but_fails_in_ci(tmp_path: Path, ci: str, outcome: str) -> None:
    env = {
        **os.environ,
        "TXSTORE_KAFKA_CACHE": str(tmp_path / "cache"),
        "PATH": str(tmp_path / "empty"),
        "CI": ci,
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rsf",
            "tests/kafka/test_real_kafka.py::test_the_broker_answers_metadata_with_its_version_and_topic_ids",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outcome in done.stdout, done.stdout + done.stderr
    assert "Maven (mvn) is not on PATH" in done.stdout


def test_a_broker_that_cannot_start_names_its_log_and_its_last_lines() -> None:
    with pytest.raises(KafkaStartFailed) as raised:
        RealKafkaCluster(broker_config={"num.io.threads": "many"}, start_timeout=60)
    message = str(raised.value)
    first, _, tail = message.partition("\n")
    log = Path(first.rsplit("; log ", 1)[-1].removesuffix(":"))
    try:
        assert log.name == "kafka.log" and log.exists()
        assert "num.io.threads" in tail  # Kafka's own complaint, from the log's last lines
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)  # kept for reading after a failed start


def test_without_openssl_a_sasl_ssl_listener_cannot_be_made_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(KafkaStartFailed) as raised:
        make_certificates(tmp_path / "tls")
    assert str(raised.value) == "a SASL_SSL listener needs openssl on PATH (apt-get install openssl)"


def test_the_certificates_made_for_the_sasl_ssl_listener_name_127_0_0_1_and_chain_to_their_ca(
    tmp_path: Path,
) -> None:
    ca, keystore = make_certificates(tmp_path / "tls")
    text = keystore.read_text()
    assert text.startswith("-----BEGIN PRIVATE KEY-----")  # unencrypted PKCS#8, as a PEM keystore takes
    assert text.count("-----BEGIN CERTIFICATE-----") == 2
    broker = tmp_path / "tls" / "broker.pem"
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(ca), "-verify_ip", "127.0.0.1", str(broker)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_broker_answers_metadata_with_its_version_and_topic_ids(
    real_kafka: RealKafkaCluster, new_real_topic: Callable[..., str]
) -> None:
    assert real_kafka.start_seconds is not None and real_kafka.start_seconds < 60
    print(f"real Kafka {real_kafka.version} started in {real_kafka.start_seconds:.1f} s")
    topic = new_real_topic(3)
    produce(real_kafka.bootstrap_servers, topic, {0: 2, 1: 1})
    assert log_ends(real_kafka, topic) == {0: 2, 1: 1, 2: 0}
    ids = fetch_topic_ids(client_config(real_kafka.bootstrap_servers), [topic])
    assert len(ids[topic]) == 22  # a real topic ID (the mock has none)


# -- count_topic on real Kafka --------------------------------------------------------------


def per_topic(frame: Any) -> Any:
    """count_topic's totals as a DataFrame aggregate (SQL text: classic and Connect alike)."""
    return frame.groupBy("topic").count().selectExpr("topic", "`count` AS metric")


def counting_job(
    spark: Any, kafka: RealKafkaCluster, database_url: str, topic: str, kind: str
) -> TransactionalJob:
    """count_topic's job, with the Python aggregate or the DataFrame one (read by Spark tasks through
    txstore's data source, the range's last message read first by the driver)."""
    if kind == "python":
        return job_for(spark, kafka, database_url, topic)
    settings = JobSettings("count_topic", (topic,), kafka.bootstrap_servers, database_url)
    return TransactionalJob(spark, settings, dataframe_aggregate=per_topic)


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["python", "dataframe"])
def test_committed_transactions_count_and_aborted_ones_and_markers_never_do(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
    kind: str,
) -> None:
    """Two transactional producers and a plain one interleave in the same partitions; some
    transactions commit, some abort. Over two runs the counts are exactly the committed and
    plain messages, and each partition's offset ends past its markers and aborted messages."""
    topic = real_counting.new_topic(3)
    a, b = transactional(real_kafka, f"a-{topic}"), transactional(real_kafka, f"b-{topic}")
    expected = 0

    # Run 1: a and b open at once on partition 0, with plain messages between their batches.
    a.begin_transaction()
    b.begin_transaction()
    in_transaction(a, topic, {0: 5, 1: 3}, b"a1")
    in_transaction(b, topic, {0: 4, 2: 2}, b"b1")
    real_counting.produce(topic, {0: 2, 1: 1})
    in_transaction(a, topic, {0: 3, 2: 6}, b"a1")
    b.commit_transaction(TX_TIMEOUT)
    a.abort_transaction(TX_TIMEOUT)
    expected += 4 + 2 + (2 + 1)
    a.begin_transaction()
    in_transaction(a, topic, {1: 7, 2: 1}, b"a2")
    a.commit_transaction(TX_TIMEOUT)
    expected += 7 + 1
    report = counting_job(
        real_counting.spark, real_kafka, real_counting.database_url, topic, kind
    ).run_batch()
    if kind == "python":  # a DataFrame job reports offsets, not messages (see below)
        assert report.messages == expected
    assert real_counting.totals(topic) == {topic: expected}
    assert (
        real_counting.offsets(topic) == real_counting.log_ends(topic) == high_watermarks(real_kafka, topic, 3)
    )

    # Run 2: the log ends on an aborted transaction on every partition.
    b.begin_transaction()
    in_transaction(b, topic, {0: 1, 1: 1, 2: 1}, b"b2")
    b.commit_transaction(TX_TIMEOUT)
    real_counting.produce(topic, {2: 3})
    expected += 3 + 3
    a.begin_transaction()
    in_transaction(a, topic, {0: 10, 1: 10, 2: 10}, b"a3")
    a.abort_transaction(TX_TIMEOUT)
    report = counting_job(
        real_counting.spark, real_kafka, real_counting.database_url, topic, kind
    ).run_batch()
    if kind == "python":
        assert report.messages == 6
    assert real_counting.totals(topic) == {topic: expected}
    ends = real_counting.log_ends(topic)
    assert real_counting.offsets(topic) == ends
    assert sum(ends.values()) > expected + 30  # aborted messages and markers take offsets


REPORTED = {
    "dataframe, counted in the tasks": "dataframe",  # a count grouped by topic: pushed down
    "dataframe, counted by Spark": "dataframe",  # the same query run as written
    "dataframe, pieces": "dataframe",  # ranges cut into more Spark tasks than partitions
    "results table, counted in the tasks": "results table",
    "results table, a row per message": "results table",  # a narrow query: no Spark shuffle
}


@pytest.mark.spark
@pytest.mark.parametrize("path", list(REPORTED))
def test_a_dataframe_job_reports_the_messages_it_counted_not_the_offsets_it_passed(
    any_spark: Any,
    real_kafka: RealKafkaCluster,
    database_url: str,
    db: psycopg.Connection,
    new_real_topic: Callable[..., str],
    path: str,
) -> None:
    """Transaction markers and aborted messages take offsets but are no messages: the batch's
    report (its log line and ``txstore_messages``) gives each range's messages as the reading
    tasks counted them, on classic Spark (an accumulator) and Spark Connect (observed), whatever
    the query does with the rows."""
    topic = new_real_topic(2)
    producer = transactional(real_kafka, f"report-{topic}")
    producer.begin_transaction()
    in_transaction(producer, topic, {0: 3, 1: 4})
    producer.commit_transaction(TX_TIMEOUT)  # partition 0: offsets 0-2, the marker at 3
    producer.begin_transaction()
    in_transaction(producer, topic, {0: 5, 1: 2})
    producer.abort_transaction(TX_TIMEOUT)  # partition 0: offsets 4-8, the marker at 9
    produce(real_kafka.bootstrap_servers, topic, {1: 6})
    push_down = "counted in the tasks" in path
    settings = JobSettings(
        "reported",
        (topic,),
        real_kafka.bootstrap_servers,
        database_url,
        commit=PER_BATCH,
        min_partitions=5 if path == "dataframe, pieces" else None,
    )
    if REPORTED[path] == "dataframe":
        job = TransactionalJob(any_spark, settings, dataframe_aggregate=per_topic, push_down_counts=push_down)
    else:
        db.execute("CREATE TABLE reported (topic text PRIMARY KEY, messages bigint NOT NULL)")
        db.commit()
        query = (
            (lambda frame: frame.groupBy("topic").count().selectExpr("topic", "`count` AS messages"))
            if push_down
            else (lambda frame: frame.selectExpr("topic", "CAST(1 AS BIGINT) AS messages"))
        )
        table = ResultsTable("reported", ("topic",), (("messages", "sum"),))
        job = TransactionalJob(any_spark, settings, dataframe_aggregate=query, results_table=table)
    job.check_query()
    assert (job.pushdown is not None) == push_down
    report = job.run_batch()
    assert [(r.range.partition, r.range.size, r.messages) for r in report.ranges] == [(0, 10, 3), (1, 14, 10)]
    assert report.messages == 13
    if REPORTED[path] == "dataframe":
        assert totals(db, topic, job="reported") == {topic: 13}
    else:
        assert db.execute("SELECT topic, messages FROM reported").fetchall() == [(topic, 13)]


@pytest.mark.spark
@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_an_open_transaction_stops_planning_at_the_last_stable_offset_and_its_range_waits(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
    outcome: str,
) -> None:
    topic = real_counting.new_topic(2)
    real_counting.produce(topic, {0: 3, 1: 2})
    open_tx = transactional(real_kafka, f"open-{topic}")
    open_tx.begin_transaction()
    in_transaction(open_tx, topic, {0: 4})  # offsets 3-6 of partition 0
    real_counting.produce(topic, {0: 2, 1: 3})  # plain, after it: 7-8, above the last stable offset
    assert high_watermarks(real_kafka, topic, 2) == {0: 9, 1: 5}
    assert real_counting.log_ends(topic) == {0: 3, 1: 5}  # read-committed: the last stable offset

    job = real_counting.job(topic)
    planned = job.plan()
    assert [(r.partition, r.from_offset, r.until_offset) for r in planned] == [(0, 0, 3), (1, 0, 5)]
    job.execute(planned)
    assert real_counting.totals(topic) == {topic: 8}
    assert real_counting.offsets(topic) == {0: 3, 1: 5}
    assert real_counting.job(topic).run_batch().ranges == ()  # waits, skips nothing

    if outcome == "commit":
        open_tx.commit_transaction(TX_TIMEOUT)
    else:
        open_tx.abort_transaction(TX_TIMEOUT)
    report = real_counting.job(topic).run_batch()
    assert [(r.range.partition, r.range.from_offset, r.range.until_offset) for r in report.ranges] == [
        (0, 3, 10)  # the marker at 9
    ]
    assert report.messages == (4 + 2 if outcome == "commit" else 2)
    assert real_counting.totals(topic) == {topic: 8 + report.messages}
    assert real_counting.offsets(topic) == real_counting.log_ends(topic) == {0: 10, 1: 5}


# -- time -----------------------------------------------------------------------------------


def send_create_times_out_of_order(bootstrap: str, topic: str) -> None:
    """Partition 0: CreateTimes 5, 1, 9, 3 and 20 s after T0, in that offset order; partition 1:
    four at 0-3 s (all before 6 s); partition 2: two a minute after T0."""
    out_of_order = [5, 1, 9, 3, 20]  # seconds after T0, in partition 0's offset order
    send(bootstrap, topic, [(0, b"k", b"v%d" % s, T0 + s * 1000) for s in out_of_order])
    send(bootstrap, topic, [(1, b"k", b"early", T0 + s * 1000) for s in range(4)])  # all before 6 s
    send(bootstrap, topic, [(2, b"k", b"late", T0 + 60_000 + s) for s in range(2)])


@pytest.mark.spark
def test_a_starting_timestamp_starts_at_the_first_message_at_or_after_it_with_create_times_out_of_order(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    topic = real_counting.new_topic(3)
    bootstrap = real_kafka.bootstrap_servers
    send_create_times_out_of_order(bootstrap, topic)
    conf = client_config(bootstrap)
    lookups = {
        s: offsets_for_timestamp(conf, [(topic, 0)], T0 + s * 1000)[(topic, 0)] for s in (0, 4, 6, 10, 21)
    }
    # Kafka's answer: the first offset whose timestamp is at or after the one asked.
    assert lookups == {0: 0, 4: 0, 6: 2, 10: 4, 21: -1}

    starting = StartingOffsets(timestamp_ms=T0 + 6_000)
    report = real_counting.job(topic, starting_offsets=starting).run_batch()
    # Partition 0 from offset 2 (9 s), counting offset 3 (3 s) after it, as Kafka's order has it;
    # partition 1 has no message that late and starts at its end; partition 2 from its start.
    assert sorted((r.range.partition, r.range.from_offset, r.messages) for r in report.ranges) == [
        (0, 2, 3),
        (2, 0, 2),
    ]
    assert real_counting.offsets(topic) == real_counting.log_ends(topic) == {0: 5, 1: 4, 2: 2}

    send(bootstrap, topic, [(1, b"k", b"new", T0)])  # an old CreateTime, yet new: counted
    real_counting.job(topic, starting_offsets=starting).run_batch()
    assert real_counting.totals(topic) == {topic: 3 + 2 + 1}


@pytest.mark.spark
def test_a_starting_timestamp_past_the_end_starts_every_partition_at_its_end(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    topic = real_counting.new_topic(2)
    bootstrap = real_kafka.bootstrap_servers
    send(bootstrap, topic, [(p, b"k", b"old", T0 + i) for p in range(2) for i in range(5)])
    future = StartingOffsets(timestamp_ms=int(time.time() * 1000) + 86_400_000)
    assert offsets_for_timestamp(
        client_config(bootstrap), [(topic, 0), (topic, 1)], future.timestamp_ms or 0
    ) == {
        (topic, 0): -1,
        (topic, 1): -1,
    }
    assert real_counting.job(topic, starting_offsets=future).run_batch().ranges == ()
    assert real_counting.offsets(topic) == {0: 5, 1: 5}
    real_counting.produce(topic, {0: 2, 1: 1})
    real_counting.job(topic, starting_offsets=future).run_batch()
    assert real_counting.totals(topic) == {topic: 3}


@pytest.mark.spark
def test_a_starting_timestamp_inside_an_open_transaction_starts_at_the_last_stable_offset(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """Kafka's lookup is read-uncommitted: it answers past the last stable offset. The job
    starts at the last stable offset instead, and counts the transaction once it commits."""
    topic = real_counting.new_topic(1)
    bootstrap = real_kafka.bootstrap_servers
    send(bootstrap, topic, [(0, b"k", b"before", T0 + i) for i in range(3)])  # offsets 0-2
    open_tx = transactional(real_kafka, f"ts-{topic}")
    open_tx.begin_transaction()
    for i in range(2):  # offsets 3-4, older than the timestamp asked
        open_tx.produce(topic, value=b"tx", key=b"k", partition=0, timestamp=T0 + i)
    assert open_tx.flush(TX_TIMEOUT) == 0
    send(bootstrap, topic, [(0, b"k", b"after", T0 + 10_000)])  # offset 5, above the last stable offset
    assert offsets_for_timestamp(client_config(bootstrap), [(topic, 0)], T0 + 10_000) == {(topic, 0): 5}

    starting = StartingOffsets(timestamp_ms=T0 + 10_000)
    assert real_counting.job(topic, starting_offsets=starting).run_batch().ranges == ()
    assert real_counting.offsets(topic) == {0: 3}
    open_tx.commit_transaction(TX_TIMEOUT)
    report = real_counting.job(topic, starting_offsets=starting).run_batch()
    assert report.messages == 2 + 1
    assert real_counting.offsets(topic) == real_counting.log_ends(topic) == {0: 7}


def reset_plan(database_url: str, kafka: RealKafkaCluster, topic: str, when: str) -> dict[int, int | None]:
    """Where ``txstore reset --to-datetime WHEN`` would move each partition (nothing changed)."""
    target = ResetTarget("datetime", parse_timestamp(when, "--to-datetime"))
    with connect(database_url) as conn:
        moves = plan_job_reset(
            conn, client_config(kafka.bootstrap_servers), "count_topic", topic, None, target
        )
    return {m.partition: m.new for m in moves}


@pytest.mark.spark
def test_a_reset_to_a_datetime_moves_to_kafkas_first_offset_at_or_after_it_with_create_times_out_of_order(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """``txstore reset --to-datetime`` on Kafka's own offsets-for-times: the first offset whose
    producer-set CreateTime is at or after the time, in offset order (earlier timestamps after it
    are read again too); a partition with no message that late goes to its log end, applied
    without --force, since Kafka does answer time lookups there; a time past every message moves
    every partition to its log end."""
    topic = real_counting.new_topic(3, prefix="reset-time")
    bootstrap = real_kafka.bootstrap_servers
    send_create_times_out_of_order(bootstrap, topic)
    real_counting.job(topic).run_batch()
    assert real_counting.offsets(topic) == {0: 5, 1: 4, 2: 2}

    # To the millisecond: 9 s exactly is offset 2; a time between two milliseconds is the later one;
    # a millisecond later is the next message at or after it, offset 4 (20 s).
    assert reset_plan(real_counting.database_url, real_kafka, topic, "2026-01-01T00:00:09Z")[0] == 2
    assert reset_plan(real_counting.database_url, real_kafka, topic, "2026-01-01T00:00:08.9995Z")[0] == 2
    assert reset_plan(real_counting.database_url, real_kafka, topic, "2026-01-01T05:30:09.001+05:30")[0] == 4
    assert reset_plan(real_counting.database_url, real_kafka, topic, str(T0 + 1000)) == {0: 0, 1: 1, 2: 0}

    to_6s = ("reset", "--job", "count_topic", "--topic", topic, "--to-datetime", "2026-01-01T00:00:06Z")
    dry_run = txstore(*to_6s, url=real_counting.database_url, kafka=real_kafka)
    assert (dry_run.returncode, dry_run.stderr) == (0, "")
    assert dry_run.stdout.splitlines()[1:] == [
        f"  {topic}/0: 5 -> 2 (--to-datetime 2026-01-01T00:00:06Z; 3 messages will be counted again)",
        f"  {topic}/1: 4 -> 4 (--to-datetime 2026-01-01T00:00:06Z; unchanged)",
        f"  {topic}/2: 2 -> 0 (--to-datetime 2026-01-01T00:00:06Z; 2 messages will be counted again)",
        "dry run: nothing was changed; add --execute to apply this plan",
    ]
    applied = txstore(*to_6s, "--execute", url=real_counting.database_url, kafka=real_kafka)
    assert (applied.returncode, applied.stderr) == (0, "")
    assert real_counting.offsets(topic) == {0: 2, 1: 4, 2: 0}
    report = real_counting.job(topic).run_batch()
    assert sorted((r.range.partition, r.range.from_offset, r.messages) for r in report.ranges) == [
        (0, 2, 3),
        (2, 0, 2),
    ]
    conf = client_config(bootstrap)

    past_the_end = (
        "reset",
        "--job",
        "count_topic",
        "--topic",
        topic,
        "--to-datetime",
        "2099-01-01T00:00:00Z",
    )
    # back to 1 s first, so that past the end moves each partition
    with connect(real_counting.database_url) as conn:
        target = ResetTarget("datetime", T0 + 1000)
        apply_reset(conn, "count_topic", plan_job_reset(conn, conf, "count_topic", topic, None, target))
    assert real_counting.offsets(topic) == {0: 0, 1: 1, 2: 0}
    dry_run = txstore(*past_the_end, url=real_counting.database_url, kafka=real_kafka)
    assert (dry_run.returncode, dry_run.stderr) == (0, "")  # no warning: Kafka answers time lookups
    assert dry_run.stdout.splitlines()[1:4] == [
        f"  {topic}/0: 0 -> 5 (--to-datetime 2099-01-01T00:00:00Z; 5 messages will be skipped)",
        f"  {topic}/1: 1 -> 4 (--to-datetime 2099-01-01T00:00:00Z; 3 messages will be skipped)",
        f"  {topic}/2: 0 -> 2 (--to-datetime 2099-01-01T00:00:00Z; 2 messages will be skipped)",
    ]
    applied = txstore(*past_the_end, "--execute", url=real_counting.database_url, kafka=real_kafka)
    assert (applied.returncode, applied.stderr) == (0, "")
    assert real_counting.offsets(topic) == real_counting.log_ends(topic) == {0: 5, 1: 4, 2: 2}


# -- topic IDs ------------------------------------------------------------------------------


@pytest.mark.spark
def test_a_recreated_topic_with_the_same_messages_is_known_by_its_real_topic_id(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """Deleted and recreated with byte-identical messages (and timestamps): only the topic ID tells."""
    topic = real_counting.new_topic(1, prefix="ids")
    bootstrap = real_kafka.bootstrap_servers
    same = [(0, b"k", b"same-%d" % i, T0 + i) for i in range(3)]
    send(bootstrap, topic, same)
    real_counting.job(topic).run()
    old_id = fetch_topic_ids(client_config(bootstrap), [topic])[topic]
    stored = real_counting.db.execute("SELECT off, last_off, topic_id FROM txn_offsets").fetchone()
    assert stored == (3, 2, old_id)

    real_kafka.recreate_topic(topic, 1)
    send(bootstrap, topic, [*same, *same])
    new_id = fetch_topic_ids(client_config(bootstrap), [topic])[topic]
    assert new_id != old_id
    before = snapshot(real_counting.db)
    with pytest.raises(TopicRecreated) as raised:
        real_counting.job(topic).run()
    assert str(raised.value) == topic_id_changed_line(topic, old_id, new_id)
    assert snapshot(real_counting.db) == before

    with connect(real_counting.database_url) as conn:
        moves = plan_job_reset(
            conn, client_config(bootstrap), "count_topic", topic, [0], ResetTarget("earliest")
        )
        apply_reset(conn, "count_topic", moves)
    real_counting.job(topic).run()
    assert real_counting.totals(topic) == {topic: 3 + 6}
    stored = real_counting.db.execute("SELECT off, generation, topic_id FROM txn_offsets").fetchone()
    assert stored == (6, 1, new_id)


# -- the consumer-group mirror ----------------------------------------------------------------


def group_view(
    kafka: RealKafkaCluster, group: str, topic: str, partitions: int
) -> dict[int, tuple[int, int]]:
    """What ``kafka-consumer-groups --describe --group G`` shows, asked the way it asks: the group's
    committed offsets (OffsetFetch, ``list_consumer_group_offsets``) and each partition's log end
    (ListOffsets latest, read-uncommitted): ``{partition: (current offset, lag)}`` for the
    partitions the group has an offset for."""
    futures = kafka.admin().list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])],
        request_timeout=10,
    )
    committed = {
        tp.partition: tp.offset for tp in futures[group].result(10).topic_partitions if tp.offset >= 0
    }
    ends = high_watermarks(kafka, topic, partitions)
    return {p: (o, ends[p] - o) for p, o in committed.items()}


def job_lag(database_url: str, kafka: RealKafkaCluster, job: str) -> dict[int, tuple[int, int]]:
    """``txstore status``: each stored partition's offset and lag."""
    with connect(database_url) as conn:
        rows, problem = status(conn, client_config(kafka.bootstrap_servers), job)
    assert problem is None
    return {r.partition: (r.offset, r.lag) for r in rows if r.offset is not None and r.lag is not None}


@pytest.mark.spark
def test_the_mirrored_group_offsets_read_back_by_kafka_admin_give_kafka_tools_the_jobs_own_lag(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """--commit-to-kafka-group: after each batch Kafka's own admin API reads back the offsets
    stored in PostgreSQL, and the lag Kafka's tools compute from them (log end minus committed)
    is the lag txstore status shows, also past transaction markers and while the job is behind;
    only an open transaction's messages are lag to the tools and not to the job."""
    topic = real_counting.new_topic(3, prefix="mirror")
    group = f"mirror-{topic}"
    real_counting.produce(topic, {0: 40, 1: 25, 2: 3})
    producer = transactional(real_kafka, f"mirror-{topic}")
    producer.begin_transaction()
    in_transaction(producer, topic, {1: 4, 2: 2})
    producer.commit_transaction(TX_TIMEOUT)  # a marker ends partitions 1 and 2
    with real_counting.job(topic, commit_to_kafka_group=group, max_offsets_per_batch=30) as job:
        job.run_batch()  # behind: about 30 of the 76 offsets
        behind = job_lag(real_counting.database_url, real_kafka, "count_topic")
        assert 76 - 30 <= sum(lag for _, lag in behind.values()) < 76
        assert group_view(real_kafka, group, topic, 3) == behind
        while job.run_batch().ranges:
            pass
        caught_up = job_lag(real_counting.database_url, real_kafka, "count_topic")
        assert caught_up == {0: (40, 0), 1: (30, 0), 2: (6, 0)}
        assert group_view(real_kafka, group, topic, 3) == caught_up
        real_counting.produce(topic, {2: 5})  # new messages: both see the same lag before the next batch
        assert group_view(real_kafka, group, topic, 3) == job_lag(
            real_counting.database_url, real_kafka, "count_topic"
        )
        assert group_view(real_kafka, group, topic, 3)[2] == (6, 5)
        job.run_batch()
        # An open transaction: its messages are lag to Kafka's tools (the high watermark), not to
        # the job, which reads to the last stable offset and counts them once they commit.
        producer.begin_transaction()
        in_transaction(producer, topic, {0: 4})
        assert job_lag(real_counting.database_url, real_kafka, "count_topic")[0] == (40, 0)
        assert group_view(real_kafka, group, topic, 3)[0] == (40, 4)
        producer.abort_transaction(TX_TIMEOUT)
    assert real_counting.totals(topic) == {topic: 40 + 25 + 3 + 6 + 5}


@pytest.mark.spark
def test_the_mirror_gives_kafka_tools_every_partition_the_job_stores_also_those_it_started_at_latest(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """A job started at ``latest`` stores each partition's log end without counting a range there;
    an empty partition stores 0. Kafka's tools must see those offsets too (lag 0), not a partition
    with no committed offset (``-``, which lag monitors read as unknown or as the whole log)."""
    topic = real_counting.new_topic(3, prefix="mirror-latest")
    group = f"mirror-{topic}"
    real_counting.produce(topic, {0: 8, 1: 2})
    with job_for(
        real_counting.spark,
        real_kafka,
        real_counting.database_url,
        topic,
        commit_to_kafka_group=group,
        starting_offsets=parse_starting_offsets("latest"),
    ) as job:
        assert job.run_batch().ranges == ()
        assert job_lag(real_counting.database_url, real_kafka, "count_topic") == {
            0: (8, 0),
            1: (2, 0),
            2: (0, 0),
        }
        assert group_view(real_kafka, group, topic, 3) == {0: (8, 0), 1: (2, 0), 2: (0, 0)}
        real_counting.produce(topic, {1: 3})
        job.run_batch()
        assert group_view(real_kafka, group, topic, 3) == {0: (8, 0), 1: (5, 0), 2: (0, 0)}
    assert real_counting.totals(topic) == {topic: 3}


# -- kill and restart (last: they restart the session's broker) ------------------------------


@pytest.mark.spark
def test_right_after_a_killed_broker_restarts_watermarks_and_a_job_wait_for_the_partitions_leaders(
    real_counting: Counting,
    real_kafka: RealKafkaCluster,
) -> None:
    """The broker answers metadata (with the partitions' new leader epochs) a moment before its
    partitions take them up; meanwhile ListOffsets answers UNKNOWN_LEADER_EPOCH. Planning waits
    for it within its timeout rather than failing the batch (and saying Kafka did not answer)."""
    topic = real_counting.new_topic(32)
    bootstrap = real_kafka.bootstrap_servers
    counts = {p: 1 + p % 3 for p in range(32)}
    real_counting.produce(topic, counts)
    kept = Watermarks()  # a running job's admin client, from before the restart
    assert {w.partition: w.high for w in kept(client_config(bootstrap), [topic])} == counts
    address, pid = bootstrap, real_kafka.pid
    real_kafka.kill()
    assert not real_kafka.running() and real_kafka.pid is None
    real_kafka.restart()
    assert real_kafka.bootstrap_servers == address and real_kafka.pid not in (None, pid)
    assert real_kafka.start_seconds is not None and real_kafka.start_seconds < 60
    print(f"real Kafka restarted after SIGKILL in {real_kafka.start_seconds:.1f} s")
    assert {w.partition: w.high for w in kept(client_config(bootstrap), [topic])} == counts
    assert real_counting.log_ends(topic) == counts  # a new admin client
    real_counting.job(topic).run()  # --once
    assert real_counting.totals(topic) == {topic: sum(counts.values())}


def test_an_artifact_maven_central_does_not_have_is_told_apart_from_a_failed_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txstore.testing.real_kafka import maven_dependencies

    fake = fake_mvn(
        tmp_path,
        monkeypatch,
        "echo '[ERROR] Failed to execute goal on project p: Could not resolve dependencies: "
        "Could not find artifact org.example:nothing:jar:9.9 in central'\nexit 1\n",
    )
    with pytest.raises(KafkaJarsUnavailable) as raised:
        maven_dependencies(tmp_path / "home", "<project/>", "org.example:nothing:9.9", "nothing-", 30)
    assert raised.value.not_published
    assert "Could not find artifact org.example:nothing:jar:9.9" in str(raised.value)
    fake.write_text("#!/bin/sh\necho '[ERROR] Cannot access central in offline mode'\nexit 1\n")
    with pytest.raises(KafkaJarsUnavailable) as offline:
        maven_dependencies(tmp_path / "home", "<project/>", "org.example:nothing:9.9", "nothing-", 30)
    assert not offline.value.not_published
