"""End to end in headless Chromium (Debian's ``chromium``, driven by Playwright):
sign in, create an experiment through the form, see it through the API, start it, open
its results over seeded real data. Screenshots go to a temporary directory, or to
``$ABLAB_SCREENSHOTS_DIR``: ``scripts/screenshots.sh`` sets it to ``docs/screenshots/`` to
refresh the README's on purpose.

Run: ``.venv/bin/python -m pytest tests/browser -m browser`` (``scripts/browser-deps.sh``
installs chromium when it is missing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ablab_testing import ApiServer, start_api, stop_api, wait_http

pytestmark = [pytest.mark.browser, pytest.mark.integration]
CHROMIUM = Path("/usr/bin/chromium")
DASHBOARD_PORT = 18520  # this area's port range is 18500–18599
FORM_KEY = "int8-rollout"


def _seed(home: Path, key: str, design: str, requests: int, units: int) -> None:
    from ablab_testing.dashboard_seed import seed_in_child

    # results count events after the experiment's start, which comes later
    seed_in_child(home=home, experiment=key, design=design, requests=requests, units=units, begin_in_s=600)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, str]]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("/usr/bin/chromium is missing; .ci/run installs it with scripts/browser-deps.sh")
        pytest.skip("Debian chromium not installed (run scripts/browser-deps.sh)")
    from ablab_testing.dashboard_seed import experiment_body

    home = tmp_path_factory.mktemp("e2e-home")
    _seed(home, FORM_KEY, "pair", 8000, 2000)  # the experiment the browser will create
    _seed(home, "factorial", "factorial", 12000, 2000)  # one with four variants, for attribution
    api = start_api(f"sqlite:///{home / 'ablab.db'}", home, {"ABLAB_ANALYTICS": "true", "ABLAB_RUN_LOADER": "false", "ABLAB_GUARDRAIL_INTERVAL_S": "0"})
    with api.client("admin") as admin:
        admin.post("/v1/experiments", json=experiment_body("factorial")).raise_for_status()
        admin.post("/v1/experiments/factorial/start").raise_for_status()
    log = open(home / "dashboard.log", "wb")  # noqa: SIM115 - closed below
    dash = subprocess.Popen([str(Path(sys.executable).with_name("ablab")), "dashboard", "--port", str(DASHBOARD_PORT),
                             "--api-url", api.base_url], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{DASHBOARD_PORT}"
    try:
        wait_http(f"{url}/_stcore/health", dash, home / "dashboard.log", timeout=90)
        yield api, url
    finally:
        dash.terminate()
        try:
            dash.wait(timeout=15)
        except subprocess.TimeoutExpired:
            dash.kill()
        log.close()
        stop_api(api)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: a temporary directory unless a refresh names one."""
    wanted = os.environ.get("ABLAB_SCREENSHOTS_DIR")
    directory = Path(wanted) if wanted else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def page(stack):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(90_000)
        yield pg
        browser.close()


# Every chart on the page has drawn: a Vega view holds a canvas or an svg with a size.
_CHARTS_DRAWN = """() => [...document.querySelectorAll('.vega-embed')].every(
    e => [...e.querySelectorAll('canvas, svg')].some(c => c.getBoundingClientRect().width > 0))"""


def _tall_screenshot(pg, path: Path, height: int) -> None:
    # Streamlit scrolls inside its own container, so a "full page" shot needs a tall viewport.
    pg.set_viewport_size({"width": 1400, "height": height})
    _settle(pg)  # the resize reruns nothing, but the page may still be finishing one
    pg.wait_for_function(_CHARTS_DRAWN, timeout=90_000)
    pg.screenshot(path=str(path))
    pg.set_viewport_size({"width": 1400, "height": 1000})


def _settle(pg) -> None:
    """Wait until Streamlit has finished the current script run (its status widget is gone)."""
    pg.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=90_000)
    time.sleep(0.5)


def _click(pg, name: str) -> None:
    """Press a button from the keyboard: a mouse click lands at coordinates aimed before it,
    and a rerun that moves the layout in between clicked another widget (a weight slider at
    its minimum: the SRM warning in an occasional run)."""
    _settle(pg)
    pg.get_by_role("button", name=name).press("Enter")
    _settle(pg)


def _set_slider(pg, label: str, value: int) -> int:
    """Bring a slider to ``value`` from the keyboard, as a user would, and return where it was.

    Once in a cold CI run both the traffic and the weight slider were at their minimum when
    the form was sent (the screenshot taken just before showed it), with no key or click aimed
    at them; setting them last and asserting what the API stored keeps that from passing
    silently or failing far away, at the results page's SRM check."""
    thumb = pg.get_by_role("slider", name=label)
    was = int(float(thumb.input_value()))
    for _ in range(5):
        now = int(float(thumb.input_value()))
        if now == value:
            return was
        key = "ArrowRight" if now < value else "ArrowLeft"
        for _ in range(abs(value - now)):
            thumb.press(key)
        _settle(pg)
    raise AssertionError(f"slider {label!r} stays at {thumb.input_value()}, wanted {value}")


