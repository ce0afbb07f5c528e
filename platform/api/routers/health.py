"""Liveness, readiness and Prometheus metrics (no auth)."""

from __future__ import annotations

import re

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from ablab.platform.api.deps import StateDep
from ablab.platform.api.state import AppState
from ablab.platform.api.problems import problem

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(state: StateDep) -> Response:
    checks: dict[str, str] = {}
    try:
        with state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        checks["database"] = f"ok (migration {revision})"
    except Exception as exc:  # noqa: BLE001 - report any failure as not ready
        checks["database"] = f"failed: {type(exc).__name__}"
    for name, probe in state.extras.get("readiness", {}).items():
        try:
            checks[name] = probe()
        except Exception as exc:  # noqa: BLE001
            checks[name] = f"failed: {type(exc).__name__}: {exc}"
    failed = [k for k, v in checks.items() if v.startswith("failed")]
    if failed:
        return problem(503, "Not ready", f"not ready: {', '.join(failed)} (run `ablab db upgrade`?)", checks=checks)
    from fastapi.responses import JSONResponse

    return JSONResponse({"status": "ready", "checks": checks})


def _pipeline_lines(state: AppState) -> list[str]:
    """Counters owned by the streaming components, in Prometheus text format."""
    values: dict[str, float] = {}
    ingest = state.extras.get("ingest")
    if ingest is not None:
        for name, count in ingest.stats.as_dict().items():
            values["ablab_ingest_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)] = count
        for name, count in ingest.emitter.counters().items():
            values["ablab_emitter_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)] = float(count)
    analytics = state.extras.get("analytics")
    if analytics is not None and analytics.loader is not None:
        loader = analytics.loader.stats.as_dict()
        values["ablab_loader_consumed"] = loader["consumed"]
        values["ablab_loader_batches"] = loader["batches"]
        values["ablab_loader_dead_lettered"] = loader["dead_lettered_total"]
        for table, count in loader["loaded"].items():
            values[f"ablab_loader_loaded_{re.sub(r'[^a-zA-Z0-9_]', '_', table)}"] = count
    return [f"{name} {value}" for name, value in sorted(values.items())]


@router.get("/metrics")
def metrics(state: StateDep) -> Response:
    text_out = generate_latest(state.metrics.registry).decode() + "\n".join(_pipeline_lines(state)) + "\n"
    return Response(text_out, media_type=CONTENT_TYPE_LATEST)
