"""txn_stream_reads: what each reading task of a streaming micro-batch read, for its sink to verify

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plan row left by an older txstore has no identity: its sink could not verify it.
    op.execute("DELETE FROM txn_stream_plans")
    op.add_column("txn_stream_plans", sa.Column("plan_id", sa.Text(), nullable=False))
    op.add_column("txn_stream_plans", sa.Column("tasks", sa.Integer(), nullable=False))
    op.add_column("txn_stream_plans", sa.Column("committed_by", sa.Text(), nullable=True))
    op.create_table(
        "txn_stream_reads",
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("plan_id", sa.Text(), nullable=False),
        sa.Column("task", sa.Integer(), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("spark_partition", sa.Integer(), nullable=False),
        sa.Column("query_id", sa.Text(), nullable=True),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("batch_id", sa.BigInteger(), nullable=True),
        sa.Column("ranges", postgresql.JSONB(), nullable=False),
        sa.Column("read_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint(
            "job", "plan_id", "task", "stage", "spark_partition", name="txn_stream_reads_pkey"
        ),
        comment="What each reading task of a streaming micro-batch read (readStream.format('txstore')): "
        "its sink commits a plan only when this query read all of it, once.",
    )


def downgrade() -> None:
    op.drop_table("txn_stream_reads")
    op.drop_column("txn_stream_plans", "committed_by")
    op.drop_column("txn_stream_plans", "tasks")
    op.drop_column("txn_stream_plans", "plan_id")
