"""Batches (OpenAI's Batch API): each batch's object and runner, and its answered lines.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "choir_batch",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("runner", sa.String(80), nullable=True),
        sa.Column("heartbeat_at", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_choir_batch_owner", "choir_batch", ["owner"])
    op.create_index("ix_choir_batch_status", "choir_batch", ["status"])
    op.create_table(
        "choir_batch_line",
        sa.Column("batch_id", sa.String(80), primary_key=True),
        sa.Column("line", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("choir_batch_line")
    op.drop_index("ix_choir_batch_status", table_name="choir_batch")
    op.drop_index("ix_choir_batch_owner", table_name="choir_batch")
    op.drop_table("choir_batch")
