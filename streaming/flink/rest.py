"""The Flink JobManager's REST API: job state, checkpoints, savepoints, stop and cancel.

Any Flink cluster (the local session cluster of :mod:`ablab.streaming.flink.cluster`, a
standalone or Kubernetes one) answers these; ``rest_url`` is ``http://host:8081``.
Savepoints and stop-with-savepoint are asynchronous operations: a trigger returns a
request id and :func:`wait_operation` polls it until Flink reports the result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx


class RestError(RuntimeError):
    """The JobManager did not answer, or answered with an error (the message has its text)."""


def _call(method: str, rest_url: str, path: str, *, json: dict | None = None, timeout_s: float = 10.0) -> Any:
    try:
        response = httpx.request(method, rest_url.rstrip("/") + path, json=json, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise RestError(f"no answer from the JobManager at {rest_url} ({type(exc).__name__}); "
                        "is the cluster running (`ablab flink status`)?") from exc
    if response.status_code >= 400:
        try:
            errors = response.json().get("errors", [])
        except ValueError:
            errors = [response.text]
        first = str(errors[0]).strip().splitlines()[0] if errors else ""
        raise RestError(f"{method} {path}: HTTP {response.status_code} {first}")
    return response.json() if response.content else {}


def get(rest_url: str, path: str) -> Any:
    return _call("GET", rest_url, path)


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    name: str
    state: str
    """CREATED, RUNNING, RESTARTING, FAILING, FINISHED, CANCELED, FAILED, ..."""
    completed_checkpoints: int
    latest_checkpoint: int | None
    """id of the newest completed checkpoint"""
    restored_checkpoint: int | None
    """id of the checkpoint or savepoint the job last restored from (None: never restored)"""
    restored_at: int | None
    """when that restore happened (ms since the epoch)"""
    running_tasks: int
    total_tasks: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def jobs(rest_url: str) -> list[dict[str, Any]]:
    """Every job the cluster knows: ``{jid, name, state, start-time, ...}``, newest first."""
    found = get(rest_url, "/jobs/overview").get("jobs", [])
    return sorted(found, key=lambda job: job.get("start-time", 0), reverse=True)


def job_status(rest_url: str, job_id: str) -> JobStatus:
    job = get(rest_url, f"/jobs/{job_id}")
    checkpoints = get(rest_url, f"/jobs/{job_id}/checkpoints")
    latest = checkpoints.get("latest") or {}
    completed = latest.get("completed") or {}
    restored = latest.get("restored") or {}
    vertices = job.get("vertices", [])
    return JobStatus(
        job_id=job_id, name=job.get("name", ""), state=job.get("state", "UNKNOWN"),
        completed_checkpoints=int((checkpoints.get("counts") or {}).get("completed", 0)),
        latest_checkpoint=completed.get("id"), restored_checkpoint=restored.get("id"),
        restored_at=restored.get("restore_timestamp"),
        running_tasks=sum(int(v.get("tasks", {}).get("RUNNING", 0)) for v in vertices),
        total_tasks=sum(int(v.get("parallelism", 0)) for v in vertices),
    )


def cancel(rest_url: str, job_id: str) -> None:
    """Cancel without a savepoint (retained checkpoints stay: the job can resume from them)."""
    _call("PATCH", rest_url, f"/jobs/{job_id}?mode=cancel")


def trigger_savepoint(rest_url: str, job_id: str, *, target_dir: str | None = None, cancel_job: bool = False) -> str:
    body: dict[str, Any] = {"cancel-job": cancel_job, "formatType": "CANONICAL"}
    if target_dir:
        body["target-directory"] = target_dir
    return _call("POST", rest_url, f"/jobs/{job_id}/savepoints", json=body)["request-id"]


def trigger_stop(rest_url: str, job_id: str, *, target_dir: str | None = None, drain: bool = False) -> str:
    """Stop with a savepoint: sources stop, a final savepoint is taken, the job finishes."""
    body: dict[str, Any] = {"drain": drain, "formatType": "CANONICAL"}
    if target_dir:
        body["targetDirectory"] = target_dir
    return _call("POST", rest_url, f"/jobs/{job_id}/stop", json=body)["request-id"]


def wait_operation(rest_url: str, job_id: str, request_id: str, *, timeout_s: float = 120.0) -> str:
    """Wait for a savepoint (or stop) operation; return the savepoint's location."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = get(rest_url, f"/jobs/{job_id}/savepoints/{request_id}")
        if answer.get("status", {}).get("id") == "COMPLETED":
            operation = answer.get("operation") or {}
            if "failure-cause" in operation:
                cause = operation["failure-cause"]
                text = cause.get("stack-trace", str(cause)) if isinstance(cause, dict) else str(cause)
                raise RestError(f"the savepoint of job {job_id} failed: {text.strip().splitlines()[0]}")
            return operation["location"]
        time.sleep(0.5)
    raise RestError(f"the savepoint of job {job_id} did not complete in {timeout_s:.0f}s")


def wait_for_checkpoint(rest_url: str, job_id: str, *, after: int | None = None, timeout_s: float = 120.0) -> int:
    """Wait until a checkpoint newer than ``after`` completed; return its id."""
    deadline = time.monotonic() + timeout_s
    last: JobStatus | None = None
    while time.monotonic() < deadline:
        try:
            last = job_status(rest_url, job_id)
        except RestError:
            last = None
        if last is not None and last.latest_checkpoint is not None and (after is None or last.latest_checkpoint > after):
            return last.latest_checkpoint
        if last is not None and last.state in ("FAILED", "CANCELED", "FINISHED"):
            raise RestError(f"job {job_id} is {last.state}; no further checkpoint will come")
        time.sleep(0.5)
    raise RestError(f"no checkpoint of job {job_id} after {after} in {timeout_s:.0f}s (last status: {last})")
