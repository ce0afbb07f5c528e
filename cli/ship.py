"""`ablab ship KEY VARIANT`: ship a winning variant to all of an experiment's traffic.

Shows the experiment's split now and after, and the variant's decision with its reasons,
asks for confirmation (``--yes`` skips it), then calls ``POST /v1/experiments/{key}/ship``,
which decides: a variant ships when its decision is ``ship``; ``--force --reason`` ships one
that is not (audited as forced). A variant already shipped is reported, not shipped again.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from ablab.cli._common import console, fail, out
from ablab.platform.config import get_settings

DECISION_WORDS = {"ship": "[green]ship[/]", "no_ship": "[red]do not ship[/]", "keep_running": "[yellow]keep running[/]"}


def _problem(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    return body if isinstance(body, dict) else {}


def _split(exp: dict[str, Any]) -> str:
    live = [v for v in exp["variants"] if v["weight"] > 0]
    total = sum(v["weight"] for v in live) or 1.0
    return ", ".join(f"{escape(v['key'])} {v['weight'] / total:.0%}" + (" (paused)" if v.get("paused") else "") for v in live)


def _decision(http: Any, key: str, variant: str) -> tuple[str | None, list[str], str | None]:
    """(decision, reasons, why there is none) from the experiment's current results."""
    r = http.get(f"/v1/experiments/{key}/results")
    if r.status_code != 200:
        return None, [], str(_problem(r).get("detail") or f"HTTP {r.status_code}")
    found = next((d for d in r.json().get("decisions") or [] if d.get("variant") == variant), None)
    if found is None:
        return None, [], "the control has no decision of its own" if r.json().get("control") == variant else "no decision yet"
    return found["decision"], list(found.get("reasons") or []), None


def ship(
    key: str = typer.Argument(..., help="The experiment's key."),
    variant: str = typer.Argument(..., help="The variant to ship to all of its traffic."),
    force: bool = typer.Option(False, "--force", help="Ship although its decision is not 'ship' (needs --reason; audited as forced)."),
    reason: str = typer.Option("", "--reason", help="Why; kept in the audit log (required with --force)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    api_url: str = typer.Option(None, envvar="ABLAB_API_URL", help="API base URL."),
    token: str = typer.Option(..., envvar="ABLAB_TOKEN", help="Editor token (ablab keys create --scope editor)."),
) -> None:
    """Ship VARIANT to all of experiment KEY's traffic, as an audited new phase."""
    import httpx

    if force and not reason.strip():
        fail("--force needs --reason: a forced ship is audited with why", hint=f'ablab ship {key} {variant} --force --reason "..."')
    base = (api_url or get_settings().api_url).rstrip("/")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        try:
            got = http.get(f"/v1/experiments/{key}")
        except httpx.HTTPError:
            fail(f"the API at {base} is not reachable", hint="start it with `ablab api` or set ABLAB_API_URL")
        if got.status_code != 200:
            fail(str(_problem(got).get("detail") or f"HTTP {got.status_code}"))
        exp = got.json()
        shipped = (http.get(f"/v1/experiments/{key}/ship").json() or {}).get("shipped")
        if shipped and shipped["variant"] == variant:
            console.print(f"[green]already shipped:[/] {escape(variant)} has all of {escape(key)}'s traffic since phase "
                          f"{shipped['phase']} ({escape(shipped['actor'])}, {shipped['at']})")
            _summary(exp, shipped, replayed=True)
            return
        decision, reasons, missing = _decision(http, key, variant)
        _preview(exp, variant, decision, reasons, missing, force)
        if not yes and not typer.confirm(f"Ship {variant} to all of {key}'s traffic (a new phase)?", default=False):
            console.print("nothing shipped")
            raise typer.Exit(1)
        r = http.post(f"/v1/experiments/{key}/ship", json={"variant": variant, "force": force, "reason": reason})
    body = _problem(r)
    if r.status_code == 200:
        _summary(body["experiment"], body["ship"], replayed=body.get("replayed", False))
        return
    for line in body.get("reasons") or []:
        console.print(f"  [dim]·[/] {escape(str(line))}")
    hint = {403: "shipping needs an editor token (ablab keys create --scope editor)",
            409: f'if you know why it should ship anyway: ablab ship {key} {variant} --force --reason "..."'}.get(r.status_code)
    fail(escape(str(body.get("detail") or f"HTTP {r.status_code}")), hint=None if force else hint)


def _preview(exp: dict[str, Any], variant: str, decision: str | None, reasons: list[str], missing: str | None,
             force: bool) -> None:
    table = Table(title=f"ship {escape(variant)} in {escape(exp['key'])}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", f"{exp['status']}, phase {exp['phase']}, traffic {exp['traffic']:.0%}")
    table.add_row("split now", _split(exp))
    table.add_row("after", f"{escape(variant)} 100% of the experiment's traffic, phase {exp['phase'] + 1}"
                  + (f"; {len(exp['forced'])} forced unit(s) cleared" if exp.get("forced") else ""))
    table.add_row("kept", "targeting, layer range and holdout: the experiment's population does not change")
    table.add_row("decision", DECISION_WORDS.get(decision or "", escape(decision or f"none ({missing})")))
    for line in reasons:
        table.add_row("", escape(line))
    if force:
        table.add_row("forced", "[red]yes[/]: audited as a forced ship")
    out.print(table)


def _summary(exp: dict[str, Any], ship: dict[str, Any], *, replayed: bool) -> None:
    table = Table(title=f"{escape(exp['key'])}: {escape(ship['variant'])} shipped" + (" (already)" if replayed else ""),
                  show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("phase", f"{ship['previous_phase']} → {ship['phase']}")
    table.add_row("split", _split(exp))
    table.add_row("by", f"{escape(ship['actor'])} at {ship['at']}")
    table.add_row("decision", DECISION_WORDS.get(ship.get("decision") or "", escape(str(ship.get("decision")))))
    for line in ship.get("reasons") or []:
        table.add_row("", escape(line))
    if ship.get("forced"):
        table.add_row("forced", f"[red]yes[/]: {escape(ship.get('reason') or '')}")
    table.add_row("audit", f"GET /v1/experiments/{escape(exp['key'])}/audit (action ship)")
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("ship")(ship)
