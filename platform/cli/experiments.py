"""`ablab apply -f EXP.yaml`: create or update experiments through the API, idempotently.

The file holds one experiment (the body of ``POST /v1/experiments``), a list of them, or
a mapping with ``layers``, ``holdouts`` and ``experiments`` lists. An optional
``status: running|paused|stopped`` per experiment is reached through the lifecycle
endpoints. Applying the same file twice changes nothing the second time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from ablab.platform.cli._common import console, fail, out
from ablab.platform.config import get_settings

MUTABLE = ("name", "hypothesis", "owner", "traffic", "control", "metrics", "guardrails", "targeting", "forced")
LIFECYCLE_PATH = {"running": ["start"], "paused": ["start", "pause"], "stopped": ["stop"]}


def _load(path: Path) -> dict[str, list[dict[str, Any]]]:
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read {path}: {exc}")
    plan: dict[str, list[dict[str, Any]]] = {"layers": [], "holdouts": [], "experiments": []}
    for doc in docs:
        if isinstance(doc, list):
            plan["experiments"].extend(doc)
        elif isinstance(doc, dict) and {"layers", "holdouts", "experiments"} & doc.keys():
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


def _normalized_variants(variants: list[dict[str, Any]]) -> list[tuple[str, float, str]]:
    from ablab.platform.strategy import Strategy

    return [(v["key"], float(v["weight"]), Strategy.model_validate(v.get("strategy") or {}).content_hash) for v in variants]


def apply(
    file: Path = typer.Option(..., "-f", "--file", exists=True, dir_okay=False, help="YAML with experiments."),
    api_url: str = typer.Option(None, envvar="ABLAB_API_URL", help="API base URL."),
    token: str = typer.Option(..., envvar="ABLAB_TOKEN", help="Editor token (ablab keys create --scope editor)."),
    dry_run: bool = typer.Option(False, help="Show what would change; change nothing."),
) -> None:
    """Create or update experiments (and layers, holdouts) from YAML. Idempotent."""
    import httpx

    plan = _load(file)
    base = (api_url or get_settings().api_url).rstrip("/")
    results: list[tuple[str, str, str]] = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        try:
            http.get("/healthz")
        except httpx.HTTPError:
            fail(f"the API at {base} is not reachable", hint="start it with `ablab api` or set ABLAB_API_URL")
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
