"""txn_subscriptions: how each job names what it reads, for txstore status to judge only its partitions

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A role that may move a job's offsets (the README's job role) records the job's subscription
# too, and a role that may plan a stream (UPDATE on txn_stream_plans) records its reading tasks'
# receipts (txn_stream_reads, revision 0008, which granted nothing): granted here, so that jobs
# and streams running as such a role keep running after the upgrade.
_GRANT = """
DO $$
DECLARE r text;
BEGIN
  FOR r IN
    SELECT DISTINCT grantee FROM information_schema.role_table_grants
    WHERE table_schema = current_schema() AND table_name = '{given}' AND privilege_type = 'UPDATE'
      AND grantee <> current_user AND grantee <> 'PUBLIC'
  LOOP
    EXECUTE format('GRANT {privileges} ON {table} TO %I', r);
  END LOOP;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "txn_subscriptions",
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("subscription", postgresql.JSONB(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("job", name="txn_subscriptions_pkey"),
        comment="How each job names what it reads (topics, a pattern, assigned partitions), recorded by its "
        "planner: txstore status judges only the partitions that are the job's.",
    )
    op.execute(
        _GRANT.format(given="txn_offsets", privileges="SELECT, INSERT, UPDATE", table="txn_subscriptions")
    )
    op.execute(
        _GRANT.format(
            given="txn_stream_plans", privileges="SELECT, INSERT, UPDATE, DELETE", table="txn_stream_reads"
        )
    )


def downgrade() -> None:
    op.drop_table("txn_subscriptions")
