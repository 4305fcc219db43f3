"""Files (OpenAI's Files API, for the Batch API): their bytes and what is said of them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "choir_file",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_choir_file_owner", "choir_file", ["owner"])
    op.create_index("ix_choir_file_expires_at", "choir_file", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_choir_file_expires_at", table_name="choir_file")
    op.drop_index("ix_choir_file_owner", table_name="choir_file")
    op.drop_table("choir_file")
