"""Alembic from Python: upgrade a database and check it matches this code.

Ops run ``alembic upgrade head`` from a checkout; tests and the demo call
:func:`upgrade` here, which runs the very same revisions.

Alembic is imported only by the functions that run it: :func:`check_schema`
is imported wherever a job runs, Spark tasks included, and the workers need
not have Alembic (README: what workers need).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from txstore.core.errors import SchemaMissing
from txstore.postgres.db import redact

if TYPE_CHECKING:
    from alembic.config import Config

SCHEMA_REVISION = "0008"
"""The Alembic head this code was written for; a test keeps it equal to the real head."""

REPO_ROOT = Path(__file__).resolve().parents[2]


def alembic_config(database_url: str | None = None) -> Config:
    """The checkout's ``alembic.ini``, optionally pointed at a database URL."""
    ini = REPO_ROOT / "alembic.ini"
    if not ini.exists():
        raise SchemaMissing(
            f"no alembic.ini at {ini}: run migrations from a txstore checkout (`alembic upgrade head`)"
        )
    from alembic.config import Config

    config = Config(str(ini))
    config.attributes["configure_logger"] = False
    if database_url:
        config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply the Alembic revisions up to ``revision``."""
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)


def check_schema(conn: psycopg.Connection, database_url: str) -> None:
    """Refuse to run against a database whose schema is missing or not this code's."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('alembic_version') IS NOT NULL")
        row = cur.fetchone()
        found = None
        if row and row[0]:
            cur.execute("SELECT version_num FROM alembic_version")
            version = cur.fetchone()
            found = version[0] if version else None
    conn.rollback()
    if found is None:
        raise SchemaMissing(
            f"the txstore tables are missing in {redact(database_url)}; "
            "run `alembic upgrade head` with TXSTORE_DATABASE_URL set to that database"
        )
    if found != SCHEMA_REVISION:
        raise SchemaMissing(
            f"the database schema is at revision {found} but this txstore needs {SCHEMA_REVISION}; "
            "run `alembic upgrade head` (or upgrade txstore if the database is newer)"
        )
