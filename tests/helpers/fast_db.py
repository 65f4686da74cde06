"""One migrated database for all the tests of a module, emptied before each test.

The suite's ``database_url`` (tests/conftest.py) creates and drops a database per test,
about a second each on a busy machine. The fast tests of the exactly-once core
(postgres/test_guarantee_guards.py, postgres/test_guarantee_db.py), which ``./dev mutate`` runs hundreds of
times, override it in their module with :func:`emptied`: one database per module, copied once
from the session's migrated template, every table emptied before each test, so each test
still starts from an empty schema.

``TXSTORE_MUTATE_DATABASE`` (set by the mutation runner, one per worker): use that migrated
database instead of creating one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import pg_url

SHARED = "TXSTORE_MUTATE_DATABASE"


def shared_database(request: pytest.FixtureRequest, name: str) -> Iterator[str]:
    """The url of a migrated database for a module (``name`` makes it unique), dropped after."""
    given = os.environ.get(SHARED)
    if given:
        yield given
        return
    template = request.getfixturevalue("postgresql_migrated_proc").template_dbname
    dbname = f"{template}_{name}"
    with psycopg.connect(pg_url("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(dbname)))
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(dbname), sql.Identifier(template))
        )
    try:
        yield pg_url(dbname)
    finally:
        with psycopg.connect(pg_url("postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def module_database(name: str) -> tuple[Any, Any]:
    """The module's ``shared_database_url`` and ``database_url`` fixtures: one migrated database
    for the module (``name`` makes it unique), emptied before each test. A module takes them as
    ``shared_database_url, database_url = module_database("name")``."""

    @pytest.fixture(scope="module")
    def shared_database_url(request: pytest.FixtureRequest) -> Iterator[str]:
        yield from shared_database(request, name)

    @pytest.fixture
    def database_url(shared_database_url: str) -> str:
        """An empty migrated database (tests/helpers/fast_db.py: shared by the module, emptied per test)."""
        return emptied(shared_database_url)

    return shared_database_url, database_url


def emptied(url: str) -> str:
    """Delete every row of every table but Alembic's (the tables are small: deleting is much
    faster than truncating, which makes new files; identities go on counting)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
            )
        ]
        with conn.transaction():
            for table in tables:
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
    return url
