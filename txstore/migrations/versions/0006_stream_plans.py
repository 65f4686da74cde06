"""txn_stream_plans: each streaming job's planned micro-batch, where its sink finds the ranges

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "txn_stream_plans",
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("start_offsets", postgresql.JSONB(), nullable=False),
        sa.Column("end_offsets", postgresql.JSONB(), nullable=False),
        sa.Column("ranges", postgresql.JSONB(), nullable=False),
        sa.Column("planned_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("job", name="txn_stream_plans_pkey"),
        comment="Each streaming job's planned micro-batch (readStream.format('txstore')): its sink commits these ranges.",
    )


def downgrade() -> None:
    op.drop_table("txn_stream_plans")
