"""The dashboard's only way to the data: the ablab HTTP API, with a bearer token.

Errors come back as :class:`ApiError` carrying the problem+json ``detail`` and ``field``
so a form can show the message next to the widget at fault.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ablab.platform.analytics.schemas import Attribution, Results, Timeseries


def allowed_api_urls(api_url: str, extra: Iterable[str] = ()) -> list[str]:
    """The APIs this dashboard may talk to: the one it was started with, then any listed in
    ``ABLAB_DASHBOARD_API_URLS``. Sign-in offers these only; a URL typed by a visitor would
    make this server send requests wherever the visitor likes and show the reply."""
    urls = [u.strip().rstrip("/") for u in (api_url, *extra) if u and u.strip()]
    return list(dict.fromkeys(urls))


def segment(value: str) -> str:
    """One URL path segment: ``/``, ``?``, ``#``, ``%`` and ``..`` cannot change the route."""
    quoted = quote(str(value), safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


@dataclass
class ApiError(Exception):
    status: int
    detail: str
    field: str | None = None
    errors: list[dict[str, Any]] | None = None

    def __str__(self) -> str:
        return f"{self.detail} (HTTP {self.status})"


class ApiClient:
    """Thin typed wrapper over the routes the dashboard uses."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token.strip()}"},
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    # -- plumbing -------------------------------------------------------------------------
    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"cannot reach the ablab API at {self.base_url}: {exc}", "api_url") from exc
        if response.status_code >= 400:
            raise _problem(response)
        return response

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        return self._call(method, path, **kw).json()

    # -- identity -------------------------------------------------------------------------
    def whoami(self) -> dict[str, str]:
        """``{name, scope}``; falls back to probing when the API has no ``/v1/whoami``."""
        try:
            return self._json("GET", "/v1/whoami")
        except ApiError as exc:
            if exc.status != 404:
                raise
        return {"name": "token", "scope": self._probe_scope()}

    def check(self) -> None:
        """Raise :class:`ApiError` unless the API still accepts this token (one cheap read,
        made on every page run: a revoked or expired key shows at the next interaction)."""
        try:
            self._call("GET", "/v1/whoami")
        except ApiError as exc:
            if exc.status != 404:
                raise
            self._call("GET", "/v1/experiments", params={"limit": 1})  # an API without /v1/whoami

    # -- backends -------------------------------------------------------------------------
    def backends(self) -> list[dict[str, Any]]:
        """``GET /v1/backends``: the gateway's LLM backends and whether each serves yet."""
        return list(self._json("GET", "/v1/backends").get("items") or [])

    def _probe_scope(self) -> str:
        self._json("GET", "/v1/experiments", params={"limit": 1})  # 401/403 raise: not even a viewer
        # An invalid body is refused with 422 only after the scope check passed (403 before).
        try:
            self._call("POST", "/v1/layers", json={})
        except ApiError as exc:
            return "editor" if exc.status == 422 else "viewer"
        return "editor"

    # -- experiments ----------------------------------------------------------------------
    def list_experiments(self, *, status: str | None = None, owner: str | None = None, q: str | None = None,
                         archived: str | None = None, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        """``archived``: None (the API's default: left out), "include" or "only"."""
        params = {k: v for k, v in {"status": status, "owner": owner, "q": q, "archived": archived, "limit": limit,
                                    "offset": offset}.items() if v not in (None, "")}
        return self._json("GET", "/v1/experiments", params=params)

    def get_experiment(self, key: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/experiments/{segment(key)}")

    def create_experiment(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/experiments", json=body)

    def update_experiment(self, key: str, body: dict[str, Any], *, version: int) -> dict[str, Any]:
        return self._json("PATCH", f"/v1/experiments/{segment(key)}", json=body, headers={"If-Match": f'"{version}"'})

    def lifecycle(self, key: str, action: str, *, version: int | None = None) -> dict[str, Any]:
        headers = {"If-Match": f'"{version}"'} if version is not None else {}
        return self._json("POST", f"/v1/experiments/{segment(key)}/{segment(action)}", headers=headers)

    def ship(self, key: str, variant: str, *, force: bool = False, reason: str = "") -> dict[str, Any]:
        """``POST …/ship``: ``{experiment, ship, replayed}``; a variant whose decision is not
        ``ship`` is refused (409) unless forced with a reason."""
        return self._json("POST", f"/v1/experiments/{segment(key)}/ship",
                          json={"variant": variant, "force": force, "reason": reason})

    def ship_status(self, key: str) -> dict[str, Any] | None:
        """The ship in force (``GET …/ship``'s ``shipped``), or None."""
        shipped: dict[str, Any] | None = self._json("GET", f"/v1/experiments/{segment(key)}/ship").get("shipped")
        return shipped

    def archive(self, key: str, *, unarchive: bool = False) -> dict[str, Any]:
        return self._json("POST", f"/v1/experiments/{segment(key)}/{'unarchive' if unarchive else 'archive'}")

    def delete_experiment(self, key: str) -> None:
        self._call("DELETE", f"/v1/experiments/{segment(key)}")

    def audit(self, key: str, *, limit: int = 200) -> list[dict[str, Any]]:
        return self._json("GET", f"/v1/experiments/{segment(key)}/audit", params={"limit": limit})

    def layers(self) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/layers")

    def holdouts(self) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/holdouts")

    # -- strategy factors -----------------------------------------------------------------
    def factors(self) -> dict[str, Any]:
        """Built-in, gateway and declared factors (``{items, total}``)."""
        return self._json("GET", "/v1/factors")

    def declare_factor(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/factors", json=body)

    # -- results --------------------------------------------------------------------------
    # Checked against the API's own response models (ablab.platform.analytics.schemas), so a
    # response that is not the contract's shape fails here, not deep in a view; the views get
    # the JSON back (plain dicts, what every chart and table reads).
    def _shaped(self, model: type[Results | Timeseries | Attribution], path: str, **kw: Any) -> dict[str, Any]:
        return model.model_validate(self._json("GET", path, **kw)).model_dump(mode="json")

    def results(self, key: str) -> dict[str, Any]:
        return self._shaped(Results, f"/v1/experiments/{segment(key)}/results")

    def timeseries(self, key: str, *, metric: str) -> dict[str, Any]:
        return self._shaped(Timeseries, f"/v1/experiments/{segment(key)}/timeseries", params={"metric": metric})

    def attribution(self, key: str) -> dict[str, Any]:
        return self._shaped(Attribution, f"/v1/experiments/{segment(key)}/attribution")

    def ope(self, key: str, policy: dict[str, Any], metric: str | None = None) -> dict[str, Any]:
        """``POST …/ope``: what a candidate policy would have achieved on the experiment's
        logged requests (IPS, SNIPS, DR with intervals, ``ess``, ``support``, ``logged``).
        ``metric`` left out: the candidate's objective, else the primary metric."""
        body: dict[str, Any] = {"policy": policy}
        if metric:
            body["metric"] = metric
        answer: dict[str, Any] = self._json("POST", f"/v1/experiments/{segment(key)}/ope", json=body)
        return answer


def _problem(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    detail = body.get("detail") or body.get("title") or response.reason_phrase or "request failed"
    if not isinstance(detail, str):
        detail = str(detail)
    return ApiError(response.status_code, detail, body.get("field"), body.get("errors"))
