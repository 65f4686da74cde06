"""`txstore status`, `txstore jobs` and `txstore reset` against real PostgreSQL and the test broker."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import produce
from tests.helpers.cli import offsets, txstore
from tests.helpers.real_kafka_fixture import AnyKafka
from txstore.core.ranges import OffsetRange
from txstore.core.starting import StartDecision
from txstore.kafka.client_settings import client_config
from txstore.kafka.reader import RangeReader
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.idempotent import IdempotentSink
from txstore.postgres.locks import hold_job_lock
from txstore.testing.mock_kafka import MockKafkaCluster


def test_status_shows_offsets_log_offsets_lag_and_running_state(
    database_url: str, any_kafka: AnyKafka, counted_on_any: str
) -> None:
    result = txstore("status", "--job", "counter", url=database_url, kafka=any_kafka)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "JOB",
        "TOPIC",
        "PARTITION",
        "OFFSET",
        "GENERATION",
        "LOG-START",
        "LOG-END",
        "LAG",
        "LAST-COMMIT",
        "RUNNING",
        "SKIPPED",
    ]
    assert [line.split()[:8] + line.split()[9:] for line in lines[1:]] == [
        ["counter", counted_on_any, "0", "4", "0", "0", "10", "6", "no", "0"],
        ["counter", counted_on_any, "1", "20", "0", "0", "20", "0", "no", "0"],
        ["counter", counted_on_any, "2", "0", "0", "0", "30", "30", "no", "0"],
    ]
    as_json = json.loads(txstore("status", "--json", url=database_url, kafka=any_kafka).stdout)
    assert [(r["partition"], r["offset"], r["generation"], r["lag"], r["running"]) for r in as_json] == [
        (0, 4, 0, 6, False),
        (1, 20, 0, 0, False),
        (2, 0, 0, 30, False),
    ]
    assert [r["last_commit"] is not None for r in as_json] == [True, True, False]


@pytest.mark.slow
def test_status_and_jobs_say_never_for_partitions_that_never_committed(
    database_url: str, kafka: MockKafkaCluster, counted: str
) -> None:
    """Partition 2 of 'counter' has only the row its job's start created; 'fresh' has start rows for
    partitions 0 and 1, and no row for 2: none shows a time as its last commit."""
    with connect(database_url) as conn:
        store.create_start_rows(conn, "fresh", [StartDecision(counted, p, 0, "test") for p in range(2)])
    result = txstore("status", url=database_url, kafka=kafka)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    last_commit = {(r[0], int(r[2])): r[8] for r in rows}
    assert {k: v for k, v in last_commit.items() if v == "never"} == {
        ("counter", 2): "never",
        ("fresh", 0): "never",
        ("fresh", 1): "never",
        ("fresh", 2): "never",
    }
    assert last_commit[("counter", 0)].startswith("20")  # an ISO time
    as_json = json.loads(txstore("status", "--json", url=database_url, kafka=kafka).stdout)
    assert {(r["job"], r["partition"]) for r in as_json if r["last_commit"] is None} == set(
        k for k, v in last_commit.items() if v == "never"
    )
    jobs = [line.split() for line in txstore("jobs", url=database_url).stdout.splitlines()[1:]]
    assert [(j[0], j[4] == "never") for j in jobs] == [("counter", False), ("fresh", True)]
    jobs_json = json.loads(txstore("jobs", "--json", url=database_url).stdout)
    assert [(j["job"], j["last_commit"] is None) for j in jobs_json] == [("counter", False), ("fresh", True)]


@pytest.mark.slow
def test_status_without_kafka_still_shows_what_the_database_knows(database_url: str, counted: str) -> None:
    result = txstore("status", "--bootstrap-servers", "127.0.0.1:1", url=database_url)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    assert [(r[2], r[3], r[4], r[5], r[6], r[7]) for r in rows] == [
        ("0", "4", "0", "-", "-", "-"),
        ("1", "20", "0", "-", "-", "-"),
        ("2", "0", "0", "-", "-", "-"),
    ]
    assert "txstore: warning: Kafka at 127.0.0.1:1 did not answer" in result.stderr


@pytest.mark.slow
def test_a_job_holding_its_lock_shows_as_running_and_blocks_reset(
    database_url: str, kafka: MockKafkaCluster, db: psycopg.Connection, counted: str
) -> None:
    with connect(database_url) as job_connection:
        hold_job_lock(job_connection, "counter")
        status = json.loads(txstore("status", "--json", url=database_url, kafka=kafka).stdout)
        assert {r["running"] for r in status} == {True}
        reset = txstore(
            "reset",
            "--job",
            "counter",
            "--topic",
            counted,
            "--to-earliest",
            "--execute",
            url=database_url,
            kafka=kafka,
        )
        assert reset.returncode == 1
        pid = job_connection.info.backend_pid
        client, since = db.execute(
            "SELECT coalesce(host(client_addr), 'local'), "
            "to_char(backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') FROM pg_stat_activity WHERE pid = %s",
            (pid,),
        ).fetchone()
        # The holder is named: a session an instance left behind (a client gone behind a frozen
        # network, a proxy that kept the server side open) blocks every reset until it is ended.
        assert reset.stderr.strip() == (
            "txstore: error: job 'counter' is running (it holds its job lock: PostgreSQL session "
            f"{pid} from {client} since {since} UTC); stop every instance (SIGTERM lets the current "
            "batch finish), then run the reset again; if no instance runs, end the left-over session "
            f"with SELECT pg_terminate_backend({pid})"
        )
        assert offsets(db, counted) == {0: 4, 1: 20, 2: 0}
    status = json.loads(txstore("status", "--json", url=database_url, kafka=kafka).stdout)
    assert {r["running"] for r in status} == {False}


def test_reset_without_execute_prints_the_plan_and_changes_nothing(
    database_url: str, any_kafka: AnyKafka, db: psycopg.Connection, counted_on_any: str
) -> None:
    before = db.execute("SELECT * FROM txn_offsets ORDER BY part").fetchall()
    result = txstore(
        "reset",
        "--job",
        "counter",
        "--topic",
        counted_on_any,
        "--to-latest",
        url=database_url,
        kafka=any_kafka,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"reset of job 'counter', topic '{counted_on_any}':",
        f"  {counted_on_any}/0: 4 -> 10 (6 messages will be skipped)",
        f"  {counted_on_any}/1: 20 -> 20 (unchanged)",
        f"  {counted_on_any}/2: 0 -> 30 (30 messages will be skipped)",
        "dry run: nothing was changed; add --execute to apply this plan",
    ]
    assert db.execute("SELECT * FROM txn_offsets ORDER BY part").fetchall() == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--to-earliest"], {0: 0, 1: 0, 2: 0}),
        (["--to-latest", "--partition", "2"], {0: 4, 1: 20, 2: 30}),
        (["--to-offset", "7", "--partition", "0"], {0: 7, 1: 20, 2: 0}),
        (["--shift-by", "-5"], {0: 0, 1: 15, 2: 0}),
        (["--shift-by", "25"], {0: 10, 1: 20, 2: 25}),
        (["--forget", "--partition", "2", "--force"], {0: 4, 1: 20}),  # Kafka still has it: --force
        (
            ["--to-datetime", "2026-01-01T00:00:00Z", "--force"],
            {0: 10, 1: 20, 2: 30},
        ),  # the test broker answers -1: log end, applied only with --force (issue 29 point 8)
    ],
)
def test_reset_with_execute_moves_the_offsets(
    database_url: str,
    kafka: MockKafkaCluster,
    db: psycopg.Connection,
    counted: str,
    args: list[str],
    expected: dict[int, int],
) -> None:
    result = txstore(
        "reset", "--job", "counter", "--topic", counted, *args, "--execute", url=database_url, kafka=kafka
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "applied"
    assert offsets(db, counted) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--to-offset", "99", "--partition", "0"],
            "--to-offset 99 is outside what Kafka holds for '{t}' partition 0 (0 to 10)",
        ),
        (
            ["--to-earliest", "--partition", "5"],
            "Kafka has no partition(s) [5] in topic '{t}' (it has [0, 1, 2])",
        ),
        (
            ["--to-datetime", "tomorrow"],
            "--to-datetime 'tomorrow' is neither epoch milliseconds nor ISO-8601",
        ),
    ],
)
def test_bad_resets_are_refused_with_one_line_and_change_nothing(
    database_url: str,
    kafka: MockKafkaCluster,
    db: psycopg.Connection,
    counted: str,
    args: list[str],
    message: str,
) -> None:
    result = txstore(
        "reset", "--job", "counter", "--topic", counted, *args, "--execute", url=database_url, kafka=kafka
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("txstore: error: " + message.format(t=counted))
    assert offsets(db, counted) == {0: 4, 1: 20, 2: 0}


def test_a_reset_creates_rows_for_partitions_the_job_never_committed(
    database_url: str, kafka: MockKafkaCluster, db: psycopg.Connection, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 3, 1: 4})
    result = txstore(
        "reset",
        "--job",
        "counter",
        "--topic",
        topic,
        "--to-latest",
        "--execute",
        "--new-job",  # the job never ran: without it the name is refused as a typo (issue 29 point 4)
        url=database_url,
        kafka=kafka,
    )
    assert result.returncode == 0, result.stderr
    assert f"{topic}/1: (no row) -> 4 (new row)" in result.stdout
    assert offsets(db, topic) == {0: 3, 1: 4}


def test_jobs_lists_each_job_and_topic_with_its_total(
    database_url: str, kafka: MockKafkaCluster, counted: str
) -> None:
    result = txstore("jobs", url=database_url)
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[0] == ["JOB", "TOPIC", "PARTITIONS", "TOTAL", "LAST-COMMIT", "RUNNING", "SKIPPED"]
    assert [row[:4] + row[5:] for row in lines[1:]] == [["counter", counted, "3", "24", "no", "0"]]
    as_json = json.loads(txstore("jobs", "--json", url=database_url).stdout)
    assert [(j["job"], j["topic"], j["partitions"], j["total"], j["running"]) for j in as_json] == [
        ("counter", counted, 3, 24, False)
    ]


def test_jobs_shows_an_idempotent_sink_jobs_stored_messages_as_its_total(
    database_url: str, kafka: MockKafkaCluster, counted: str
) -> None:
    conf = client_config(kafka.bootstrap_servers)
    with connect(database_url) as conn:
        store.create_start_rows(conn, "copier", [StartDecision(counted, p, 0, "test") for p in range(3)])
        sink = IdempotentSink(conn, "copier")
        for r in (OffsetRange(counted, 0, 0, 10), OffsetRange(counted, 2, 0, 7)):
            sink.store(r, RangeReader(conf, r))
    as_json = json.loads(txstore("jobs", "--json", url=database_url).stdout)
    assert [(j["job"], j["partitions"], j["total"]) for j in as_json] == [
        ("copier", 3, 17),
        ("counter", 3, 24),
    ]


def test_a_reset_to_a_datetime_shows_the_exact_millisecond_it_looked_up(
    database_url: str, kafka: MockKafkaCluster, counted: str
) -> None:
    """The same instant as --starting-timestamp reads (tests/core/test_start_timestamps.py): in any
    zone, never a millisecond early. (The test broker finds no message that late: the log end.)"""
    result = txstore(
        "reset",
        "--job",
        "counter",
        "--topic",
        counted,
        "--partition",
        "0",
        "--to-datetime",
        "2004-03-15T13:25:47.472+05:30",
        url=database_url,
        kafka=kafka,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == (
        f"  {counted}/0: 4 -> 10 (--to-datetime 2004-03-15T07:55:47.472Z; 6 messages will be skipped)"
    )


@pytest.mark.slow
def test_status_and_its_check_with_kafka_down_print_their_one_line_and_no_client_logs(
    database_url: str,
) -> None:
    with connect(database_url) as conn:
        store.create_start_rows(conn, "counter", [StartDecision("t", p, 0, "test") for p in range(2)])
    down = ("--bootstrap-servers", "127.0.0.1:1")
    result = txstore("status", "--job", "counter", *down, url=database_url)
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(
        "txstore: warning: Kafka at 127.0.0.1:1 did not answer a metadata request within 5s ("
    )
    assert line.endswith("(log offsets and lag unknown)")
    check = txstore("status", "--job", "counter", "--check", *down, url=database_url)
    assert (check.returncode, check.stderr) == (3, "")
    assert check.stdout.splitlines()[0] == "UNKNOWN: job 'counter': 2 UNKNOWN"


@pytest.mark.slow
def test_a_database_without_the_schema_is_one_line_telling_to_run_txstore_db_upgrade_and_check_is_unknown(
    empty_database_url: str,
) -> None:
    from txstore.postgres.db import redact

    missing = (
        f"the txstore tables are missing in {redact(empty_database_url)}; "
        "run `txstore db upgrade` with TXSTORE_DATABASE_URL set to that database"
    )
    for command in (
        ("status",),
        ("status", "--job", "counter"),
        ("jobs",),
        ("reset", "--job", "counter", "--topic", "t", "--forget"),
    ):
        result = txstore(*command, url=empty_database_url)
        assert (result.returncode, result.stdout, result.stderr) == (1, "", f"txstore: error: {missing}\n"), (
            command
        )
    check = txstore("status", "--check", url=empty_database_url)
    assert (check.returncode, check.stdout, check.stderr) == (3, f"UNKNOWN: {missing}\n", "")
    as_json = txstore("status", "--check", "--json", url=empty_database_url)
    assert (as_json.returncode, as_json.stderr) == (3, "")
    assert json.loads(as_json.stdout) == {
        "status": "UNKNOWN",
        "exit_code": 3,
        "summary": f"UNKNOWN: {missing}",
        "partitions": [],
    }


@pytest.mark.slow
def test_an_unknown_job_is_refused_in_one_line_naming_the_known_jobs_unless_said_to_be_new(
    database_url: str, kafka: MockKafkaCluster, counted: str, db: psycopg.Connection
) -> None:
    with connect(database_url) as conn:
        store.create_start_rows(conn, "other", [StartDecision(counted, 0, 0, "test")])
    status = txstore("status", "--job", "count_topc", url=database_url, kafka=kafka)
    assert (status.returncode, status.stdout, status.stderr) == (
        1,
        "",
        "txstore: error: no job 'count_topc' in the database (known jobs: 'counter', 'other'); check --job\n",
    )
    typo = ("reset", "--job", "count_topc", "--topic", counted, "--to-earliest", "--execute")
    reset = txstore(*typo, url=database_url, kafka=kafka)
    assert (reset.returncode, reset.stdout, reset.stderr) == (
        1,
        "",
        "txstore: error: no job 'count_topc' in the database (known jobs: 'counter', 'other'); check --job, "
        "or add --new-job to store offsets for a job that has not run yet\n",
    )
    assert [j["job"] for j in json.loads(txstore("jobs", "--json", url=database_url).stdout)] == [
        "counter",
        "other",
    ]
    new = txstore(*typo, "--new-job", url=database_url, kafka=kafka)
    assert new.returncode == 0, new.stderr
    assert new.stdout.splitlines()[-1] == "applied"
    assert {p: o for (_, p), o in store.committed_offsets(db, "count_topc", [counted]).items()} == {
        0: 0,
        1: 0,
        2: 0,
    }


def test_an_unknown_job_in_an_empty_database_says_there_are_no_jobs_yet(database_url: str) -> None:
    status = txstore("status", "--job", "count_topic", url=database_url)
    assert (status.returncode, status.stdout, status.stderr) == (
        1,
        "",
        "txstore: error: no job 'count_topic' in the database (no jobs yet); check --job\n",
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", [("status", "--check", "--json"), ("status", "--json"), ("jobs",)])
def test_output_into_a_pipe_closed_early_ends_quietly_as_a_command_stopped_by_sigpipe(
    database_url: str, kafka: MockKafkaCluster, counted: str, command: tuple[str, ...]
) -> None:
    """`txstore status --check --json | head`: the reader has gone before the output is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "txstore.ops.cli", *command, "--database-url", database_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # like head, done before anything arrives
    err = process.stderr.read()
    assert (process.wait(timeout=60), err) == (141, "")


