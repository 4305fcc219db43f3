"""The response table as create_all made it before migrations (no version table then: such a database is
stamped 0001 by choir/plugins/store/migrate.py, then upgraded).

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "choir_response",
        sa.Column("id", sa.String(300), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.Column("conversation", sa.JSON(), nullable=False),
    )
    op.create_index("ix_choir_response_owner", "choir_response", ["owner"])
    op.create_index("ix_choir_response_expires_at", "choir_response", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_choir_response_expires_at", table_name="choir_response")
    op.drop_index("ix_choir_response_owner", table_name="choir_response")
    op.drop_table("choir_response")
