"""End to end in headless Chromium (Debian's ``chromium``, driven by Playwright):
sign in, create an experiment through the form, see it through the API, start it, open
its results over seeded real data; rows that open (experiments, variants, segments);
tables that fit at 1,280 and 1,920 px; the live part of the results page showing a window
written into the store after the page loaded, with no rerun asked for; an experiment
waiting on its LLM backend's build. Screenshots go to a temporary directory, or to
``$ABLAB_SCREENSHOTS_DIR``: ``scripts/screenshots.sh`` sets it to ``docs/screenshots/`` to
refresh the README's on purpose.

The API is the product's app served by ``ablab_testing.live_api``, which adds a loopback
route writing the next 10 s of traffic into the store it owns and a stand-in for the
llama-cpp-python build's state (a fixed 42 %).

Run: ``.venv/bin/python -m pytest tests/browser -m browser`` (``scripts/browser-deps.sh``
installs chromium when it is missing).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ablab_testing import ApiServer, closed_port, stop_api, wait_http

pytestmark = [pytest.mark.browser, pytest.mark.integration]
CHROMIUM = Path("/usr/bin/chromium")
FIRST_PORT, LAST_PORT = 18520, 18599  # this area's port range is 18500–18599
FORM_KEY = "int8-rollout"
WAITING_KEY = "waits-on-llm"  # its variants name the SmolLM2 backend, which is "building"
BUILD = {"state": "building", "done": 120, "total": 280}  # 42 %
WIDTHS = (1280, 1920)


def _dashboard_port() -> int:
    """The first free port from 18520 up: a second run of these tests (another checkout's, or
    one started beside this one) may hold 18520, and its dashboard would answer ours."""
    for port in range(FIRST_PORT, LAST_PORT + 1):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {FIRST_PORT}–{LAST_PORT}")


def _seed(home: Path, key: str, design: str, requests: int, units: int, segments: bool = False) -> None:
    from ablab_testing.dashboard_seed import seed_in_child

    # results count events after the experiment's start, which comes later
    seed_in_child(home=home, experiment=key, design=design, requests=requests, units=units, begin_in_s=600,
                  segments=segments)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, str]]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("/usr/bin/chromium is missing; .ci/run installs it with scripts/browser-deps.sh")
        pytest.skip("Debian chromium not installed (run scripts/browser-deps.sh)")
    from ablab_testing.dashboard_seed import SEGMENTED_METRICS, experiment_body
    from ablab_testing.live_api import start_live_api

    home = tmp_path_factory.mktemp("e2e-home")
    _seed(home, FORM_KEY, "pair", 8000, 2000)  # the experiment the browser will create
    # four variants for attribution, a task domain for segments, a tool-call measure for custom metrics
    _seed(home, "factorial", "factorial", 12000, 2000, segments=True)
    backends = {"smollm2": {"url": f"http://127.0.0.1:{closed_port()}/v1", "kind": "llamacpp"}}
    api = start_live_api(f"sqlite:///{home / 'ablab.db'}", home, {
        "ABLAB_ANALYTICS": "true", "ABLAB_RUN_LOADER": "false", "ABLAB_GUARDRAIL_INTERVAL_S": "0",
        "ABLAB_GATEWAY_BACKENDS": json.dumps(backends), "ABLAB_TEST_BUILD_STATE": json.dumps(BUILD)})
    with api.client("admin") as admin:
        metrics = {"primary": ["e2e_ms"], "slos": {"ttft_ms": 400}, **SEGMENTED_METRICS}
        admin.post("/v1/experiments", json=experiment_body("factorial", metrics=metrics)).raise_for_status()
        admin.post("/v1/experiments/factorial/start").raise_for_status()
        llm = {"backend": "smollm2"}
        admin.post("/v1/experiments", json={
            "key": WAITING_KEY, "name": "SmolLM2 temperature", "traffic": 1, "control": "control",
            "variants": [{"key": "control", "weight": 1, "strategy": llm},
                         {"key": "int8", "weight": 1, "strategy": {**llm, "params": {"temperature": 1.0}}}]}).raise_for_status()
        admin.post(f"/v1/experiments/{WAITING_KEY}/start").raise_for_status()
    log = open(home / "dashboard.log", "wb")
    port = _dashboard_port()
    dash = subprocess.Popen([str(Path(sys.executable).with_name("ablab")), "dashboard", "--port", str(port),
                             "--api-url", api.base_url], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
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
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(90_000)
        # an assertion waits for its state as long as an action does: a Streamlit rerun on a
        # loaded 2-core box can take longer than expect()'s own 5 s default
        expect.set_options(timeout=60_000)
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


def _set_text(pg, label: str, value: str) -> None:
    """Make a text box hold ``value`` (typing it again while a rerun clears it)."""
    box = pg.get_by_label(label, exact=True)
    for _ in range(5):
        if box.input_value() == value:
            return
        box.fill(value)
        box.press("Tab")
        _settle(pg)
    raise AssertionError(f"text box {label!r} holds {box.input_value()!r}, wanted {value!r}")


def test_sign_in_create_start_and_read_results(stack, page, shots):
    from playwright.sync_api import expect

    api, url = stack
    pg = page
    pg.goto(url)
    pg.get_by_label("API token").fill(api.tokens["editor"])
    _click(pg, "Sign in")
    expect(pg.get_by_role("heading", name="Experiments")).to_be_visible()
    expect(pg.get_by_text(re.compile(r"^2 experiments"))).to_be_visible()  # the table itself is a canvas
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

    # Under load a rerun interrupted mid-form once left the first key's box empty (as the
    # sliders were once left at their minimum): checked and set last, as a user would.
    _set_text(pg, "Variant 1 key", "control")
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

    _open(pg, url, "/?page=results&exp=factorial", api.tokens["viewer"])  # a shared link lands there
    expect(pg.get_by_role("heading", name="Trade-offs and attribution")).to_be_visible()
    expect(pg.get_by_text("Factor effects and interactions")).to_be_visible()
    _tall_screenshot(pg, shots / "attribution.png", 4200)
    for name in ("experiments.png", "create.png", "results.png", "attribution.png"):
        assert (shots / name).stat().st_size > 20_000, name


# -- rows that open, tables that fit, live refresh, waiting ----------------------------------
def _open(pg, url: str, path: str, token: str) -> None:
    """Load ``path``; sign in first if this browser has no session (a shared link lands on
    the page it names either way)."""
    pg.goto(f"{url}{path}")
    pg.wait_for_selector('input[type="password"], [data-testid="stSidebar"]')
    if pg.get_by_label("API token").count():
        pg.get_by_label("API token").fill(token)
        _click(pg, "Sign in")
    pg.wait_for_selector('[data-testid="stSidebar"]')
    _settle(pg)


ROW_PX = 35  # the grid's header and row height


def _click_row(pg, table_index: int, row: int) -> None:
    """Click the first cell of a data row: the grid is a canvas, so by position."""
    grid = pg.locator('[data-testid="stDataFrame"]').nth(table_index)
    grid.scroll_into_view_if_needed()
    _settle(pg)
    box = grid.bounding_box()
    pg.mouse.click(box["x"] + 40, box["y"] + ROW_PX * (row + 1) + ROW_PX / 2)


def test_clicking_a_row_opens_its_experiment_variant_and_segment(stack, page, shots):
    from playwright.sync_api import expect

    api, url = stack
    pg = page
    _open(pg, url, "/?page=experiments", api.tokens["viewer"])
    with api.client("viewer") as client:
        listed = [e["key"] for e in client.get("/v1/experiments", params={"limit": 500}).json()["items"]]
    _click_row(pg, 0, listed.index("factorial"))
    expect(pg.get_by_role("heading", name="Results: Prompt compression × INT8")).to_be_visible()
    assert "exp=factorial" in pg.url

    # the per-variant table lists each metric's variants in the experiment's order: the third row is int8's latency
    expect(pg.get_by_role("heading", name="Per-variant results")).to_be_visible()
    _click_row(pg, 0, 2)
    expect(pg.get_by_role("heading", name="Variant int8")).to_be_visible()
    assert "view=variants" in pg.url and "variant=int8" in pg.url
    expect(pg.get_by_text("Against the control")).to_be_visible()

    pg.get_by_role("radio", name="Segments").click()
    expect(pg.get_by_role("heading", name="Segments by dims.domain")).to_be_visible()
    expect(pg.get_by_text("The effect differs by dims.domain")).to_be_visible()  # INT8 is much faster on code
    _tall_screenshot(pg, shots / "segments.png", 1900)
    _click_row(pg, 1, 0)  # the values table (the heterogeneity table comes first)
    expect(pg.get_by_role("heading", name=re.compile(r"^dims\.domain = (chat|code|math)$"))).to_be_visible()
    assert "value=" in pg.url

    pg.get_by_role("radio", name="Custom metrics").click()
    expect(pg.get_by_text("Σ cost_usd ÷ Σ output_tokens × 1000")).to_be_visible()  # the definition beside its numbers
    _tall_screenshot(pg, shots / "custom-metrics.png", 1300)


# Every drawn table: its grid needs no horizontal scrolling, and its box ends inside the window.
_TABLES_FIT = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')].map(e => {
    const grid = e.querySelector('.dvn-scroller'), box = e.getBoundingClientRect();
    return {scroll: grid ? grid.scrollWidth : -1, client: grid ? grid.clientWidth : -1,
            right: Math.round(box.right), window: window.innerWidth};
})"""
_ALL_FIT = f"() => ({_TABLES_FIT})().every(t => t.scroll >= 0 && t.scroll <= t.client + 1 && t.right <= t.window)"

