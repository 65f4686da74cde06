"""A mistyped ``--job``: every command says so in one line listing the jobs the database knows,
whatever a job is known by (offsets, results, stored messages, results to publish, bad messages)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.helpers.cli import txstore
from txstore.core.ranges import OffsetRange
from txstore.core.results import TOPIC_TOTAL
from txstore.core.starting import StartDecision
from txstore.ops import status
from txstore.postgres import store
from txstore.postgres.db import connect
from txstore.postgres.sink import TransactionalSink


def _jobs_known_by_each_table(database_url: str, db: psycopg.Connection) -> None:
    """'by_offsets' has offsets; 'by_results' only results (its offsets forgotten, as
    ``txstore reset --forget`` leaves it); 'by_messages' only stored messages; 'by_bad' only a
    bad message."""
    with connect(database_url) as conn:
        for job in ("by_offsets", "by_results"):
            store.create_start_rows(conn, job, [StartDecision("t", 0, 0, "test")])
            TransactionalSink(conn, job).commit(OffsetRange("t", 0, 0, 2), {TOPIC_TOTAL: 2})
    db.execute("DELETE FROM txn_offsets WHERE job = 'by_results'")
    db.execute(
        "INSERT INTO txn_messages (job, topic, part, generation, off, key, value) "
        "VALUES ('by_messages', 't', 0, 0, 0, NULL, NULL)"
    )
    db.execute(
        "INSERT INTO txn_bad_messages (job, topic, part, off, reason) VALUES ('by_bad', 't', 0, 5, 'test')"
    )
    db.commit()


KNOWN = "known jobs: 'by_bad', 'by_messages', 'by_offsets', 'by_results'"


def assert_no_such_job(result: subprocess.CompletedProcess[str], job: str, known: str = KNOWN) -> None:
    """``result`` is a command's refusal of ``job``: exit 1, nothing on stdout, one line on stderr
    listing the ``known`` jobs."""
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        "",
        f"txstore: error: no job '{job}' in the database ({known}); check --job\n",
    )


def insert_outbox_row(db: psycopg.Connection, job: str, dedup_key: str, sent: bool, set_aside: bool) -> None:
    """A result of ``job`` in txn_outbox: sent now, set aside now (Kafka refused it for good), or waiting."""
    db.execute(
        "INSERT INTO txn_outbox (job, destination, dedup_key, headers, payload, sent_at, failed_at) "
        "VALUES (%s, 'out', %s, '{}', '{}', CASE WHEN %s THEN now() END, CASE WHEN %s THEN now() END)",
        (job, dedup_key, sent, set_aside),
    )


@pytest.mark.slow
def test_the_known_jobs_line_lists_jobs_known_only_by_results_messages_or_bad_messages(
    database_url: str, db: psycopg.Connection
) -> None:
    _jobs_known_by_each_table(database_url, db)
    for known in ("by_offsets", "by_results", "by_messages", "by_bad"):
        assert txstore("status", "--job", known, url=database_url).returncode == 0
    assert_no_such_job(txstore("status", "--job", "by_offset", url=database_url), "by_offset")


@pytest.mark.slow
def test_status_check_of_an_unknown_job_is_its_own_state_exit_4_listing_the_known_jobs(
    database_url: str, db: psycopg.Connection
) -> None:
    """Not UNKNOWN (exit 3), which the documented liveness probe lets pass: a mistyped --job would
    look healthy forever."""
    _jobs_known_by_each_table(database_url, db)
    check = txstore("status", "--check", "--job", "by_offset", url=database_url)
    assert (check.returncode, check.stdout) == (
        4,
        f"NO-SUCH-JOB: no job 'by_offset' in the database ({KNOWN}); check --job\n",
    )
    as_json = json.loads(
        txstore("status", "--check", "--json", "--job", "by_offset", url=database_url).stdout
    )
    assert (as_json["status"], as_json["exit_code"], as_json["partitions"]) == ("NO-SUCH-JOB", 4, [])
    assert KNOWN in as_json["summary"]
    # A job known only by its results has no offsets to judge: UNKNOWN, but not "no job".
    known = txstore("status", "--check", "--job", "by_results", url=database_url)
    assert (known.returncode, known.stdout) == (3, "UNKNOWN: no stored offsets for job 'by_results'\n")


def test_publish_of_an_unknown_job_is_refused_in_one_line_listing_the_known_jobs(
    database_url: str, db: psycopg.Connection
) -> None:
    _jobs_known_by_each_table(database_url, db)
    typo = txstore("publish", "--job", "by_offset", "--bootstrap-servers", "127.0.0.1:1", url=database_url)
    assert_no_such_job(typo, "by_offset")


@pytest.mark.slow
def test_a_job_known_only_by_results_waiting_or_set_aside_to_publish_is_known_and_listed(
    database_url: str, db: psycopg.Connection
) -> None:
    """Results waiting in the outbox, or set aside because Kafka refused them for good, make a
    job known; results already sent (kept a week, then pruned) do not."""
    for job, sent, set_aside in (
        ("by_pending", False, False),
        ("by_set_aside", False, True),
        ("by_sent", True, False),
    ):
        insert_outbox_row(db, job, f"{job}/1", sent, set_aside)
    for known in ("by_pending", "by_set_aside"):
        assert txstore("status", "--job", known, url=database_url).returncode == 0
    typo = txstore("status", "--job", "by_sent", url=database_url)
    assert_no_such_job(typo, "by_sent", "known jobs: 'by_pending', 'by_set_aside'")


def test_every_part_of_the_known_jobs_lookups_reads_an_index_not_the_table(db: psycopg.Connection) -> None:
    """Each table is looked up by an index on ``job``: read whole, ``txn_outbox`` holds every
    result sent in the last 7 days, and the skip scan would read it once per job. With sequential
    scans priced out, a plan still holding one has no index to use."""
    with db.transaction():
        db.execute("SET LOCAL enable_seqscan = off")
        for query, params in ((status._KNOWN_JOBS, None), (status._JOB_KNOWN, {"job": "j"})):
            plan = "\n".join(row[0] for row in db.execute(f"EXPLAIN {query}", params))
            assert "Seq Scan" not in plan, plan


def test_the_outbox_lines_of_status_count_pending_and_set_aside_rows_from_indexes_not_the_table(
    db: psycopg.Connection,
) -> None:
    """``txstore status`` counts each job's unsent results, waiting and set aside. Every result
    sent in the last 7 days stays in ``txn_outbox``: read whole on every status, as the lookup
    was (``sent_at IS NULL`` alone matches neither partial index), it grows with them."""
    rows = [("a", False, False)] * 3 + [("a", False, True), ("b", False, True), ("c", True, False)]
    for i, (job, sent, set_aside) in enumerate(rows):
        insert_outbox_row(db, job, f"{job}/{i}", sent, set_aside)
    db.commit()
    assert status.outbox_status(db) == [status.OutboxStatus("a", 3, 1), status.OutboxStatus("b", 0, 1)]
    assert status.outbox_status(db, "a") == [status.OutboxStatus("a", 3, 1)]
    assert status.outbox_status(db, "c") == []
    with db.transaction():
        db.execute("SET LOCAL enable_seqscan = off")
        for job in (None, "a"):
            plan = "\n".join(row[0] for row in db.execute(f"EXPLAIN {status._OUTBOX_STATUS}", {"job": job}))
            assert "Seq Scan" not in plan, plan


@pytest.mark.slow
def test_the_documented_liveness_probe_fails_for_a_mistyped_job_and_passes_for_a_stopped_one(
    database_url: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    """The probe of docs/how-to/operating.md, run as written with ``txstore`` on PATH: a job
    name with a typo must fail it (the container restarts, someone looks), not pass forever."""
    page = (Path(__file__).parents[2] / "docs" / "how-to" / "operating.md").read_text()
    probe = json.loads(re.search(r'command: (\["sh", "-c", .*\])', page).group(1))  # type: ignore[union-attr]
    shim = tmp_path / "txstore"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m txstore.ops.cli "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "PYTHONPATH": str(Path(__file__).parents[2]),
        "TXSTORE_DATABASE_URL": database_url,
    }
    _jobs_known_by_each_table(database_url, db)
    known = probe[-1].replace("count_topic", "by_results")
    assert subprocess.run([*probe[:-1], known], env=env, timeout=60).returncode == 0
    typo = probe[-1].replace("count_topic", "by_result")
    assert subprocess.run([*probe[:-1], typo], env=env, timeout=60).returncode != 0
