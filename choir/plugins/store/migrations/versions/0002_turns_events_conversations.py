"""A response keeps its own turn and a link to the one it continued; background responses' events; conversations.

choir_response gains `status` (existing rows: 'completed', all they could be), `background` (existing: false),
`previous_id` and `heartbeat_at` (existing: NULL), and loses `conversation`, the chat messages through each
response. That history is not rebuilt: a `previous_response_id` naming a response stored before this revision
continues from that response's own turn (its input items and output) alone, not the turns before it.
New tables: choir_response_event (a background response's stream), choir_conversation and
choir_conversation_item (the Conversations API).

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ID = sa.String(300)
Sequence = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: the rowid; PostgreSQL: BIGSERIAL


def upgrade() -> None:
    # Batches (SQLite recreates the table): the columns come nullable, are filled, then made NOT NULL.
    with op.batch_alter_table("choir_response") as batch:
        batch.add_column(sa.Column("status", sa.String(16), nullable=True))
        batch.add_column(sa.Column("background", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("previous_id", ID, nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.BigInteger(), nullable=True))
        batch.drop_column("conversation")
    response = sa.table("choir_response", sa.column("status", sa.String(16)), sa.column("background", sa.Boolean()))
    op.execute(response.update().values(status="completed", background=False))
    with op.batch_alter_table("choir_response") as batch:
        batch.alter_column("status", existing_type=sa.String(16), nullable=False)
        batch.alter_column("background", existing_type=sa.Boolean(), nullable=False)

    op.create_table(
        "choir_response_event",
        sa.Column("response_id", ID, primary_key=True),
        sa.Column("sequence", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(80), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
    )
    op.create_table(
        "choir_conversation",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
    )
    op.create_index("ix_choir_conversation_owner", "choir_conversation", ["owner"])
    op.create_index("ix_choir_conversation_expires_at", "choir_conversation", ["expires_at"])
    op.create_table(
        "choir_conversation_item",
        sa.Column("position", Sequence, primary_key=True, autoincrement=True),
        sa.Column("id", ID, nullable=False),
        sa.Column("conversation_id", sa.String(80), nullable=False),
        sa.Column("item", sa.JSON(), nullable=False),
        sa.UniqueConstraint("conversation_id", "id", name="uq_choir_conversation_item"),
    )
    op.create_index("ix_choir_conversation_item_conversation_id", "choir_conversation_item", ["conversation_id"])


def downgrade() -> None:
    op.drop_index("ix_choir_conversation_item_conversation_id", table_name="choir_conversation_item")
    op.drop_table("choir_conversation_item")
    op.drop_index("ix_choir_conversation_expires_at", table_name="choir_conversation")
    op.drop_index("ix_choir_conversation_owner", table_name="choir_conversation")
    op.drop_table("choir_conversation")
    op.drop_table("choir_response_event")
    # The old rows' conversations come back empty: a continuation of one sees no earlier turns.
    with op.batch_alter_table("choir_response") as batch:
        batch.add_column(sa.Column("conversation", sa.JSON(), nullable=True))
    response = sa.table("choir_response", sa.column("conversation", sa.JSON()))
    op.execute(response.update().values(conversation=[]))
    with op.batch_alter_table("choir_response") as batch:
        batch.alter_column("conversation", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("heartbeat_at")
        batch.drop_column("previous_id")
        batch.drop_column("background")
        batch.drop_column("status")
