"""The Alembic schema against a real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from tests.conftest import REPO
from txstore.core.errors import SchemaMissing
from txstore.postgres.db import connect, sqlalchemy_url
from txstore.postgres.migrate import SCHEMA_REVISION, alembic_config, check_schema
from txstore.postgres.schema import metadata


def alembic(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TXSTORE_DATABASE_URL"}
    if url:
        env["TXSTORE_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def tables(url: str) -> set[str]:
    with connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


@pytest.mark.slow
def test_alembic_upgrade_downgrade_upgrade_from_the_command_line(empty_database_url: str) -> None:
    up = alembic("upgrade", "head", url=empty_database_url)
    assert up.returncode == 0, up.stderr
    assert {"txn_offsets", "txn_data", "txn_messages", "txn_outbox", "alembic_version"} <= tables(
        empty_database_url
    )
    down = alembic("downgrade", "base", url=empty_database_url)
    assert down.returncode == 0, down.stderr
    assert tables(empty_database_url) == {"alembic_version"}
    assert "txn_lost_ranges" not in tables(empty_database_url)
    again = alembic("upgrade", "head", url=empty_database_url)
    assert again.returncode == 0, again.stderr
    assert {"txn_offsets", "txn_data"} <= tables(empty_database_url)


def test_autogenerate_finds_no_difference_between_the_tables_and_the_migrated_database(
    database_url: str,
) -> None:
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
            # The comparison is not vacuous: a drifted database is noticed.
            conn.exec_driver_sql("ALTER TABLE txn_data DROP COLUMN updated_at")
            conn.exec_driver_sql("ALTER TABLE txn_offsets ALTER COLUMN off TYPE integer")
            drift = compare_metadata(MigrationContext.configure(conn), metadata)
            conn.rollback()
    finally:
        engine.dispose()
    kinds = {d[0] if isinstance(d, tuple) else d[0][0] for d in drift}
    assert {"add_column", "modify_type"} <= kinds


@pytest.mark.slow
def test_offline_sql_needs_no_database_and_creates_both_tables() -> None:
    result = alembic("upgrade", "head", "--sql")
    assert result.returncode == 0, result.stderr
    sql = result.stdout
    assert "CREATE TABLE txn_offsets" in sql
    assert "CREATE TABLE txn_data" in sql
    assert "UNIQUE NULLS NOT DISTINCT (job, topic, grain, key, window_start)" in sql
    assert "CREATE TABLE txn_messages" in sql
    assert "CREATE TABLE txn_outbox" in sql
    assert "COMMIT" in sql


@pytest.mark.slow
def test_alembic_without_a_database_url_says_how_to_give_one() -> None:
    result = alembic("upgrade", "head")
    assert result.returncode != 0
    assert "set TXSTORE_DATABASE_URL" in result.stderr


def test_the_code_expects_the_current_alembic_head() -> None:
    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == SCHEMA_REVISION


def test_a_missing_schema_is_refused_with_the_command_to_run(empty_database_url: str) -> None:
    with (
        connect(empty_database_url) as conn,
        pytest.raises(SchemaMissing, match="run `txstore db upgrade`"),
    ):
        check_schema(conn, empty_database_url)


def test_an_older_schema_is_refused(database_url: str) -> None:
    with connect(database_url) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0000'")
        conn.commit()
        with pytest.raises(SchemaMissing, match="schema is at revision 0000 but this txstore needs"):
            check_schema(conn, database_url)


def test_topic_total_rows_are_unique_even_with_null_key_and_window(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO txn_data (job, topic, grain, metric) VALUES ('j', 't', 'topic', 1)")
    # The null-key count has NULL key and window too, but another grain: it is its own row.
    db.execute("INSERT INTO txn_data (job, topic, grain, metric) VALUES ('j', 't', 'key', 1)")
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("INSERT INTO txn_data (job, topic, grain, metric) VALUES ('j', 't', 'topic', 1)")


@pytest.mark.slow
def test_revision_0003_keeps_existing_results_and_infers_their_grain(empty_database_url: str) -> None:
    assert alembic("upgrade", "0002", url=empty_database_url).returncode == 0
    with connect(empty_database_url) as conn:
        conn.execute(
            "INSERT INTO txn_data (job, topic, key, window_start, metric) VALUES "
            "('j', 't', NULL, NULL, 10), ('j', 't', 'a', NULL, 4), "
            "('j', 't', NULL, '2026-01-01Z', 3), ('j', 't', 'a', '2026-01-01Z', 2)"
        )
        conn.commit()
    up = alembic("upgrade", "head", url=empty_database_url)
    assert up.returncode == 0, up.stderr
    query = "SELECT grain, key, metric FROM txn_data ORDER BY metric"
    with connect(empty_database_url) as conn:
        rows = conn.execute(query).fetchall()
        assert rows == [("key+window", "a", 2), ("window", None, 3), ("key", "a", 4), ("topic", None, 10)]
        conn.execute("UPDATE txn_data SET metric = metric + 0.5 WHERE grain = 'topic'")
        conn.commit()
        assert conn.execute("SELECT metric FROM txn_data WHERE grain = 'topic'").fetchone() == (
            Decimal("10.5"),
        )
    down = alembic("downgrade", "0002", url=empty_database_url)
    assert down.returncode == 0, down.stderr
    with connect(empty_database_url) as conn:
        assert conn.execute("SELECT key, metric FROM txn_data ORDER BY metric").fetchall() == [
            ("a", 2),
            (None, 3),
            ("a", 4),
            (None, 11),
        ]
