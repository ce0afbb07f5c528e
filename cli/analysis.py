"""`ablab analyze`, `ablab report`, `ablab synth-events`: the offline and terminal faces of the stats engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ._common import console, fail, out


def _load_spec(path: Path):
    import yaml

    from ablab.platform.stats.spec import SpecError, parse_spec

    if not path.is_file():
        fail(f"--config: {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        fail(f"--config: {path} is not valid YAML: {exc}")
    try:
        return parse_spec(data)
    except SpecError as exc:
        fail(f"--config {path}: {exc}")


def _emit(result: dict, *, as_json: bool, csv_path: Path | None) -> None:
    from ablab.platform.stats.render import rich_tables, to_csv

    if csv_path is not None:
        csv_path.write_text(to_csv(result))
        console.print(f"[dim]wrote {csv_path}[/]")
    if as_json:
        out.print_json(json.dumps(result)) if out.is_terminal else print(json.dumps(result, indent=2))
    else:
        for table in rich_tables(result):
            out.print(table)


def analyze(
    events: Annotated[Path, typer.Argument(help="Parquet or JSONL file of events (CONTRACTS shape, mixed types).")],
    config: Annotated[Path, typer.Option("--config", "-c", help="Experiment definition YAML (the API's POST body).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis JSON (same as GET …/results).")] = False,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Also write the metric rows as CSV.")] = None,
    rejects: Annotated[Path | None, typer.Option("--rejects", help="Write rejected events (with reasons) as JSONL.")] = None,
) -> None:
    """Offline analysis of an event file with the same engine and JSON as the results API."""
    spec = _load_spec(config)
    from ablab.platform.analytics.event_files import read_events
    from ablab.platform.analytics.offline import analyze_file_events

    try:
        table = read_events(events)
        results, agg = analyze_file_events(table, spec)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if rejects is not None and agg.rejected is not None:
        with rejects.open("w") as fh:  # dead letters: the rows as read, plus why
            for row in agg.rejected.to_pylist():
                fh.write(json.dumps(row, default=str) + "\n")
    result = results.model_dump(mode="json")  # the JSON GET …/results answers
    rejected = sum(result["data_quality"]["rejected"].values())
    if rejected:
        console.print(f"[yellow]{rejected} malformed events rejected[/] {result['data_quality']['rejected']}")
    _emit(result, as_json=as_json, csv_path=csv_path)


def report(
    key: Annotated[str, typer.Argument(help="Experiment key.")],
    token: Annotated[str | None, typer.Option("--token", envvar="ABLAB_TOKEN", help="API token (viewer scope).")] = None,
    api_url: Annotated[str | None, typer.Option("--api-url", help="Defaults to ABLAB_API_URL.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    csv_path: Annotated[Path | None, typer.Option("--csv")] = None,
) -> None:
    """Fetch GET /v1/experiments/KEY/results and render it."""
    import httpx

    from ablab.platform.config import get_settings

    base = (api_url or get_settings().api_url).rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(f"{base}/v1/experiments/{key}/results", headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the API at {base}: {exc}", hint="start it with `ablab api` or set ABLAB_API_URL")
    if resp.status_code != 200:
        detail = resp.text[:300]
        fail(f"GET /v1/experiments/{key}/results → {resp.status_code}: {detail}",
             hint="pass --token (or ABLAB_TOKEN) with viewer scope" if resp.status_code in (401, 403) else None)
    _emit(resp.json(), as_json=as_json, csv_path=csv_path)


def synth_events(
    path: Annotated[Path, typer.Argument(help="Output file (.parquet or .jsonl).")],
    requests: Annotated[int, typer.Option(help="Inference events.")] = 100_000,
    units: Annotated[int, typer.Option(help="Distinct users.")] = 10_000,
    seed: Annotated[int, typer.Option()] = 0,
    config_out: Annotated[Path | None, typer.Option("--config-out", help="Also write a matching EXP.yaml.")] = None,
) -> None:
    """Write a seeded synthetic event file (two variants, clustered users, late labels)."""
    import yaml

    from ablab.platform.analytics.event_files import write_events
    from ablab.platform.stats.synthetic import DEMO_GUARDRAILS, DEMO_SLOS, spec_dict, synthetic_events

    events = synthetic_events(n_requests=requests, n_units=units, seed=seed)
    write_events(events, path)
    if config_out is not None:
        spec = spec_dict(slos=dict(DEMO_SLOS), guardrails=[dict(g) for g in DEMO_GUARDRAILS])
        config_out.write_text(yaml.safe_dump(spec, sort_keys=False))
    console.print(f"wrote {len(events)} events to {path}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
    app.command("report")(report)
    app.command("synth-events")(synth_events)
