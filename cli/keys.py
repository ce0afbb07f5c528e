"""`ablab keys create|list|revoke`: API tokens, hashed at rest; the token is printed once."""

from __future__ import annotations

from datetime import timedelta

import typer

from ablab.cli._common import console, fail, out
from ablab.platform.config import get_settings
from ablab.platform.registry.schemas import Scope

keys_app = typer.Typer(help="API keys: create (token shown once), list, revoke.", no_args_is_help=True)


def _sessions():
    from ablab.platform.registry.db import make_engine, make_sessionmaker
    from ablab.platform.registry.migrate import upgrade

    url = get_settings().resolved_database_url
    upgrade(url)  # a fresh machine can create its first key without a separate step
    return make_sessionmaker(make_engine(url))


@keys_app.command("create")
def create(
    name: str = typer.Option(..., "--name", help="Who or what holds the key (unique among active keys)."),
    scope: Scope = typer.Option(..., "--scope", help="admin, editor, viewer or sdk."),
    expires_in_days: float = typer.Option(None, "--expires-in-days", min=0.001, help="Refuse the token after this many days (default: never)."),
) -> None:
    """Create a key. The last line of stdout is the token (shown once; only its hash is kept)."""
    from ablab.platform.auth import create_api_key, key_read
    from ablab.platform.errors import AblabError
    from ablab.platform.registry.db import transaction
    from ablab.platform.registry.models import utcnow
    from ablab.platform.registry.service import record_audit

    expires_at = utcnow() + timedelta(days=expires_in_days) if expires_in_days else None
    try:
        with transaction(_sessions()) as session:
            key, token = create_api_key(session, name=name, scope=scope, expires_at=expires_at)
            record_audit(session, actor="cli", action="create", entity_type="api_key", entity_key=key.prefix, before=None,
                         after=key_read(key).model_dump(mode="json"))
    except AblabError as exc:
        fail(exc.message)
    until = f", expires {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""
    console.print(f"[green]created[/] key [bold]{name}[/] with scope [bold]{scope.value}[/] (id {key.id}, prefix {key.prefix}{until}); "
                  "store the token now, it is not shown again")
    out.print(token, highlight=False, soft_wrap=True)


@keys_app.command("list")
def list_keys(all_keys: bool = typer.Option(False, "--all", help="Also list revoked keys.")) -> None:
    """Every key's id, name, prefix, scope and status (never a token)."""
    from rich.table import Table

    from ablab.platform.auth import key_read, list_api_keys
    from ablab.platform.registry.db import transaction

    with transaction(_sessions()) as session:
        keys, _ = list_api_keys(session, include_revoked=all_keys, limit=100_000)
        rows = [key_read(k) for k in keys]
    table = Table("id", "name", "prefix", "scope", "status", "created", "expires")
    for k in rows:
        table.add_row(str(k.id), k.name, k.prefix, k.scope.value, k.status, f"{k.created_at:%Y-%m-%d %H:%M}",
                      f"{k.expires_at:%Y-%m-%d %H:%M}" if k.expires_at else "never")
    console.print(table if rows else "no keys; create one with `ablab keys create --name NAME --scope SCOPE`")


@keys_app.command("revoke")
def revoke(key: str = typer.Argument(..., help="The key's prefix (as `keys create` printed it) or its id (`keys list`).")) -> None:
    """Revoke a key: every API process refuses its token from the next request on (audited)."""
    from ablab.platform.auth import revoke_api_key, revoke_api_key_by_id
    from ablab.platform.registry.db import transaction
    from ablab.platform.registry.models import ApiKey

    with transaction(_sessions()) as session:
        if key.isdigit() and len(key) < 19:
            found = session.get(ApiKey, int(key))
            count = 0
            if found is not None and found.revoked_at is None:
                revoke_api_key_by_id(session, key_id=found.id, actor="cli")
                count = 1
        else:
            count = revoke_api_key(session, prefix=key, actor="cli")
    if not count:
        fail(f"no active key has prefix or id {key!r}", hint="ablab keys list")
    console.print(f"revoked {count} key(s)")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
