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
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

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
    # The partition's history as the job knows it, to notice a topic deleted and recreated.
    # Bumped by `txstore reset` across a recreation; --sink idempotent keys messages by it.
    Column("generation", Integer, nullable=False, server_default=text("0")),
    # The Kafka topic ID (KIP-516) seen at the last commit, where the broker reports one.
    Column("topic_id", Text, nullable=True),
    # Fingerprint of the last message counted: its offset, timestamp (ms) and a digest of
    # key and value. The next range re-reads that message and compares before counting.
    Column("last_off", BigInteger, nullable=True),
    Column("last_timestamp", BigInteger, nullable=True),
    Column("last_digest", Text, nullable=True),
    # The backlog (plan's log end minus offset) each of the last few commits started from,
    # oldest first (txstore.postgres.store.LAG_SAMPLES); `txstore status --check` warns when it grows.
    Column("lag_samples", ARRAY(BigInteger), nullable=False, server_default=text("'{}'")),
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
    # The partition's generation (txn_offsets.generation): a recreated topic's messages
    # never collide with the old topic's under the same offsets.
    Column("generation", Integer, nullable=False, server_default=text("0")),
    Column("off", BigInteger, nullable=False),
    Column("key", LargeBinary, nullable=True),
    Column("value", LargeBinary, nullable=True),
    Column("timestamp", DateTime(timezone=True), nullable=True),
    Column("stored_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # One row per Kafka message: a replay inserts nothing (ON CONFLICT DO NOTHING).
    PrimaryKeyConstraint("job", "topic", "part", "generation", "off"),
    comment="Per-message outputs of jobs run with --sink idempotent, stored under their Kafka offset.",
)

txn_outbox = Table(
    "txn_outbox",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("job", Text, nullable=False),
    # Kafka topic the row is published to.
    Column("destination", Text, nullable=False),
    # The message's Kafka key, job/topic/partition/until/<commit>/<part>: unique per commit
    # (a random id, so a re-count after `txstore reset` is new) and part, repeated by a
    # redelivery; consumers drop redelivered duplicates by it.
    Column("dedup_key", Text, nullable=False),
    Column("headers", JSONB, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("sent_at", DateTime(timezone=True), nullable=True),
    # A commit's results split over several messages: part (1-based) of parts.
    Column("part", Integer, nullable=False, server_default=text("1")),
    Column("parts", Integer, nullable=False, server_default=text("1")),
    # Set aside: publishing failed for a reason retrying cannot fix (too large, topic
    # missing, not authorized); `txstore publish --retry-failed` tries again.
    Column("failed_at", DateTime(timezone=True), nullable=True),
    Column("failed_reason", Text, nullable=True),
    PrimaryKeyConstraint("id"),
    Index(
        "txn_outbox_pending_idx",
        "job",
        "id",
        postgresql_where=text("sent_at IS NULL AND failed_at IS NULL"),
    ),
    # The rows set aside, by job: `txstore publish --retry-failed` and the known-jobs lookup.
    Index(
        "txn_outbox_set_aside_idx",
        "job",
        postgresql_where=text("sent_at IS NULL AND failed_at IS NOT NULL"),
    ),
    comment="Committed results waiting to be published to Kafka, written with their offsets.",
)

txn_bad_messages = Table(
    "txn_bad_messages",
    metadata,
    Column("id", BigInteger, Identity(always=True), nullable=False),
    Column("job", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("part", Integer, nullable=False),
    Column("generation", Integer, nullable=False, server_default=text("0")),
    Column("off", BigInteger, nullable=False),
    # Why the aggregate could not process it: the error's type and first line.
    Column("reason", Text, nullable=False),
    Column("detected_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("id"),
    Index("txn_bad_messages_job_topic_part_off_idx", "job", "topic", "part", "off"),
    comment="Messages skipped with --on-bad-message skip, recorded with their range's commit.",
)

txn_stream_plans = Table(
    "txn_stream_plans",
    metadata,
    Column("job", Text, nullable=False),
    # The micro-batch's start and end as Spark's checkpoint has them ({topic: {partition: offset}}).
    Column("start_offsets", JSONB, nullable=False),
    Column("end_offsets", JSONB, nullable=False),
    # The ranges the source planned for it, with each one's generation and verify message.
    Column("ranges", JSONB, nullable=False),
    Column("planned_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The plan's identity (a digest of job, start and end), which its reading tasks' receipts name.
    Column("plan_id", Text, nullable=False),
    # How many reading tasks it was planned in (each writes one receipt in txn_stream_reads).
    Column("tasks", Integer, nullable=False),
    # Who moved the job's micro-batch offsets last: 'txstore' (the txstore sink, with its
    # results), 'checkpoint' (the source's commit, for a query whose sink is not txstore's).
    Column("committed_by", Text, nullable=True),
    PrimaryKeyConstraint("job"),
    comment="Each streaming job's planned micro-batch (readStream.format('txstore')): its sink commits these ranges.",
)

txn_stream_reads = Table(
    "txn_stream_reads",
    metadata,
    Column("job", Text, nullable=False),
    Column("plan_id", Text, nullable=False),
    # The plan's reading task (its index), and the Spark stage and partition that ran it: the same
    # task under two (stage, partition) pairs was read twice by the query (a self-union or join).
    Column("task", Integer, nullable=False),
    Column("stage", Integer, nullable=False),
    Column("spark_partition", Integer, nullable=False),
    # The streaming query, its run (a restart is a new run) and the micro-batch that read it
    # (Spark's task properties).
    Column("query_id", Text, nullable=True),
    Column("run_id", Text, nullable=True),
    Column("batch_id", BigInteger, nullable=True),
    # Each range read: messages delivered and the last one's fingerprint.
    Column("ranges", JSONB, nullable=False),
    Column("read_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("job", "plan_id", "task", "stage", "spark_partition"),
    comment="What each reading task of a streaming micro-batch read (readStream.format('txstore')): "
    "its sink commits a plan only when this query read all of it, once.",
)

txn_subscriptions = Table(
    "txn_subscriptions",
    metadata,
    Column("job", Text, nullable=False),
    # How the job names its partitions (txstore.core.subscription): {"topics": [...]},
    # {"pattern": "..."} or {"assign": {"topic": [partitions]}}.
    Column("subscription", JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("job"),
    comment="How each job names what it reads (topics, a pattern, assigned partitions), recorded by its "
    "planner: txstore status judges only the partitions that are the job's.",
)
