"""What every page shares: the session context, navigation, and error display."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import streamlit as st

from ablab.dashboards.client import ApiClient, ApiError

PAGES = ("experiments", "new", "edit", "results")


@dataclass
class Context:
    client: ApiClient
    user: str
    scope: str

    @property
    def can_edit(self) -> bool:
        return self.scope in ("admin", "editor")


def goto(page: str, experiment: str | None = None) -> None:
    st.query_params.clear()
    st.query_params["page"] = page
    if experiment:
        st.query_params["exp"] = experiment
    st.rerun()


def current_page() -> tuple[str, str | None]:
    page = st.query_params.get("page", "experiments")
    return (page if page in PAGES else "experiments"), st.query_params.get("exp")


def show_api_error(exc: ApiError, *, what: str) -> None:
    where = f" — field `{exc.field}`" if exc.field else ""
    st.error(f"Could not {what}: {exc.detail}{where}", icon="⚠️")


def field_error(errors: dict[str, str], *names: str) -> None:
    """The message for this field (or any sub-field of it), right under its widget."""
    for name in names:
        for key, message in errors.items():
            if key == name or key.startswith(name + "."):
                suffix = key[len(name) + 1:] if key != name else ""
                st.error(f"{suffix + ': ' if suffix else ''}{message}", icon="✋")
                return


def call(fn: Any, *args: Any, what: str, **kw: Any) -> Any:
    """Run an API call; on failure show why and return None."""
    try:
        return fn(*args, **kw)
    except ApiError as exc:
        show_api_error(exc, what=what)
        return None
