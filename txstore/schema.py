"""The txstore tables, defined once (SQLAlchemy Core).

Alembic revisions create exactly these tables, and a test proves that
autogenerate finds no difference between this module and a migrated database.
Queries elsewhere are plain SQL over the same names.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
)

metadata = MetaData(
    naming_convention={
        "pk": "%(table_name)s_pkey",
        "uq": "%(table_name)s_%(column_0_N_name)s_key",
        "ck": "%(table_name)s_%(constraint_name)s_check",
        "ix": "%(table_name)s_%(column_0_N_name)s_idx",
    }
)

txn_offsets = Table(
    "txn_offsets",
    metadata,
    Column("job", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("part", Integer, nullable=False),
    # The next offset to read: every message before it is committed.
    Column("off", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("job", "topic", "part"),
    CheckConstraint("off >= 0", name="off_nonnegative"),
    CheckConstraint("part >= 0", name="part_nonnegative"),
    comment="Where each txstore job is in each Kafka partition (next offset to read).",
)

txn_data = Table(
    "txn_data",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("job", Text, nullable=False),
    Column("topic", Text, nullable=False),
    # NULL key and NULL window_start: the topic total.
    Column("key", Text, nullable=True),
    Column("window_start", DateTime(timezone=True), nullable=True),
    Column("metric", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("id"),
    # NULLs equal, so the single topic-total row is an upsert target (PostgreSQL 15+).
    UniqueConstraint("job", "topic", "key", "window_start", postgresql_nulls_not_distinct=True),
    comment="Aggregated results of txstore jobs, committed with their offsets.",
)

txn_lost_ranges = Table(
    "txn_lost_ranges",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("job", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("part", Integer, nullable=False),
    # Offsets [from_off, until_off) aged out of Kafka before the job counted them.
    Column("from_off", BigInteger, nullable=False),
    Column("until_off", BigInteger, nullable=False),
    Column("detected_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("id"),
    comment="Offset ranges a job skipped with --fail-on-data-loss false, recorded with the offset move.",
)
