"""txn_outbox_set_aside_idx: the rows set aside, by job (the pending index leaves them out)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Set-aside rows are few, but found without an index they cost a read of every row sent in
    # the last 7 days (once per job in the known-jobs skip scan of `txstore status --job`).
    op.create_index(
        "txn_outbox_set_aside_idx",
        "txn_outbox",
        ["job"],
        postgresql_where=sa.text("sent_at IS NULL AND failed_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("txn_outbox_set_aside_idx", table_name="txn_outbox")
