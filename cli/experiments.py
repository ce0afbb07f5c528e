"""`ablab apply -f EXP.yaml`: create or update experiments through the API, idempotently.

The file holds one experiment (the body of ``POST /v1/experiments``), a list of them, or
a mapping with ``factors``, ``layers``, ``holdouts`` and ``experiments`` lists. Declared
factors (the body of ``POST /v1/factors``) are applied first, so the experiments below
may set them. An optional ``status: running|paused|stopped`` per experiment is reached
through the lifecycle endpoints. Applying the same file twice changes nothing the second time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from ablab.cli._common import fail, out
from ablab.platform.config import get_settings

MUTABLE = ("name", "hypothesis", "owner", "traffic", "control", "metrics", "guardrails", "targeting", "forced", "shadow")
LIFECYCLE_PATH = {"running": ["start"], "paused": ["start", "pause"], "stopped": ["stop"]}


def _load(path: Path) -> dict[str, list[dict[str, Any]]]:
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read {path}: {exc}")
    plan: dict[str, list[dict[str, Any]]] = {"factors": [], "layers": [], "holdouts": [], "experiments": []}
    for doc in docs:
        if isinstance(doc, list):
            plan["experiments"].extend(doc)
        elif isinstance(doc, dict) and plan.keys() & doc.keys():
            for kind in plan:
                plan[kind].extend(doc.get(kind) or [])
        elif isinstance(doc, dict):
            plan["experiments"].append(doc)
        else:
            fail(f"{path}: expected a mapping or a list of experiments, got {type(doc).__name__}")
    return plan


def _problem(response: Any) -> str:
    try:
        body = response.json()
        return f"{body.get('detail', body)}"
    except ValueError:
        return response.text[:300]


def _normalized_variants(variants: list[dict[str, Any]]) -> list[tuple[str, float, str | None]]:
    from pydantic import ValidationError

    from ablab.platform.strategy import content_hash

    def digest(strategy: Any) -> str | None:
        try:
            return content_hash(strategy)
        except (ValidationError, TypeError):
            return None  # the API refuses it with the field named

    return [(v.get("key"), float(v.get("weight", 0)), digest(v.get("strategy"))) for v in variants]


FACTOR_FIELDS = {"type": None, "values": None, "min": None, "max": None, "default": None, "description": ""}


def _apply_factors(http: Any, items: list[dict[str, Any]], dry_run: bool) -> list[tuple[str, str, str]]:
    """Declare or update the file's factors; an identical declaration is left alone."""
    if not items:
        return []
    current = {f["name"]: f for f in http.get("/v1/factors").raise_for_status().json()["items"]}
    results = []
    for item in items:
        name = item.get("name") if isinstance(item, dict) else None
        if not name:
            fail("a factor in the file has no name")
        have = current.get(name)
        if have is not None and have["origin"] != "declared":
            fail(f"factor {name}: it is a {have['origin']} factor; declare a name of your own (or params.<field>)")
        desired = {k: item.get(k, d) for k, d in FACTOR_FIELDS.items()}
        if have is None:
            if not dry_run:
                r = http.post("/v1/factors", json=item)
                if r.status_code not in (200, 201):
                    fail(f"factor {name}: {_problem(r)}", hint="fix the field named above in the YAML")
            results.append(("factor", name, "would declare" if dry_run else "declared"))
        elif any(_differs(v, have.get(k)) or (v is None) != (have.get(k) is None) for k, v in desired.items()):
            if not dry_run:
                r = http.put(f"/v1/factors/{name}", json=desired)
                if r.status_code != 200:
                    fail(f"factor {name}: {_problem(r)}")
            results.append(("factor", name, "would update" if dry_run else "updated"))
        else:
            results.append(("factor", name, "unchanged"))
    return results


