"""policy models: each slo_router variant's fitted models, the newest served in the SDK config
and a few older ones kept, so a restarted API serves the model it had and a propensity logged
under an older version can be recomputed

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06 08:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('policy_models',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('experiment_id', sa.Integer(), nullable=False),
    sa.Column('variant', sa.String(length=64), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('model', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('experiment_id', 'variant', 'version')
    )


def downgrade() -> None:
    op.drop_table('policy_models')
