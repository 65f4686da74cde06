"""Alembic environment for txstore.

The URL comes from ``TXSTORE_DATABASE_URL`` (or, for programmatic use, the
``database_url`` attribute of the Alembic config). Offline mode (``--sql``)
needs no URL at all: it renders PostgreSQL SQL for a DBA to apply.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from txstore.postgres.db import DATABASE_URL_ENV, sqlalchemy_url
from txstore.postgres.schema import metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    from logging.config import fileConfig

    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata


def _database_url() -> str | None:
    return config.attributes.get("database_url") or os.environ.get(DATABASE_URL_ENV)


def run_migrations_offline() -> None:
    url = _database_url()
    options = {"url": sqlalchemy_url(url)} if url else {"dialect_name": "postgresql"}
    context.configure(
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **options,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = _database_url()
    if not url:
        raise SystemExit(
            f"alembic: no database given; set {DATABASE_URL_ENV}=postgresql://user:password@host/db "
            "(or use --sql to print the SQL without connecting)"
        )
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool, connect_args={"connect_timeout": 10})
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
