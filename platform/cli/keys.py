"""`ablab keys create|revoke`: API tokens, hashed at rest; the token is printed once."""

from __future__ import annotations

import typer

from ablab.platform.cli._common import console, fail, out
from ablab.platform.config import get_settings
from ablab.platform.registry.schemas import Scope

keys_app = typer.Typer(help="API keys.", no_args_is_help=True)


def _sessions():  # noqa: ANN202
    from ablab.platform.registry.db import make_engine, make_sessionmaker
    from ablab.platform.registry.migrate import upgrade

    url = get_settings().resolved_database_url
    upgrade(url)  # a fresh machine can create its first key without a separate step
    return make_sessionmaker(make_engine(url))


@keys_app.command("create")
def create(
    name: str = typer.Option(..., "--name", help="Who or what holds the key."),
    scope: Scope = typer.Option(..., "--scope", help="admin, editor, viewer or sdk."),
) -> None:
    """Create a key. The last line of stdout is the token (shown once; only its hash is kept)."""
    from ablab.platform.auth import create_api_key
    from ablab.platform.registry.db import transaction
    from ablab.platform.registry.service import record_audit

    with transaction(_sessions()) as session:
        key, token = create_api_key(session, name=name, scope=scope)
        record_audit(session, actor="cli", action="create", entity_type="api_key", entity_key=key.prefix, before=None, after={"name": name, "scope": scope.value})
    console.print(f"[green]created[/] key [bold]{name}[/] with scope [bold]{scope.value}[/] (prefix {key.prefix}); store the token now, it is not shown again")
    out.print(token, highlight=False, soft_wrap=True)


@keys_app.command("revoke")
def revoke(prefix: str = typer.Argument(..., help="The key's prefix, as printed by `keys create`.")) -> None:
    """Revoke every key with this prefix (API processes notice within 30 s)."""
    from ablab.platform.auth import revoke_api_key
    from ablab.platform.registry.db import transaction

    with transaction(_sessions()) as session:
        count = revoke_api_key(session, prefix=prefix)
    if not count:
        fail(f"no active key has prefix {prefix!r}")
    console.print(f"revoked {count} key(s)")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
