"""Partition history (generation, topic ID, last-message fingerprint); outbox parts and
set-aside rows; txn_bad_messages

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "txn_offsets", sa.Column("generation", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column("txn_offsets", sa.Column("topic_id", sa.Text(), nullable=True))
    op.add_column("txn_offsets", sa.Column("last_off", sa.BigInteger(), nullable=True))
    op.add_column("txn_offsets", sa.Column("last_timestamp", sa.BigInteger(), nullable=True))
    op.add_column("txn_offsets", sa.Column("last_digest", sa.Text(), nullable=True))

    op.add_column(
        "txn_messages", sa.Column("generation", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.drop_constraint("txn_messages_pkey", "txn_messages", type_="primary")
    op.create_primary_key("txn_messages_pkey", "txn_messages", ["job", "topic", "part", "generation", "off"])

    op.add_column("txn_outbox", sa.Column("part", sa.Integer(), server_default=sa.text("1"), nullable=False))
    op.add_column("txn_outbox", sa.Column("parts", sa.Integer(), server_default=sa.text("1"), nullable=False))
    op.add_column("txn_outbox", sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("txn_outbox", sa.Column("failed_reason", sa.Text(), nullable=True))
    op.drop_index("txn_outbox_pending_idx", table_name="txn_outbox")
    op.create_index(
        "txn_outbox_pending_idx",
        "txn_outbox",
        ["job", "id"],
        postgresql_where=sa.text("sent_at IS NULL AND failed_at IS NULL"),
    )

    op.create_table(
        "txn_bad_messages",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("off", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detected_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="txn_bad_messages_pkey"),
        comment="Messages skipped with --on-bad-message skip, recorded with their range's commit.",
    )
    op.create_index(
        "txn_bad_messages_job_topic_part_off_idx", "txn_bad_messages", ["job", "topic", "part", "off"]
    )


def downgrade() -> None:
    op.drop_index("txn_bad_messages_job_topic_part_off_idx", table_name="txn_bad_messages")
    op.drop_table("txn_bad_messages")

    op.drop_index("txn_outbox_pending_idx", table_name="txn_outbox")
    # Set-aside rows were never published; back in the pending queue they are retried.
    op.create_index(
        "txn_outbox_pending_idx", "txn_outbox", ["job", "id"], postgresql_where=sa.text("sent_at IS NULL")
    )
    for column in ("failed_reason", "failed_at", "parts", "part"):
        op.drop_column("txn_outbox", column)

    # Messages of later generations would collide with generation 0 under the old key.
    op.execute("DELETE FROM txn_messages WHERE generation <> 0")
    op.drop_constraint("txn_messages_pkey", "txn_messages", type_="primary")
    op.create_primary_key("txn_messages_pkey", "txn_messages", ["job", "topic", "part", "off"])
    op.drop_column("txn_messages", "generation")

    for column in ("last_digest", "last_timestamp", "last_off", "topic_id", "generation"):
        op.drop_column("txn_offsets", column)
