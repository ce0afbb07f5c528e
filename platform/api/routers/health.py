"""Liveness, readiness and Prometheus metrics (no auth)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from ablab.platform.api.deps import StateDep
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


@router.get("/metrics")
def metrics(state: StateDep) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
