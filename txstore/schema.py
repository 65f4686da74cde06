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
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

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
    # What the row aggregates over: 'topic' (the total), 'key', 'window', 'key+window',
    # or a job's own grain. Keeps a NULL Kafka key's row apart from the topic total.
    Column("grain", Text, nullable=False),
    Column("key", Text, nullable=True),
    # Start of the event-time window (from Kafka message timestamps).
    Column("window_start", DateTime(timezone=True), nullable=True),
    Column("metric", Numeric, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("id"),
    # NULLs equal, so rows with a NULL key or window are upsert targets (PostgreSQL 15+).
    UniqueConstraint("job", "topic", "grain", "key", "window_start", postgresql_nulls_not_distinct=True),
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

txn_messages = Table(
    "txn_messages",
    metadata,
    Column("job", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("part", Integer, nullable=False),
    Column("off", BigInteger, nullable=False),
    Column("key", LargeBinary, nullable=True),
    Column("value", LargeBinary, nullable=True),
    Column("timestamp", DateTime(timezone=True), nullable=True),
    Column("stored_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # One row per Kafka message: a replay inserts nothing (ON CONFLICT DO NOTHING).
    PrimaryKeyConstraint("job", "topic", "part", "off"),
    comment="Per-message outputs of jobs run with --sink idempotent, stored under their Kafka offset.",
)

txn_outbox = Table(
    "txn_outbox",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("job", Text, nullable=False),
    # Kafka topic the row is published to.
    Column("destination", Text, nullable=False),
    # Stable per commit (job/topic/partition/until): consumers drop redelivered duplicates by it.
    # Not unique: a range committed again after `txstore reset` moved the offset back repeats it.
    Column("dedup_key", Text, nullable=False),
    Column("headers", JSONB, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("sent_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("id"),
    Index("txn_outbox_pending_idx", "job", "id", postgresql_where=text("sent_at IS NULL")),
    comment="Committed results waiting to be published to Kafka, written with their offsets.",
)
