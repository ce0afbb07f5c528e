"""key expiry, one active key per name, the auth revision counter, experiment archiving

Revision ID: 0002
Revises: 0004 (numbered 0002 when assigned; 0003 and 0004 landed first, so it follows them
and the chain stays linear: 0001 -> 0003 -> 0004 -> 0002)
Create Date: 2026-12-04 16:30:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0004'
branch_labels = None
depends_on = None

ACTIVE = sa.text("revoked_at IS NULL")


def upgrade() -> None:
    op.add_column('api_keys', sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
    # Names become unique among active keys. Older databases may hold several active keys
    # with one name: the oldest keeps it, the others get their id appended ("name #7"),
    # so every token keeps working and the list tells them apart.
    bind = op.get_bind()
    keys = sa.table('api_keys', sa.column('id', sa.Integer), sa.column('name', sa.String), sa.column('revoked_at', sa.DateTime))
    seen: set[str] = set()
    for key_id, name in bind.execute(sa.select(keys.c.id, keys.c.name).where(keys.c.revoked_at.is_(None)).order_by(keys.c.id)):
        if name in seen:
            bind.execute(keys.update().where(keys.c.id == key_id).values(name=f"{name[:190]} #{key_id}"))
        seen.add(name)
    op.create_index('uq_api_keys_active_name', 'api_keys', ['name'], unique=True,
                    sqlite_where=ACTIVE, postgresql_where=ACTIVE)

    op.create_table('auth_revision',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.execute("INSERT INTO auth_revision (id, revision) VALUES (1, 0)")

    op.add_column('experiments', sa.Column('archived_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 has it): a batch copy of `experiments` would drop
    # the old table, and with foreign keys on that cascades into `variants`.
    op.execute("ALTER TABLE experiments DROP COLUMN archived_at")
    op.drop_table('auth_revision')
    op.drop_index('uq_api_keys_active_name', table_name='api_keys')
    op.execute("ALTER TABLE api_keys DROP COLUMN expires_at")