@pytest.mark.slow
def test_a_reset_to_a_datetime_kafka_cannot_look_up_that_would_skip_messages_is_refused_without_force(
    database_url: str, kafka: MockKafkaCluster, counted: str, db: psycopg.Connection
) -> None:
    """The test broker answers -1 (no message at or after the time) to every offsets-for-times
    request, even for 1970: moving to the log end would skip messages for nothing said."""
    before = offsets(db, counted)
    to_2004 = ("reset", "--job", "counter", "--topic", counted, "--to-datetime", "2004-01-01T00:00:00Z")
    problem = (
        f"Kafka at {kafka.bootstrap_servers} found no message at or after 2004-01-01T00:00:00Z "
        f"on topic {counted!r} partitions [0, 2], not even after 1970: it cannot answer time lookups "
        "there, and moving them to the log end would skip 36 messages"
    )
    refused = txstore(*to_2004, "--execute", url=database_url, kafka=kafka)
    assert (refused.returncode, refused.stderr) == (
        1,
        f"txstore: error: {problem}; nothing was changed: use --to-offset, or add --force to skip them\n",
    )
    assert offsets(db, counted) == before
    dry_run = txstore(*to_2004, url=database_url, kafka=kafka)
    assert (dry_run.returncode, dry_run.stderr) == (
        0,
        f"txstore: warning: {problem}; --execute needs --force\n",
    )
    forced = txstore(*to_2004, "--execute", "--force", url=database_url, kafka=kafka)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines()[-1] == "applied"
    assert offsets(db, counted) == {0: 10, 1: 20, 2: 30}
