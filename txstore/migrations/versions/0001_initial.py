"""txn_offsets and txn_data

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "txn_offsets",
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("off", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("job", "topic", "part", name="txn_offsets_pkey"),
        sa.CheckConstraint("off >= 0", name="txn_offsets_off_nonnegative_check"),
        sa.CheckConstraint("part >= 0", name="txn_offsets_part_nonnegative_check"),
        comment="Where each txstore job is in each Kafka partition (next offset to read).",
    )
    op.create_table(
        "txn_data",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("metric", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="txn_data_pkey"),
        sa.UniqueConstraint(
            "job",
            "topic",
            "key",
            "window_start",
            name="txn_data_job_topic_key_window_start_key",
            postgresql_nulls_not_distinct=True,
        ),
        comment="Aggregated results of txstore jobs, committed with their offsets.",
    )


def downgrade() -> None:
    op.drop_table("txn_data")
    op.drop_table("txn_offsets")