def test_sign_in_create_start_and_read_results(stack, page, shots):
    from playwright.sync_api import expect

    api, url = stack
    pg = page
    pg.goto(url)
    pg.get_by_label("API token").fill(api.tokens["editor"])
    _click(pg, "Sign in")
    expect(pg.get_by_role("heading", name="Experiments")).to_be_visible()
    expect(pg.get_by_text("1 experiment", exact=True)).to_be_visible()  # the table itself is a canvas
    _tall_screenshot(pg, shots / "experiments.png", 900)

    _click(pg, "➕ New experiment")
    expect(pg.get_by_role("heading", name="New experiment")).to_be_visible()
    pg.get_by_label("Key", exact=True).fill(FORM_KEY)
    pg.keyboard.press("Tab")
    pg.get_by_placeholder("What is being tried").fill("INT8 rollout")  # the factors panel has a "Name" too
    pg.keyboard.press("Tab")
    pg.get_by_label("Variant 2 key").fill("int8")
    pg.keyboard.press("Tab")
    expect(pg.get_by_text("Strategy of int8")).to_be_visible()
    _settle(pg)
    # Keyboard, not the mouse: a click lands at coordinates, and a rerun that moves the
    # layout between aiming and clicking moved another widget (a weight slider, a batch size).
    pg.locator("summary", has_text="Strategy of int8").press("Enter")
    _settle(pg)
    precision = pg.get_by_role("combobox", name="precision")
    precision.press_sequentially("int8")
    # Enter picks the highlighted option only once the filtered list is drawn; pressed before,
    # it picks nothing and the box merely shows the typed text (the form then sent fp32)
    expect(pg.get_by_role("option", name="int8", exact=True)).to_be_visible()
    precision.press("Enter")
    expect(pg.get_by_role("option", name="int8", exact=True)).to_have_count(0)  # the list closed on a choice
    _settle(pg)
    split = {label: _set_slider(pg, label, want)
             for label, want in (("Traffic (% of eligible units)", 100), ("Weight of variant 1 (%)", 50))}
    print(f"sliders before they were set: {split}")

    _tall_screenshot(pg, shots / "create.png", 2400)  # settles first: the last slider's rerun has ended
    _click(pg, "Create experiment")
    expect(pg.get_by_text("Created experiment")).to_be_visible(timeout=30_000)  # the API call and rerun, on a loaded box

    with api.client("viewer") as client:  # the form's experiment, as the API sees it
        exp = client.get(f"/v1/experiments/{FORM_KEY}").json()
    assert exp["name"] == "INT8 rollout" and exp["status"] == "draft"
    assert {v["key"]: v["strategy"]["precision"] for v in exp["variants"]} == {"control": "fp32", "int8": "int8"}
    assert exp["traffic"] == 1.0
    assert {v["key"]: v["weight"] for v in exp["variants"]} == {"control": 50, "int8": 50}

    _click(pg, "▶️ Start")
    expect(pg.get_by_role("button", name="Yes, start")).to_be_visible()  # nothing happens before confirming
    with api.client("viewer") as client:
        assert client.get(f"/v1/experiments/{FORM_KEY}").json()["status"] == "draft"
    _click(pg, "Yes, start")
    expect(pg.get_by_text("Done: start")).to_be_visible()
    with api.client("viewer") as client:
        assert client.get(f"/v1/experiments/{FORM_KEY}").json()["status"] == "running"

    _click(pg, "📊 Results")
    expect(pg.get_by_role("heading", name="Per-variant results")).to_be_visible()
    expect(pg.get_by_text("Traffic split is healthy")).to_be_visible()
    expect(pg.get_by_text("int8 vs control")).to_be_visible()
    _tall_screenshot(pg, shots / "results.png", 3000)

    pg.goto(f"{url}/?page=results&exp=factorial")  # a shared link: a new session signs in, then lands there
    pg.get_by_label("API token").fill(api.tokens["viewer"])
    _click(pg, "Sign in")
    expect(pg.get_by_role("heading", name="Trade-offs and attribution")).to_be_visible()
    expect(pg.get_by_text("Factor effects and interactions")).to_be_visible()
    _tall_screenshot(pg, shots / "attribution.png", 4200)
    for name in ("experiments.png", "create.png", "results.png", "attribution.png"):
        assert (shots / name).stat().st_size > 20_000, name
