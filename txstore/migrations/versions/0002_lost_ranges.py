"""txn_lost_ranges: what --fail-on-data-loss false skipped

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "txn_lost_ranges",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("from_off", sa.BigInteger(), nullable=False),
        sa.Column("until_off", sa.BigInteger(), nullable=False),
        sa.Column("detected_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="txn_lost_ranges_pkey"),
        comment="Offset ranges a job skipped with --fail-on-data-loss false, recorded with the offset move.",
    )


def downgrade() -> None:
    op.drop_table("txn_lost_ranges")
