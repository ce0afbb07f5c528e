"""shadow traffic: an experiment's and a variant's optional shadow ({strategy, fraction,
max_concurrency, timeout_s}; null: none)

Revision ID: 0005
Revises: 0002 (the chain is 0001 -> 0003 -> 0004 -> 0002 -> 0005)
Create Date: 2026-12-05 12:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('experiments', sa.Column('shadow', sa.JSON(), nullable=True))
    op.add_column('variants', sa.Column('shadow', sa.JSON(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 has it): a batch copy of `experiments` would drop
    # the old table, and with foreign keys on that cascades into `variants`.
    op.execute("ALTER TABLE variants DROP COLUMN shadow")
    op.execute("ALTER TABLE experiments DROP COLUMN shadow")
