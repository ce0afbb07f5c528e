"""The dashboard's server: the Streamlit app (``app.py``) plus the route that sets and clears
the sign-in cookie (``ablab.dashboards.session``). ``ablab dashboard`` runs this file with
``streamlit run``, which serves ``app`` (an ``st.App``) with uvicorn in this process, so the
route and the app's script runs share one session store."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ablab.dashboards import session

app = st.App(Path(__file__).resolve().with_name("app.py"),
             routes=session.routes(base_url_path=st.get_option("server.baseUrlPath")))
