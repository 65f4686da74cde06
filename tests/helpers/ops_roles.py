"""A login role that may not create tables, for the operator commands' tests (``txstore db``, the demo)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psycopg

from tests.conftest import pg_url


@contextlib.contextmanager
def role_that_cannot_create_tables(database_url: str, prefix: str) -> Iterator[tuple[str, str]]:
    """A role ``PREFIX_PID`` that may log in to ``database_url``'s database, where PUBLIC has no
    CREATE on schema public (as on PostgreSQL 15+): its URL and password; the role is dropped after."""
    role, password = f"{prefix}_{os.getpid()}", f"pw-{os.getpid()}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        try:
            admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            yield pg_url(admin.info.dbname, role, password), password
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")
