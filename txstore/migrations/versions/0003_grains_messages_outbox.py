"""txn_data grains and exact NUMERIC metrics; txn_messages (idempotent sink); txn_outbox

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Before 0003 a row's shape was implied by which of key and window_start were NULL.
_IMPLIED_GRAIN = """
CASE WHEN key IS NULL AND window_start IS NULL THEN 'topic'
     WHEN window_start IS NULL THEN 'key'
     WHEN key IS NULL THEN 'window'
     ELSE 'key+window' END
"""


def upgrade() -> None:
    op.add_column("txn_data", sa.Column("grain", sa.Text(), nullable=True))
    op.execute(f"UPDATE txn_data SET grain = {_IMPLIED_GRAIN}")
    op.alter_column("txn_data", "grain", nullable=False)
    op.drop_constraint("txn_data_job_topic_key_window_start_key", "txn_data", type_="unique")
    op.create_unique_constraint(
        "txn_data_job_topic_grain_key_window_start_key",
        "txn_data",
        ["job", "topic", "grain", "key", "window_start"],
        postgresql_nulls_not_distinct=True,
    )
    op.alter_column("txn_data", "metric", type_=sa.Numeric(), existing_nullable=False)

    op.create_table(
        "txn_messages",
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("off", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=True),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.Column("timestamp", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stored_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("job", "topic", "part", "off", name="txn_messages_pkey"),
        comment="Per-message outputs of jobs run with --sink idempotent, stored under their Kafka offset.",
    )
    op.create_table(
        "txn_outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("destination", sa.Text(), nullable=False),
        sa.Column("dedup_key", sa.Text(), nullable=False),
        sa.Column("headers", postgresql.JSONB(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="txn_outbox_pkey"),
        comment="Committed results waiting to be published to Kafka, written with their offsets.",
    )
    op.create_index(
        "txn_outbox_pending_idx",
        "txn_outbox",
        ["job", "id"],
        postgresql_where=sa.text("sent_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("txn_outbox_pending_idx", table_name="txn_outbox")
    op.drop_table("txn_outbox")
    op.drop_table("txn_messages")
    # Rows whose grain is not the one their NULLs imply (e.g. the null-key count, or a
    # job's own grain) cannot be told apart without the column, so they go with it.
    op.execute(f"DELETE FROM txn_data WHERE grain <> {_IMPLIED_GRAIN}")
    op.alter_column(
        "txn_data",
        "metric",
        type_=sa.BigInteger(),
        existing_nullable=False,
        postgresql_using="round(metric)::bigint",
    )
    op.drop_constraint("txn_data_job_topic_grain_key_window_start_key", "txn_data", type_="unique")
    op.create_unique_constraint(
        "txn_data_job_topic_key_window_start_key",
        "txn_data",
        ["job", "topic", "key", "window_start"],
        postgresql_nulls_not_distinct=True,
    )
    op.drop_column("txn_data", "grain")