PAGES = {
    "experiments": "/?page=experiments",
    "overview": "/?page=results&exp=factorial",
    "variants": "/?page=results&exp=factorial&view=variants",
    "variant": "/?page=results&exp=factorial&view=variants&variant=compressed_int8",
    "segments": "/?page=results&exp=factorial&view=segments",
    "segment": "/?page=results&exp=factorial&view=segments&dim=dims.domain&value=code",
    "metrics": "/?page=results&exp=factorial&view=metrics",
}


def test_no_table_is_clipped_at_1280_or_1920_px(stack, page, tmp_path):
    api, url = stack
    pg = page
    clipped = {}
    for name, path in PAGES.items():
        pg.set_viewport_size({"width": WIDTHS[0], "height": 1000})
        _open(pg, url, path, api.tokens["viewer"])
        pg.wait_for_selector('[data-testid="stDataFrame"] .dvn-scroller')
        for width in WIDTHS:
            pg.set_viewport_size({"width": width, "height": 1000})
            try:  # the grid lays itself out again after a resize
                pg.wait_for_function(_ALL_FIT, timeout=10_000)
            except Exception:
                clipped[f"{name}@{width}"] = pg.evaluate(_TABLES_FIT)
            pg.screenshot(path=str(tmp_path / f"{name}-{width}.png"), full_page=True)
    assert not clipped, f"tables wider than their box (screenshots in {tmp_path}): {clipped}"


