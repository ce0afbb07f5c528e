"""webhook deliveries: signed billing webhooks are accepted once (replay protection)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 16:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('webhook_deliveries',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('expires_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_expires_at'), ['expires_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_expires_at'))
    op.drop_table('webhook_deliveries')
