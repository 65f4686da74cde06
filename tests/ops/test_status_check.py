"""`txstore status --check`: each status judged from what is known (pure), and on real jobs in that state.

Real PostgreSQL, Spark and the mock broker for the jobs; a job is running while its
driver connection holds the job lock (a TransactionalJob until it is closed).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from tests.conftest import produce, send
from tests.helpers.cli import txstore
from tests.helpers.counting import Counting, job_for
from tests.helpers.recreated import NEW_TS, OLD_TS, fill, mismatch_line
from txstore.core import health
from txstore.core.fingerprint import Fingerprint
from txstore.core.health import ERR, OK, STALL, STOP, UNKNOWN, WARN, PartitionFacts, evaluate, exit_code
from txstore.core.ranges import OffsetRange, PartitionHistory, PartitionWatermarks
from txstore.core.results import TOPIC_TOTAL
from txstore.core.starting import StartDecision
from txstore.kafka.client_settings import client_config
from txstore.ops.health_facts import health_facts
from txstore.ops.reset import apply_reset
from txstore.ops.reset_plan import ResetMove
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.idempotent import IdempotentSink
from txstore.postgres.locks import hold_job_lock
from txstore.postgres.sink import TransactionalSink
from txstore.testing.mock_kafka import MockKafkaCluster

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def facts(offset: int = 10, low: int = 0, high: int = 10, **more: Any) -> PartitionFacts:
    """Partition 0 of topic 't' of job 'j', committed a minute ago, running, Kafka at [low, high)."""
    values: dict[str, Any] = {
        "last_commit": NOW - timedelta(minutes=1),
        "running": True,
        "watermarks": PartitionWatermarks("t", 0, low, high),
        **more,
    }
    return PartitionFacts("j", "t", 0, offset, **values)


# -- the rules, without servers ------------------------------------------------------------------


def test_no_lag_is_ok_whether_or_not_the_job_runs_and_however_long_ago_it_committed() -> None:
    for running in (True, False):
        result = evaluate(facts(running=running, last_commit=NOW - timedelta(days=3)), NOW)
        assert (result.status, result.lag, result.reason) == (OK, 0, "")
    assert exit_code([evaluate(facts(), NOW)]) == 0


def test_lag_with_no_instance_running_is_stop() -> None:
    result = evaluate(facts(offset=4, running=False), NOW)
    assert result.status == STOP
    assert result.reason == (
        "job 'j' topic 't' partition 0: lag 6 and no instance of the job is running "
        "(last commit 60s ago); start the job"
    )
    assert exit_code([result]) == 2


def test_lag_with_a_running_instance_but_no_commit_for_longer_than_stall_after_is_stall() -> None:
    recent = evaluate(facts(offset=4), NOW, stall_after=timedelta(minutes=5))
    assert recent.status == OK
    stalled = evaluate(facts(offset=4, last_commit=NOW - timedelta(minutes=6)), NOW)
    assert stalled.status == STALL
    assert stalled.reason.startswith(
        "job 'j' topic 't' partition 0: lag 6 and no commit for 360s (--stall-after 300s) "
        "although an instance holds the job lock"
    )
    assert evaluate(facts(offset=4), NOW, stall_after=timedelta(seconds=30)).status == STALL
    assert exit_code([recent, stalled]) == 2


def test_new_messages_after_an_idle_period_are_not_stall_until_they_have_waited_stall_after() -> None:
    """A healthy --interval job that committed everything, then sat idle for an hour: messages
    written 20 s ago are lag with an old last commit, yet its next batch will take them."""
    idle = NOW - timedelta(hours=1)
    fresh = evaluate(facts(offset=4, last_commit=idle, unread_since=NOW - timedelta(seconds=20)), NOW)
    assert (fresh.status, fresh.lag, fresh.seconds_since_commit, fresh.reason) == (OK, 6, 3600, "")
    # No batch took them for longer than --stall-after: the instance is stuck.
    waited = evaluate(facts(offset=4, last_commit=idle, unread_since=NOW - timedelta(minutes=6)), NOW)
    assert (waited.status, waited.reason) == (
        STALL,
        "job 'j' topic 't' partition 0: lag 6 and no commit for 3600s; the oldest message not counted "
        "was written 360s ago (--stall-after 300s) although an instance holds the job lock; read its "
        "log for the batch it is stuck in, or restart it",
    )
    assert exit_code([fresh]) == 0 and exit_code([waited]) == 2
    # Lag already there at the last commit (written before it): judged from the commit, as before.
    backlog = evaluate(
        facts(offset=4, last_commit=NOW - timedelta(minutes=6), unread_since=NOW - timedelta(hours=2)), NOW
    )
    assert backlog.status == STALL
    assert backlog.reason.startswith(
        "job 'j' topic 't' partition 0: lag 6 and no commit for 360s (--stall-after 300s) although"
    )
    # Not running is STOP however fresh the messages; no lag is OK however old the commit.
    assert evaluate(facts(offset=4, last_commit=idle, unread_since=NOW, running=False), NOW).status == STOP
    assert evaluate(facts(last_commit=idle, unread_since=NOW - timedelta(hours=2)), NOW).status == OK


def test_a_partition_with_messages_and_no_offset_row_is_judged_from_its_earliest_offset() -> None:
    """A partition the job has not started (the topic gained it, or came back with more): the
    job will read it from its log start, so that is its lag; no commit to measure from."""
    new = {"offset": None, "last_commit": None, "low": 2, "high": 7}
    stopped = evaluate(facts(**new, running=False), NOW)
    assert (stopped.status, stopped.offset, stopped.log_end, stopped.lag) == (STOP, None, 7, 5)
    assert (stopped.last_commit, stopped.seconds_since_commit) == (None, None)
    assert stopped.reason == (
        "job 'j' topic 't' partition 0: lag 5 and no instance of the job is running (no offset stored: "
        "a partition the job has not started; it starts at the earliest offset 2); start the job"
    )
    # Running: its messages wait for the job's next batch, STALL once longer than --stall-after.
    assert evaluate(facts(**new, unread_since=NOW - timedelta(seconds=20)), NOW).status == OK
    stalled = evaluate(facts(**new, unread_since=NOW - timedelta(minutes=6)), NOW)
    assert (stalled.status, stalled.reason) == (
        STALL,
        "job 'j' topic 't' partition 0: lag 5 and no offset stored (a partition the job has not "
        "started); the oldest message not counted was written 360s ago (--stall-after 300s) although "
        "an instance holds the job lock; read its log for the batch it is stuck in, or restart it",
    )
    # Without the first message's timestamp nothing says how long it waited: not STALL.
    assert evaluate(facts(**new), NOW).status == OK
    # A new partition with no messages (or none left) is OK, running or not.
    for running in (True, False):
        empty = evaluate(facts(offset=None, last_commit=None, low=3, high=3, running=running), NOW)
        assert (empty.status, empty.lag, empty.reason) == (OK, 0, "")
    assert exit_code([stopped, empty]) == 2 and exit_code([stalled]) == 2


def test_a_backlog_growing_at_each_of_the_last_commits_is_warn() -> None:
    assert evaluate(facts(offset=4, lag_samples=(3, 10, 12)), NOW).status == WARN
    warned = evaluate(facts(offset=4, lag_samples=(3, 10, 12, 14, 20)), NOW)
    assert warned.reason == (
        "job 'j' topic 't' partition 0: the backlog grew at each of the last 5 commits "
        "(3, 10, 12, 14, 20; lag now 6): the job falls behind; give it more executors, or a larger "
        "--max-offsets-per-batch"
    )
    assert exit_code([warned, evaluate(facts(), NOW)]) == 1
    # Too few samples, a sample no larger than the one before, or no lag now: not falling behind.
    for samples in ((), (5, 9), (3, 10, 10), (10, 3, 12), (12, 10, 3)):
        assert evaluate(facts(offset=4, lag_samples=samples), NOW).status == OK, samples
    assert evaluate(facts(lag_samples=(3, 10, 12)), NOW).status == OK


def test_an_offset_outside_the_log_or_a_recreated_log_is_err_with_planning_s_own_line() -> None:
    aged = evaluate(facts(offset=4, low=7, high=10), NOW)
    assert (aged.status, aged.reason) == (
        ERR,
        "job 'j' topic 't' partition 0: stored offset 4 is below the log-start offset 7; 3 messages "
        "aged out of Kafka before they were counted. To skip them and record the loss in "
        "txn_lost_ranges, rerun with --fail-on-data-loss false",
    )
    beyond = evaluate(facts(offset=12, running=False), NOW)
    assert beyond.status == ERR
    assert beyond.reason.startswith("job 'j' topic 't' partition 0: stored offset 12 is beyond the log-end")
    gone = evaluate(facts(watermarks=None), NOW)
    assert gone.status == ERR
    assert "Kafka no longer has this partition" in gone.reason
    other_id = evaluate(facts(history=PartitionHistory(0, "id-old"), topic_id="id-new"), NOW)
    assert other_id.status == ERR
    assert "(stored topic ID id-old; found topic ID id-new)" in other_id.reason
    last = Fingerprint(9, 1, "old")
    other_message = evaluate(
        facts(history=PartitionHistory(0, None, last), found=Fingerprint(9, 2, "new")), NOW
    )
    assert other_message.status == ERR
    assert "the topic was deleted and recreated (stored last counted message offset 9" in other_message.reason
    assert evaluate(facts(history=PartitionHistory(0, None, last), found=last), NOW).status == OK
    assert exit_code([aged, evaluate(facts(), NOW)]) == 2


def test_without_an_answer_from_kafka_the_status_is_unknown_and_the_exit_3() -> None:
    result = evaluate(
        facts(watermarks=None, kafka_problem="Kafka at k:9092 did not answer", running=False), NOW
    )
    assert (result.status, result.lag) == (UNKNOWN, None)
    assert result.reason == "job 'j' topic 't' partition 0: lag unknown: Kafka at k:9092 did not answer"
    assert exit_code([result, evaluate(facts(), NOW)]) == 3
    assert exit_code([result, evaluate(facts(offset=4, running=False), NOW)]) == 2
    assert exit_code([]) == 3
    assert health.summary([], "j") == "UNKNOWN: no stored offsets for job 'j'"


@pytest.mark.slow
def test_check_without_kafka_is_unknown_exit_3_and_of_a_job_never_seen_no_such_job_exit_4(
    database_url: str,
) -> None:
    result = txstore("status", "--job", "j", "--check", url=database_url)
    assert (result.returncode, result.stdout) == (
        4,
        "NO-SUCH-JOB: no job 'j' in the database (no jobs yet); check --job\n",
    )
    with connect(database_url) as conn:
        store.create_start_rows(conn, "j", [StartDecision("t", 0, 0, "test")])
    result = txstore(
        "status", "--job", "j", "--check", "--bootstrap-servers", "127.0.0.1:1", url=database_url
    )
    summary, line = lines_of(result, 3)
    assert summary == "UNKNOWN: job 'j': 1 UNKNOWN"
    assert line.startswith(
        "UNKNOWN job 'j' topic 't' partition 0: lag unknown: Kafka at 127.0.0.1:1 did not answer"
    )
    as_json = json.loads(
        txstore(
            "status",
            "--job",
            "j",
            "--check",
            "--json",
            "--bootstrap-servers",
            "127.0.0.1:1",
            url=database_url,
        ).stdout
    )
    assert (as_json["exit_code"], as_json["partitions"][0]["status"]) == (3, UNKNOWN)


# -- the lag samples, on real PostgreSQL -----------------------------------------------------------


def lag_samples(db: psycopg.Connection) -> dict[int, list[int]]:
    return dict(db.execute("SELECT part, lag_samples FROM txn_offsets ORDER BY part").fetchall())


def test_each_commit_records_the_backlog_its_range_started_from_keeping_the_last_five(
    database_url: str, db: psycopg.Connection
) -> None:
    with connect(database_url) as conn:
        store.create_start_rows(conn, "j", [StartDecision("t", p, 0, "test") for p in range(2)])
        sink = TransactionalSink(conn, "j")
        log_ends = (5, 9, 14, 20, 27, 35, 44)
        for i, end in enumerate(log_ends):  # 2 messages a range: backlogs 5, 7, 10, 14, 19, 25, 32
            sink.commit(OffsetRange("t", 0, 2 * i, 2 * i + 2, log_end=end), {TOPIC_TOTAL: 2})
        assert lag_samples(db) == {0: [10, 14, 19, 25, 32], 1: []}
        sink.commit(OffsetRange("t", 0, 14, 16), {TOPIC_TOTAL: 2})  # log end not known: kept as is
        assert lag_samples(db)[0] == [10, 14, 19, 25, 32]
        # Per-batch commits and the idempotent sink record theirs too.
        sink.commit_batch([OffsetRange("t", 0, 16, 18, log_end=60), OffsetRange("t", 1, 0, 3, log_end=3)], {})
        IdempotentSink(conn, "j").store(OffsetRange("t", 1, 3, 5, log_end=9), [[]])
        assert lag_samples(db) == {0: [14, 19, 25, 32, 44], 1: [3, 6]}
        # A reset moves the offset elsewhere: the old backlog says nothing about the new one.
        apply_reset(conn, "j", [ResetMove("t", 0, 18, 0)])
        assert lag_samples(db) == {0: [], 1: [3, 6]}


# -- real jobs ----------------------------------------------------------------------------------


def check(url: str, kafka: MockKafkaCluster, *more: str) -> subprocess.CompletedProcess[str]:
    return txstore("status", "--job", "count_topic", "--check", *more, url=url, kafka=kafka)


def lines_of(result: subprocess.CompletedProcess[str], exit_code: int) -> list[str]:
    """The lines a ``status --check`` printed, once it is known to have exited ``exit_code``."""
    assert result.returncode == exit_code, result.stderr
    return result.stdout.splitlines()


@pytest.mark.spark
def test_check_follows_a_job_caught_up_then_falling_behind_stalled_and_stopped(
    spark: Any, kafka: MockKafkaCluster, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    where = f"job 'count_topic' topic '{topic}' partition 0"
    produce(kafka.bootstrap_servers, topic, {0: 3})
    with job_for(spark, kafka, database_url, topic, max_offsets_per_batch=4) as job:
        job.run_batch()  # backlog 3, all counted
        result = check(database_url, kafka)
        assert (result.returncode, result.stdout, result.stderr) == (0, "OK: job 'count_topic': 1 OK\n", "")

        # More arrives before each batch than a batch may take: the backlog grows at each commit.
        for more in (10, 6, 6):
            produce(kafka.bootstrap_servers, topic, {0: more})
            job.run_batch()
        assert lines_of(check(database_url, kafka), 1) == [
            "WARNING: job 'count_topic': 1 WARN",
            f"WARN {where}: the backlog grew at each of the last 4 commits (3, 10, 12, 14; lag now 10): "
            "the job falls behind; give it more executors, or a larger --max-offsets-per-batch",
        ]

        # Running (the lock is held) with lag, and no commit for longer than --stall-after.
        time.sleep(1.2)
        summary, line = lines_of(check(database_url, kafka, "--stall-after", "1"), 2)
        assert summary == "CRITICAL: job 'count_topic': 1 STALL"
        assert re.fullmatch(
            rf"STALL {re.escape(where)}: lag 10 and no commit for \d+s \(--stall-after 1s\) although an "
            "instance holds the job lock; read its log for the batch it is stuck in, or restart it",
            line,
        ), line
        as_json = json.loads(check(database_url, kafka, "--stall-after", "1", "--json").stdout)
        assert (as_json["status"], as_json["exit_code"]) == ("CRITICAL", 2)
        [partition] = as_json["partitions"]
        assert {k: partition[k] for k in ("topic", "partition", "status", "offset", "log_end", "lag")} == {
            "topic": topic,
            "partition": 0,
            "status": STALL,
            "offset": 15,
            "log_end": 25,
            "lag": 10,
        }
        assert partition["running"] is True
        assert partition["lag_samples"] == [3, 10, 12, 14]
        assert partition["seconds_since_commit"] >= 1

    # The job is gone (its lock released) and the backlog waits.
    summary, line = lines_of(check(database_url, kafka), 2)
    assert summary == "CRITICAL: job 'count_topic': 1 STOP"
    assert re.fullmatch(
        rf"STOP {re.escape(where)}: lag 10 and no instance of the job is running \(last commit \d+s ago\); "
        "start the job",
        line,
    ), line
    as_json = json.loads(check(database_url, kafka, "--json").stdout)
    assert [(p["status"], p["running"], p["lag"]) for p in as_json["partitions"]] == [(STOP, False, 10)]

    # Caught up and stopped is fine.
    with job_for(spark, kafka, database_url, topic) as job:
        job.run_batch()
    result = check(database_url, kafka)
    assert (result.returncode, result.stdout) == (0, "OK: job 'count_topic': 1 OK\n")


def counted_then_recreated(counting: Counting, was: int, partitions: int, refill: dict[int, int]) -> str:
    """A topic of ``was`` partitions, 5 old messages each, counted by count_topic, then deleted and
    created again with ``partitions`` partitions and ``refill[p]`` new messages in partition ``p``."""
    kafka = counting.kafka
    topic = counting.new_topic(was)
    fill(kafka, topic, 5, was, b"old", OLD_TS)
    with counting.job(topic) as job:
        job.run_batch()
    kafka.recreate_topic(topic, partitions)
    for p, n in refill.items():
        send(kafka.bootstrap_servers, topic, ((p, b"k", b"new-%d-%d" % (p, i), NEW_TS + i) for i in range(n)))
    return topic


@pytest.mark.spark
def test_check_reports_a_recreated_topic_as_err_with_the_reset_to_run(counting: Counting) -> None:
    # Partition 0 refilled past the stored offset (another message at offset 4), partition 1 not as far.
    topic = counted_then_recreated(counting, 2, 2, {0: 8, 1: 3})
    assert lines_of(check(counting.database_url, counting.kafka), 2) == [
        "CRITICAL: job 'count_topic': 2 ERR",
        f"ERR {mismatch_line('count_topic', topic, 0, 4)}",
        f"ERR job 'count_topic' topic '{topic}' partition 1: stored offset 5 is beyond the log-end offset 3 "
        "(topic deleted and recreated, or an unclean leader election); to start over from its earliest "
        f"offset: txstore reset --job count_topic --topic {topic} --partition 1 --to-earliest --execute",
    ]
    as_json = json.loads(check(counting.database_url, counting.kafka, "--json").stdout)
    assert [(p["partition"], p["status"], p["offset"], p["log_end"]) for p in as_json["partitions"]] == [
        (0, ERR, 5, 8),
        (1, ERR, 5, 3),
    ]


@pytest.mark.spark
def test_check_reports_offsets_that_aged_out_before_they_were_counted_as_err(counting: Counting) -> None:
    topic = counting.new_topic(1)
    send(counting.kafka.bootstrap_servers, topic, ((0, b"k", b"x" * 100_000, None) for _ in range(3)))
    with counting.job(topic) as job:
        job.run_batch()
    send(counting.kafka.bootstrap_servers, topic, ((0, b"k", b"y" * 100_000, None) for _ in range(80)))
    summary, line = lines_of(check(counting.database_url, counting.kafka), 2)
    assert summary == "CRITICAL: job 'count_topic': 1 ERR"
    low = json.loads(check(counting.database_url, counting.kafka, "--json").stdout)["partitions"][0]
    assert low["offset"] == 3 and low["status"] == ERR
    match = re.fullmatch(
        rf"ERR job 'count_topic' topic '{re.escape(topic)}' partition 0: stored offset 3 is below the "
        r"log-start offset (\d+); (\d+) messages aged out of Kafka before they were counted\. To skip them "
        r"and record the loss in txn_lost_ranges, rerun with --fail-on-data-loss false",
        line,
    )
    assert match, line
    assert int(match[2]) == int(match[1]) - 3 > 0
    assert counting.db.execute("SELECT count(*) FROM txn_lost_ranges").fetchone() == (
        0,
    )  # the check changes nothing


@pytest.mark.spark
def test_a_running_job_idle_longer_than_stall_after_is_not_stall_when_new_messages_arrive(
    counting: Counting,
) -> None:
    """Issue 24: a healthy --interval job read STALL after an idle period, until its next batch.
    The check is run in the process right after the messages are written (the command's start-up
    could outlast --stall-after on a loaded machine); then through the command once stuck."""
    topic = counting.new_topic(1)
    where = f"job 'count_topic' topic '{topic}' partition 0"
    counting.produce(topic, {0: 3})
    stall_after = timedelta(seconds=3)
    with counting.job(topic) as job:
        job.run_batch()  # everything counted
        time.sleep(3.5)  # idle, with nothing new, for longer than --stall-after
        counting.produce(topic, {0: 4})
        found, now = health_facts(counting.db, client_config(counting.kafka.bootstrap_servers), "count_topic")
        [result] = [evaluate(f, now, stall_after) for f in found]
        assert (result.status, result.lag, result.running, result.reason) == (OK, 4, True, "")
        assert result.seconds_since_commit >= 3

        # No batch takes them: once they have waited longer than --stall-after, the job is stuck.
        time.sleep(3.5)
        summary, line = lines_of(check(counting.database_url, counting.kafka, "--stall-after", "3"), 2)
        assert summary == "CRITICAL: job 'count_topic': 1 STALL"
        assert re.fullmatch(
            rf"STALL {re.escape(where)}: lag 4 and no commit for \d+s; the oldest message not counted was "
            r"written \d+s ago \(--stall-after 3s\) although an instance holds the job lock; read its log "
            "for the batch it is stuck in, or restart it",
            line,
        ), line

        job.run_batch()
        result = check(counting.database_url, counting.kafka, "--stall-after", "3")
        assert (result.returncode, result.stdout) == (0, "OK: job 'count_topic': 1 OK\n")


@pytest.mark.slow
def test_check_and_status_include_partitions_kafka_has_but_the_job_never_started(
    database_url: str, db: psycopg.Connection, kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    """Issue 24: a stopped job whose topic gained partitions holding unread messages read OK.
    The rows are what a job leaves that last ran while the topic had only partition 0."""
    topic = new_topic(3)
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 4})
    with connect(database_url) as conn:
        store.create_start_rows(conn, "j", [StartDecision(topic, 0, 0, "test")])
        TransactionalSink(conn, "j").commit(OffsetRange(topic, 0, 0, 3, log_end=3), {TOPIC_TOTAL: 3})

    def check_j(*more: str) -> subprocess.CompletedProcess[str]:
        return txstore("status", "--job", "j", "--check", *more, url=database_url, kafka=kafka)

    assert lines_of(check_j(), 2) == [
        "CRITICAL: job 'j': 1 STOP, 2 OK",
        f"STOP job 'j' topic '{topic}' partition 1: lag 4 and no instance of the job is running (no "
        "offset stored: a partition the job has not started; it starts at the earliest offset 0); "
        "start the job",
    ]
    as_json = json.loads(check_j("--json").stdout)
    partitions = as_json["partitions"]
    assert [(p["partition"], p["status"], p["offset"], p["lag"]) for p in partitions] == [
        (0, OK, 3, 0),
        (1, STOP, None, 4),
        (2, OK, None, 0),
    ]
    assert [p["last_commit"] is None for p in partitions] == [False, True, True]

    # The plain status shows them too: no offset, generation or commit yet, lag from the log start.
    status = txstore("status", "--job", "j", url=database_url, kafka=kafka)
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()[1:]]
    assert rows[0][2:8] + rows[0][9:] == ["0", "3", "0", "0", "3", "0", "no", "0"]
    assert rows[0][8] != "never"
    assert [r[2:] for r in rows[1:]] == [
        ["1", "-", "-", "0", "4", "4", "never", "no", "0"],
        ["2", "-", "-", "0", "0", "0", "never", "no", "0"],
    ]
    as_json = json.loads(txstore("status", "--job", "j", "--json", url=database_url, kafka=kafka).stdout)
    assert [(r["partition"], r["offset"], r["generation"], r["lag"], r["last_commit"]) for r in as_json][
        1:
    ] == [
        (1, None, None, 4, None),
        (2, None, None, 0, None),
    ]

    # Running: the messages wait for the next batch, which creates the row; STALL once they have
    # waited longer than --stall-after with none.
    with connect(database_url) as job_connection:
        hold_job_lock(job_connection, "j")
        found, now = health_facts(db, client_config(kafka.bootstrap_servers), "j")
        results = [evaluate(f, now, timedelta(minutes=5)) for f in found]
        assert [(r.partition, r.status, r.lag, r.running) for r in results] == [
            (0, OK, 0, True),
            (1, OK, 4, True),
            (2, OK, 0, True),
        ]
        assert results[1].unread_since is not None
        time.sleep(1.2)
        summary, line = lines_of(check_j("--stall-after", "1"), 2)
        assert summary == "CRITICAL: job 'j': 1 STALL, 2 OK"
        assert re.fullmatch(
            rf"STALL job 'j' topic '{re.escape(topic)}' partition 1: lag 4 and no offset stored \(a partition "
            r"the job has not started\); the oldest message not counted was written \d+s ago \(--stall-after "
            r"1s\) although an instance holds the job lock; read its log for the batch it is stuck in, or "
            "restart it",
            line,
        ), line


@pytest.mark.spark
def test_check_reports_the_new_partitions_of_a_topic_recreated_with_more(counting: Counting) -> None:
    topic = counted_then_recreated(counting, 1, 3, {0: 8, 1: 3})
    assert lines_of(check(counting.database_url, counting.kafka), 2) == [
        "CRITICAL: job 'count_topic': 1 ERR, 1 STOP, 1 OK",
        f"ERR {mismatch_line('count_topic', topic, 0, 4)}",
        f"STOP job 'count_topic' topic '{topic}' partition 1: lag 3 and no instance of the job is running "
        "(no offset stored: a partition the job has not started; it starts at the earliest offset 0); "
        "start the job",
    ]
