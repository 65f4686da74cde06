"""Logging in: PostgreSQL passwords, a least-privilege job role, TLS to PostgreSQL and Kafka.

The PostgreSQL tests run against a private server that checks passwords
(scram-sha-256) and has TLS off (tests/helpers/private_postgres.py); the shared test
server trusts everyone, so it could not tell a wrong password from a right one.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from tests.conftest import REPO, produce
from tests.e2e.test_bad_input import error_line, snapshot
from tests.helpers.counting import job_for, log_ends
from tests.helpers.fake_kafka import FakeLog, install_with_admin
from tests.helpers.job_processes import count_topic_args, operator_cli, run_job
from tests.helpers.private_postgres import SUPERUSER_PASSWORD, private_postgres, url
from tests.postgres.test_schema import alembic
from tests.spark.stream.test_stream_guards import age_out, grow, offsets, plan, read, source, total, writer
from txstore.core.errors import STREAM_PRIVILEGE_HINT, BatchFailed, PermissionDenied
from txstore.kafka.admin import METADATA_TIMEOUT_SECONDS
from txstore.postgres import store
from txstore.postgres.db import redact
from txstore.postgres.migrate import SCHEMA_REVISION, upgrade
from txstore.spark.stream.stream_source import TxstoreStreamReader
from txstore.testing.mock_kafka import MockKafkaCluster

pytestmark = pytest.mark.spark

_numbers = itertools.count()
PRIVILEGE_HINT = (
    "a job's role needs SELECT on alembic_version and SELECT, INSERT, UPDATE on txn_offsets, "
    "txn_data, txn_lost_ranges and txn_subscriptions (README: a role for jobs)"
)


@pytest.fixture(scope="module")
def pg_port() -> Iterator[int]:
    with private_postgres() as port:
        yield port


@pytest.fixture
def new_database(pg_port: int) -> Iterator[Callable[..., str]]:
    """``new_database(migrated=True)``: a database on the private server, as the superuser's URL."""
    created: list[str] = []

    def create(migrated: bool = True) -> str:
        name = f"txstore_{os.getpid()}_{next(_numbers)}"
        with psycopg.connect(url(pg_port, "postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        database = url(pg_port, name)
        if migrated:
            upgrade(database)
        return database

    yield create
    with psycopg.connect(url(pg_port, "postgres"), autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def readme_job_role_sql() -> str:
    """The SQL the README gives for a job role."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```sql\n(-- txstore: a role for jobs\n.*?)```", readme, re.DOTALL)
    assert len(blocks) == 1, "README must give the job role SQL once"
    return str(blocks[0])


def create_job_role(database: str, role: str, password: str, drop: tuple[str, ...] = ()) -> None:
    """Run the README's SQL for ``role``; ``drop`` lists grant lines (by prefix) to leave out."""
    dbname = database.rsplit("/", 1)[1]
    sql = readme_job_role_sql().replace("txstore_job", role).replace("'change-me'", f"'{password}'")
    sql = sql.replace("ON DATABASE txstore TO", f'ON DATABASE "{dbname}" TO')
    statements = [line for line in sql.splitlines() if line.strip() and not line.startswith("--")]
    kept = [line for line in statements if not line.startswith(drop)] if drop else statements
    assert len(kept) == len(statements) - len(drop)
    with psycopg.connect(database, autocommit=True) as conn:
        for statement in kept:
            conn.execute(statement)


def role_url(owner: str, role: str, password: str) -> str:
    """``owner``'s database URL, for ``role`` instead."""
    port = int(owner.rsplit(":", 1)[1].split("/")[0])
    return url(port, owner.rsplit("/", 1)[1], role, password)


def outputs(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def secrets(password: str) -> list[str]:
    """How a password could show up: as is, percent-encoded, and its distinctive pieces."""
    return [
        password,
        quote(password, safe=""),
        *(part for part in re.split(r"[@:/%#?]", password) if len(part) > 2),
    ]


def test_a_password_with_url_special_characters_works_for_alembic_and_the_job(
    new_database: Callable[..., str], kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    database = new_database(migrated=False)
    assert quote(SUPERUSER_PASSWORD, safe="") in database  # p%40ss%3Aw%2Frd%25%23%3F
    migrated = alembic("upgrade", "head", url=database)
    assert migrated.returncode == 0, migrated.stderr
    topic = new_topic(2)
    produce(kafka.bootstrap_servers, topic, {0: 6, 1: 9})
    result = run_job(*count_topic_args(kafka, database, topic, "--once"))
    assert result.returncode == 0, result.stderr[-3000:]
    with psycopg.connect(database) as conn:
        assert store.topic_totals(conn, "count_topic", [topic]) == {topic: 15}
    for secret in secrets(SUPERUSER_PASSWORD):
        assert secret not in outputs(result) + migrated.stdout + migrated.stderr


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "verbose"])
def test_a_wrong_password_is_one_line_and_no_password_is_ever_shown(
    new_database: Callable[..., str], kafka: MockKafkaCluster, new_topic: Callable[..., str], verbose: bool
) -> None:
    database = new_database()
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 3})
    wrong_password = "wr0ng:p@ss/w%rd"
    port = database.rsplit(":", 1)[1].split("/")[0]
    wrong = database.replace(quote(SUPERUSER_PASSWORD, safe=""), quote(wrong_password, safe=""))
    with psycopg.connect(database) as conn:
        before = snapshot(conn)
    args = count_topic_args(kafka, wrong, topic, "--once", *(["--verbose"] if verbose else []))
    result = run_job(*args)
    expected = (
        f"count_topic: error: cannot connect to PostgreSQL at {redact(wrong)}: connection failed: "
        f'connection to server at "127.0.0.1", port {port} failed: FATAL:  password authentication '
        'failed for user "postgres"; check --database-url / TXSTORE_DATABASE_URL and that the server is up'
    )
    assert redact(wrong) == f"postgresql://postgres:***@127.0.0.1:{port}/{database.rsplit('/', 1)[1]}"
    if verbose:
        assert result.returncode == 1
        assert "Traceback" in result.stderr  # --verbose shows where it failed
        assert result.stderr.strip().splitlines()[-1] == expected
    else:
        assert error_line(result) == expected
    for secret in secrets(wrong_password) + secrets(SUPERUSER_PASSWORD):
        assert secret not in outputs(result), secret
    with psycopg.connect(database) as conn:
        assert snapshot(conn) == before


def test_sslmode_require_against_a_server_without_tls_is_one_line(
    new_database: Callable[..., str], kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    database = new_database()
    port = database.rsplit(":", 1)[1].split("/")[0]
    topic = new_topic(1)
    tls = f"{database}?sslmode=require"
    result = run_job(*count_topic_args(kafka, tls, topic, "--once"))
    assert error_line(result) == (
        f"count_topic: error: cannot connect to PostgreSQL at {redact(tls)}: connection failed: "
        f'connection to server at "127.0.0.1", port {port} failed: server does not support SSL, '
        "but SSL was required; check --database-url / TXSTORE_DATABASE_URL and that the server is up"
    )
    assert redact(tls).endswith("?sslmode=require")


def test_the_readme_job_role_counts_exactly_and_cannot_change_the_tables(
    new_database: Callable[..., str], kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    owner = new_database()
    role, password = f"txstore_job_{next(_numbers)}", "j@b:p/w%#?&="
    create_job_role(owner, role, password)
    as_job = role_url(owner, role, password)

    topic = new_topic(3)
    produce(kafka.bootstrap_servers, topic, {0: 10, 1: 20, 2: 30})
    result = run_job(*count_topic_args(kafka, as_job, topic, "--once"))
    assert result.returncode == 0, result.stderr[-3000:]
    with psycopg.connect(owner) as conn:
        assert store.topic_totals(conn, "count_topic", [topic]) == {topic: 60}
        committed = store.committed_offsets(conn, "count_topic", [topic])
        assert {p: o for (_, p), o in committed.items()} == log_ends(kafka, topic)
    # The grants also cover per-key counts with publishing, and the idempotent sink.
    results = new_topic(1, prefix="results")
    more = ["--by", "key", "--publish-topic", results, "--job", "published", "--once"]
    for flags in (more, ["--sink", "idempotent", "--job", "copied", "--once"]):
        result = run_job(*count_topic_args(kafka, as_job, topic, *flags))
        assert result.returncode == 0, result.stderr[-3000:]
    with psycopg.connect(owner) as conn:
        assert conn.execute("SELECT count(*) FROM txn_outbox WHERE sent_at IS NOT NULL").fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM txn_messages WHERE job = 'copied'").fetchone() == (60,)
    status = operator_cli("status", "--database-url", as_job)
    assert status.returncode == 0, status.stderr

    forbidden = [
        "DROP TABLE txn_data",
        "ALTER TABLE txn_offsets ADD COLUMN note text",
        "ALTER TABLE txn_data DROP CONSTRAINT txn_data_pkey",
        "TRUNCATE txn_offsets",
        "DELETE FROM txn_data",
        "CREATE TABLE txn_extra (id int)",
        "UPDATE alembic_version SET version_num = '0001'",
        "DROP TABLE alembic_version",
    ]
    with psycopg.connect(as_job, autocommit=True) as conn:
        for statement in forbidden:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with psycopg.connect(owner) as conn:
        assert store.topic_totals(conn, "count_topic", [topic]) == {topic: 60}
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == (SCHEMA_REVISION,)


def test_a_role_that_may_not_read_the_schema_revision_stops_with_one_line_naming_the_grants(
    new_database: Callable[..., str], kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    owner = new_database()
    role, password = f"txstore_job_{next(_numbers)}", "s3cret"
    create_job_role(owner, role, password, drop=("GRANT SELECT ON alembic_version",))
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 4})
    result = run_job(*count_topic_args(kafka, role_url(owner, role, password), topic, "--once"))
    assert error_line(result) == (
        "count_topic: error: planning job 'count_topic': PostgreSQL said permission denied for table "
        f"alembic_version; {PRIVILEGE_HINT}"
    )
    with psycopg.connect(owner) as conn:
        assert snapshot(conn) == {"txn_offsets": [], "txn_data": [], "txn_lost_ranges": []}


def test_a_role_that_may_not_move_offsets_refuses_the_range_and_commits_nothing(
    spark: Any, new_database: Callable[..., str], kafka: MockKafkaCluster, new_topic: Callable[..., str]
) -> None:
    owner = new_database()
    role, password = f"txstore_job_{next(_numbers)}", "s3cret"
    create_job_role(owner, role, password, drop=("GRANT SELECT, INSERT, UPDATE ON txn_offsets",))
    with psycopg.connect(owner, autocommit=True) as conn:  # all of it but the UPDATE that moves an offset
        conn.execute(f"GRANT SELECT, INSERT ON txn_offsets TO {role}")
        conn.execute(
            f"GRANT SELECT, INSERT, UPDATE ON txn_data, txn_lost_ranges, txn_subscriptions TO {role}"
        )
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 4})
    job = job_for(spark, kafka, role_url(owner, role, password), topic)
    with pytest.raises(BatchFailed) as failed:
        job.run_batch()
    assert not failed.value.transient  # retrying cannot grant a privilege
    assert str(failed.value) == (
        f"committing {topic}/0 0 -> 4 for job 'count_topic': PostgreSQL said permission denied for table "
        f"txn_offsets; nothing was committed for this range; {PRIVILEGE_HINT}"
    )
    with psycopg.connect(owner) as conn:
        assert conn.execute("SELECT count(*) FROM txn_data").fetchone() == (0,)
        assert store.committed_offsets(conn, "count_topic", [topic]) == {(topic, 0): 0}