def _window_count(pg) -> int:
    text = pg.get_by_text(re.compile(r"Computed at .* windows")).inner_text()
    return int(re.search(r"(\d+) windows", text).group(1))


def test_the_live_part_shows_a_new_window_without_a_rerun(stack, page):
    from playwright.sync_api import expect

    api, url = stack
    pg = page
    _open(pg, url, "/?page=results&exp=factorial", api.tokens["viewer"])
    pg.get_by_role("radio", name="5 s").click()
    _settle(pg)
    before = _window_count(pg)
    units = pg.get_by_text(re.compile(r"units · [\d,]+ requests")).first.inner_text()
    with api.client(None) as client:  # the next 10 s of traffic, into the store behind the API
        written = client.post("/_test/windows", json={"experiment": "factorial", "requests": 400, "units": 300}).json()
    assert written["window_rows"] == 4, written  # one window per variant
    # nothing is clicked or reloaded from here: the fragment refreshes on its own
    expect(pg.get_by_text(re.compile(rf"\b{before + 1} windows\b"))).to_be_visible(timeout=60_000)
    assert pg.get_by_text(re.compile(r"units · [\d,]+ requests")).first.inner_text() != units  # n moved with it


def test_an_experiment_waiting_on_its_backend_shows_the_build(stack, page, shots):
    from playwright.sync_api import expect

    api, url = stack
    pg = page
    _open(pg, url, f"/?page=results&exp={WAITING_KEY}", api.tokens["viewer"])
    expect(pg.get_by_text("Waiting for the backend to serve")).to_be_visible()
    expect(pg.get_by_text(re.compile(r"Backend smollm2 \(llama\.cpp\) is not serving yet: building llama-cpp-python: 42% \(120/280"))).to_be_visible()
    expect(pg.get_by_text("smollm2: 42% built")).to_be_visible()  # the progress bar's label
    expect(pg.get_by_text("No events for this experiment yet. Events appear")).to_have_count(0)
    pg.get_by_role("radio", name="5 s").click()
    _tall_screenshot(pg, shots / "waiting.png", 900)
    # its first events: the page becomes the results page on its own
    with api.client(None) as client:
        client.post("/_test/windows", json={"experiment": WAITING_KEY, "design": "pair", "requests": 300}).raise_for_status()
    expect(pg.get_by_role("heading", name="Per-variant results")).to_be_visible(timeout=60_000)