def apply(
    file: Path = typer.Option(..., "-f", "--file", exists=True, dir_okay=False, help="YAML with experiments (and factors, layers, holdouts)."),
    api_url: str = typer.Option(None, envvar="ABLAB_API_URL", help="API base URL."),
    token: str = typer.Option(..., envvar="ABLAB_TOKEN", help="Editor token (ablab keys create --scope editor)."),
    dry_run: bool = typer.Option(False, help="Show what would change; change nothing."),
) -> None:
    """Create or update experiments (and declared factors, layers, holdouts) from YAML. Idempotent."""
    import httpx

    plan = _load(file)
    base = (api_url or get_settings().api_url).rstrip("/")
    results: list[tuple[str, str, str]] = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        try:
            http.get("/healthz")
        except httpx.HTTPError:
            fail(f"the API at {base} is not reachable", hint="start it with `ablab api` or set ABLAB_API_URL")
        results += _apply_factors(http, plan["factors"], dry_run)
        for kind in ("layers", "holdouts"):
            existing = {item["key"] for item in http.get(f"/v1/{kind}").raise_for_status().json()}
            for item in plan[kind]:
                if item.get("key") in existing:
                    results.append((kind[:-1], item.get("key", "?"), "unchanged"))
                    continue
                if not dry_run:
                    r = http.post(f"/v1/{kind}", json=item)
                    if r.status_code != 201:
                        fail(f"{kind[:-1]} {item.get('key')}: {_problem(r)}")
                results.append((kind[:-1], item["key"], "created"))
        for spec in plan["experiments"]:
            results.append(("experiment", spec.get("key", "?"), _apply_experiment(http, dict(spec), dry_run)))
    table = Table(title=f"ablab apply {file.name}" + (" (dry run)" if dry_run else ""))
    for column in ("kind", "key", "result"):
        table.add_column(column)
    for row in results:
        table.add_row(*row)
    out.print(table)


def _apply_experiment(http: Any, spec: dict[str, Any], dry_run: bool) -> str:
    key = spec.get("key")
    if not key:
        fail("an experiment in the file has no key")
    desired_status = spec.pop("status", None)
    if desired_status not in (None, "draft", *LIFECYCLE_PATH):
        fail(f"experiment {key}: status must be draft, running, paused or stopped, not {desired_status!r}")
    current = http.get(f"/v1/experiments/{key}")
    actions: list[str] = []
    if current.status_code == 404:
        if dry_run:
            return "would create"
        r = http.post("/v1/experiments", json=spec)
        if r.status_code != 201:
            fail(f"experiment {key}: {_problem(r)}", hint="fix the field named above in the YAML")
        current, actions = r, ["created"]
    elif current.status_code != 200:
        fail(f"experiment {key}: {_problem(current)}")
    state = current.json()
    patch = {f: spec[f] for f in MUTABLE if f in spec and _differs(spec[f], state.get(f))}
    if "variants" in spec and _normalized_variants(spec["variants"]) != [
        (v["key"], float(v["weight"]), v["strategy_hash"]) for v in state["variants"]
    ]:
        patch["variants"] = spec["variants"]
        patch["new_phase"] = True
    elif "variants" in spec and any(_differs(v.get("shadow"), s.get("shadow"))
                                    for v, s in zip(spec["variants"], state["variants"])):
        patch["variants"] = spec["variants"]  # the same variants, other shadows: no new phase
    if patch and state["status"] != "stopped":
        if dry_run:
            return "would update " + ", ".join(sorted(k for k in patch if k != "new_phase"))
        r = http.patch(f"/v1/experiments/{key}", json=patch, headers={"If-Match": f'"{state["version"]}"'})
        if r.status_code != 200:
            fail(f"experiment {key}: {_problem(r)}")
        state = r.json()
        actions.append("updated " + ", ".join(sorted(k for k in patch if k != "new_phase")))
    if desired_status and desired_status != state["status"] and desired_status != "draft":
        steps = LIFECYCLE_PATH[desired_status]
        if state["status"] == "paused" and desired_status == "running":
            steps = ["start"]
        if state["status"] == "running" and desired_status == "paused":
            steps = ["pause"]
        if dry_run:
            return f"would {'+'.join(steps)}"
        for step in steps:
            r = http.post(f"/v1/experiments/{key}/{step}")
            if r.status_code != 200:
                fail(f"experiment {key}: {_problem(r)}")
        actions.append(desired_status)
    return "; ".join(actions) or "unchanged"


def _differs(desired: Any, current: Any) -> bool:
    if isinstance(desired, float) or isinstance(current, float):
        try:
            return abs(float(desired) - float(current)) > 1e-12
        except (TypeError, ValueError):
            return True
    if isinstance(desired, list) and isinstance(current, list):
        # The API fills defaults into metrics/guardrails; compare only the fields given.
        return len(desired) != len(current) or any(
            _differs(d, c) for d, c in zip(desired, current)
        )
    if isinstance(desired, dict) and isinstance(current, dict):
        return any(_differs(v, current.get(k)) for k, v in desired.items())
    return desired != current


def register(app: typer.Typer) -> None:
    app.command("apply")(apply)