def test_kafka_tls_options_reach_the_client_and_a_plaintext_broker_is_one_line_in_bounded_time(
    kafka: MockKafkaCluster, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap_servers, topic, {0: 2})
    started = time.monotonic()
    result = run_job(
        *count_topic_args(kafka, database_url, topic, "--once", "--kafka-option", "security.protocol=SSL")
    )
    elapsed = time.monotonic() - started
    line = error_line(result)
    servers = kafka.bootstrap_servers
    assert line.startswith(
        f"count_topic: error: Kafka at {servers} did not answer a metadata request within "
        f"{METADATA_TIMEOUT_SECONDS:g}s (ssl://{servers}/bootstrap: "
    ), line
    # librdkafka words it either way, depending on when the plaintext broker drops the handshake.
    assert "SSL handshake failed" in line or "in state SSL_HANDSHAKE" in line, line
    assert line.endswith(
        "); check --bootstrap-servers / KAFKA_BOOTSTRAP_SERVERS, the network, and --kafka-option security settings"
    )
    assert elapsed < METADATA_TIMEOUT_SECONDS + 120


def test_the_readme_job_role_runs_a_stream_through_the_txstore_sink_and_through_another_sink(
    new_database: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream source and sink (tests/spark/stream/test_stream_guards.py's harness: Spark's calls made
    directly, Kafka a fake) as the README's job role: a micro-batch the txstore sink commits,
    one Spark's commit moves (another sink's query), and an aged-out range skipped
    (failOnDataLoss false) all commit, each counted once."""
    owner = new_database()
    role, password = f"txstore_job_{next(_numbers)}", "str3am"
    create_job_role(owner, role, password)
    as_job = role_url(owner, role, password)
    fake = install_with_admin(monkeypatch)
    fake_log = fake.add(FakeLog.of("t", 0, range(10)))
    made: list[TxstoreStreamReader] = []
    try:
        reader = source(made, as_job, failOnDataLoss="false")
        _, end, parts = plan(reader)
        sink = writer(as_job)
        sink.commit([sink.write(iter(task)) for task in read(reader, parts)], 0)
        reader.commit(end)
        grow(fake_log, 15)
        _, end, parts = plan(reader, end)
        read(reader, parts)  # another sink wrote them; Spark's commit moves the offsets
        reader.commit(end)
        grow(fake_log, 20)
        age_out(fake_log, 18)  # 15..18 aged out before they were read
        _, end, parts = plan(reader, end)
        sink.commit([sink.write(iter(task)) for task in read(reader, parts)], 2)
        reader.commit(end)
    finally:
        for r in made:
            r.stop()
    with psycopg.connect(owner) as conn:
        assert offsets(conn) == {0: 20}
        assert total(conn) == 12  # 10 by the txstore sink, then 18..20; 10..15 went to the other sink
        lost = conn.execute("SELECT part, from_off, until_off FROM txn_lost_ranges").fetchall()
        assert lost == [(0, 15, 18)]


def test_a_stream_role_without_the_receipts_grant_stops_with_one_line_naming_the_grants(
    new_database: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = new_database()
    role, password = f"txstore_job_{next(_numbers)}", "str3am"
    create_job_role(owner, role, password, drop=("GRANT SELECT, INSERT, UPDATE, DELETE ON txn_stream_reads",))
    as_job = role_url(owner, role, password)
    fake = install_with_admin(monkeypatch)
    fake.add(FakeLog.of("t", 0, range(4)))
    made: list[TxstoreStreamReader] = []
    try:
        reader = source(made, as_job)
        with pytest.raises(PermissionDenied) as denied:
            plan(reader)  # a new plan deletes the last one's receipts
    finally:
        for r in made:
            r.stop()
    assert str(denied.value) == (
        "job 'stream_guards': planning the stream (partitions): PostgreSQL said permission denied for "
        f"table txn_stream_reads; {STREAM_PRIVILEGE_HINT}"
    )
    with psycopg.connect(owner) as conn:
        assert offsets(conn) == {0: 0} and total(conn) == 0


def test_upgrading_to_0009_grants_the_new_tables_to_the_roles_that_run_jobs_and_streams(
    new_database: Callable[..., str],
) -> None:
    """A job role made as the README said before revision 0009 (no grant on txn_stream_reads,
    which 0008 added, nor on txn_subscriptions) keeps its jobs and streams running after
    ``txstore db upgrade``; a role that only reads gets nothing."""
    owner = new_database(migrated=False)
    upgrade(owner, "0008")
    job, reader = f"txstore_job_{next(_numbers)}", f"txstore_reader_{next(_numbers)}"
    with psycopg.connect(owner, autocommit=True) as conn:
        for role in (job, reader):
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'x'")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON txn_offsets, txn_data, txn_lost_ranges TO {job}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON txn_stream_plans TO {job}")
        conn.execute(f"GRANT SELECT ON txn_offsets, txn_stream_plans TO {reader}")
    upgrade(owner)

    def may(role: str, table: str) -> list[str]:
        with psycopg.connect(owner) as conn:
            return [
                p
                for p in ("SELECT", "INSERT", "UPDATE", "DELETE")
                if conn.execute("SELECT has_table_privilege(%s, %s, %s)", (role, table, p)).fetchone()
                == (True,)
            ]

    assert may(job, "txn_subscriptions") == ["SELECT", "INSERT", "UPDATE"]
    assert may(job, "txn_stream_reads") == ["SELECT", "INSERT", "UPDATE", "DELETE"]
    assert may(reader, "txn_subscriptions") == [] and may(reader, "txn_stream_reads") == []
