"""``AblabClient``: fetches the assignment config, refreshes it in the background, assigns locally."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

from ablab.platform.assignment import Assignment, AssignmentConfig, assign, assign_batch
from ablab.platform.assignment.payload import config_from_payload
from ablab.platform.policy.serve import PolicyServer, Served
from ablab.platform.policy.spec import policy_of
from ablab.platform.sdk.sinks import ExposureSink, NullSink

log = logging.getLogger(__name__)


class AblabClient:
    """Deterministic local assignment, identical to the API's ``/v1/assign``.

    The config is fetched once at start (``wait_ready``) and then every ``refresh_s`` with
    ``If-None-Match``, so an unchanged registry costs a 304. Until the first fetch succeeds
    ``assign`` returns no assignments (every unit gets the default experience).
    """

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        refresh_s: float = 10.0,
        sink: ExposureSink | None = None,
        http: httpx.Client | None = None,
        start: bool = True,
    ) -> None:
        self._url = api_url.rstrip("/") + "/v1/sdk/config"
        self._http = http or httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
        self._refresh_s = refresh_s
        self.sink: ExposureSink = sink or NullSink()
        self.config = AssignmentConfig()
        self._etag: str | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._policies = PolicyServer()
        if start:
            self.refresh()
            self._thread = threading.Thread(target=self._loop, name="ablab-sdk-refresh", daemon=True)
            self._thread.start()

    # -- config ------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Fetch the config now; True when it changed. Errors keep the last good config."""
        headers = {"If-None-Match": self._etag} if self._etag else {}
        try:
            response = self._http.get(self._url, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("ablab config fetch failed (%s); keeping revision %s", type(exc).__name__, self.config.revision or "none")
            return False
        if response.status_code == 304:
            self._ready.set()
            return False
        if response.status_code != 200:
            log.warning("ablab config fetch answered %s: %s", response.status_code, response.text[:300])
            return False
        self.config = config_from_payload(response.json())  # one atomic reference swap
        self._etag = response.headers.get("ETag")
        self._ready.set()
        return True

    def wait_ready(self, timeout: float = 10.0) -> bool:
        return self._ready.wait(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self._refresh_s):
            self.refresh()

    # -- assignment --------------------------------------------------------------------

    def assign(
        self,
        unit_id: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        experiments: Iterable[str] | None = None,
        trace_id: str | None = None,
        log_exposure: bool = True,
    ) -> list[Assignment]:
        found = assign(self.config, unit_id, attributes, experiments)
        if log_exposure and found:
            self._expose(unit_id, found, trace_id)
        return found

    def assign_batch(
        self,
        unit_ids: list[str],
        attributes: list[Mapping[str, Any] | None] | None = None,
        *,
        experiments: Iterable[str] | None = None,
    ) -> list[list[Assignment]]:
        return assign_batch(self.config, unit_ids, attributes, experiments)

    def decide(self, assignment: Assignment, trace_id: str, *, prompt_tokens: int | None = None,
               max_tokens: int | None = None, attributes: Mapping[str, Any] | None = None) -> Served | None:
        """For a policy variant's assignment, the arm this request draws (docs/policies.md);
        None for an ordinary strategy. Serve ``served.strategy`` and put ``served.choice_fields()``
        (arm, propensity, policy_version) on the request's exposure and inference events
        (``served.annotate(event)`` adds the features too); ``track`` and ``instrument_openai``
        do both. The draw is by ``trace_id``: the same request, features and model version
        always get the same arm. The model is the config's (``policy_models``), refreshed
        with it; none yet: uniform."""
        policy = policy_of(assignment.strategy)
        if policy is None:
            return None
        model = self.config.policy_models.get((assignment.experiment, assignment.variant))
        return self._policies.decide(assignment.experiment, assignment.variant, policy, draw_key=trace_id, model=model,
                                     prompt_tokens=lambda: prompt_tokens, max_tokens=max_tokens, attributes=attributes)

    def _expose(self, unit_id: str, found: list[Assignment], trace_id: str | None) -> None:
        ts = datetime.now(UTC).isoformat()
        trace = trace_id or uuid.uuid4().hex
        for a in found:
            self.sink.emit(
                {
                    "v": 1,
                    "type": "exposure",
                    "ts": ts,
                    "trace_id": trace,
                    "experiment": a.experiment,
                    "variant": a.variant,
                    "unit_id": unit_id,
                }
            )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sink.close()
        self._http.close()

    def __enter__(self) -> AblabClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
