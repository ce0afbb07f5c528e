"""`ablab ope`: off-policy evaluation of a candidate policy on an experiment's logged events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ._common import console, fail, out


def _read_table(path: Path) -> Any:
    """Every column of the event file (the analysis reader keeps only its own columns, and
    OPE also needs ``arm``, ``propensity`` and ``policy_version``)."""
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return pq.read_table(path)
    from ablab.platform.analytics.event_files import read_events

    return read_events(path)


def _yaml(path: Path, option: str) -> Any:
    import yaml

    if not path.is_file():
        fail(f"{option}: {path} does not exist")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        fail(f"{option}: {path} is not valid YAML: {exc}")


def ope(
    events: Annotated[Path, typer.Argument(help="Parquet or JSONL file of events (the file `ablab analyze` reads).")],
    config: Annotated[Path, typer.Option("--config", "-c", help="Experiment definition YAML (the API's POST body).")],
    policy: Annotated[Path, typer.Option("--policy", "-p", help="Candidate policy YAML: {kind: fixed|rule|slo_router, ...}.")],
    metric: Annotated[str | None, typer.Option(help="Metric to estimate (default: the candidate's objective, else the primary).")] = None,
    model: Annotated[Path | None, typer.Option(help="A fitted policy model (JSON) for an slo_router candidate; default: cross-fitted on the logs.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the OPE JSON (same as POST …/ope).")] = False,
) -> None:
    """Estimate what a candidate policy would have achieved on the logged requests (IPS, SNIPS, DR)."""
    from ablab.platform.policy.candidate import ope_from_events
    from ablab.platform.policy.model import PolicyModel
    from ablab.platform.policy.spec import PolicyInvalid
    from ablab.platform.stats.spec import SpecError, parse_spec

    try:
        spec = parse_spec(_yaml(config, "--config"))
    except SpecError as exc:
        fail(f"--config {config}: {exc}")
    candidate = _yaml(policy, "--policy")
    fitted = None
    if model is not None:
        try:
            fitted = PolicyModel.from_json(model.read_text())
        except (OSError, ValueError, KeyError) as exc:
            fail(f"--model {model}: {exc}")
    if not events.is_file():
        fail(f"EVENTS: {events} does not exist")
    try:
        doc = ope_from_events(_read_table(events), spec, candidate, metric=metric, model=fitted)
    except PolicyInvalid as exc:
        fail(f"{exc.field}: {exc}")
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    _render(doc)


def _fmt(x: Any) -> str:
    return "—" if x is None else f"{x:.4g}"


def _render(doc: dict[str, Any]) -> None:
    from rich.table import Table

    cand = doc["candidate"]
    table = Table(title=f"{doc['experiment']}: {doc['metric']} under the candidate ({cand['kind']}, {cand['model']})")
    for col in ("estimator", "estimate", "95% CI", "se"):
        table.add_column(col)
    for name in ("ips", "snips", "dr"):
        e = doc[name]
        table.add_row(name, _fmt(e["estimate"]), f"[{_fmt(e['ci'][0])}, {_fmt(e['ci'][1])}]", _fmt(e["se"]))
    out.print(table)
    logged = Table(title="logged arms (measured)")
    for col in ("arm", "n", "units", "mean", "95% CI"):
        logged.add_column(col)
    for row in doc["logged"]:
        logged.add_row(row["arm"], str(row["n"]), str(row["units"]), _fmt(row["estimate"]),
                       f"[{_fmt(row['ci'][0])}, {_fmt(row['ci'][1])}]")
    out.print(logged)
    out.print(f"requests {doc['n']} · units {doc['units']} · effective sample size {doc['ess']:.0f}")
    if doc["support"]["warning"]:
        console.print(f"[yellow]support:[/] {doc['support']['warning']}")
    for note in doc["notes"]:
        console.print(f"[dim]note:[/] {note}")


def register(app: typer.Typer) -> None:
    app.command("ope")(ope)
