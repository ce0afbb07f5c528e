"""The maps agree with the code: docs/contracts.md's CLI table lists exactly the registered
``ablab`` commands, its HTTP API route table exactly the API's routes, and its gateway
section exactly the gateway's; the README points at docs/architecture.md instead of
keeping a second folder table.

Both directions fail: a command or route the docs promise that the code lacks, and one the
code serves that the docs never mention (a new one is documented in the same commit).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "docs" / "contracts.md"
README = ROOT / "README.md"

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Routes FastAPI adds for its own schema and documentation pages: served, never a contract
# of ours (contracts.md points at `/docs` as a whole).
INTERNAL_API_ROUTES = {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")}


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## ``)."""
    match = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/contracts.md has no '## {heading}' section"
    return match.group(1)


def _first_cells(section: str) -> list[str]:
    """The first cell of every body row of the section's tables (``\\|`` inside a cell is
    an escaped pipe, not a column break)."""
    cells = []
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cell = re.split(r"(?<!\\)\|", line)[1]
        cells.append(cell)
    return cells[1:] if cells else cells  # the header row


def _alternatives(word: str) -> list[str]:
    return word.replace("\\|", "|").split("|")


def _normalise(path: str) -> str:
    """Parameter names differ between prose and code (`{id}`, `{key_id}`): compare shapes."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


# --- the CLI -------------------------------------------------------------------------------

COMMAND_WORD = re.compile(r"[a-z][a-z0-9-]*(?:\\?\|[a-z][a-z0-9-]*)*")


def documented_commands(text: str) -> set[str]:
    """Every command path a `ablab …` span in the CLI table names: the words up to the first
    argument or option, bracketed options dropped, ``a\\|b`` alternatives expanded."""
    found: set[str] = set()
    for cell in _first_cells(_section(text, "CLI")):
        for span in _spans(cell):
            if not span.startswith("ablab "):
                continue
            words = re.sub(r"\s*(\\?\|)\s*", r"\1", re.sub(r"\[[^\]]*\]", "", span)).split()[1:]
            path = list(itertools.takewhile(COMMAND_WORD.fullmatch, words))
            assert path, f"no command in {span!r}"
            found.update(" ".join(p) for p in itertools.product(*map(_alternatives, path)))
    return found


def registered_commands() -> set[str]:
    from typer.main import get_command

    from ablab.cli import app

    def walk(command, prefix: tuple[str, ...]):
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            if not getattr(command, "hidden", False):
                yield " ".join(prefix)
            return
        for name, sub in subcommands.items():
            yield from walk(sub, (*prefix, name))

    return set(walk(get_command(app), ()))


def test_cli_table_lists_exactly_the_registered_commands() -> None:
    documented, registered = documented_commands(CONTRACTS.read_text()), registered_commands()
    assert len(registered) > 20  # the walk reached the whole tree, groups included
    assert not documented - registered, f"documented in docs/contracts.md but not registered: {sorted(documented - registered)}"
    assert not registered - documented, f"registered but missing from docs/contracts.md's CLI table: {sorted(registered - documented)}"


# --- the HTTP API ------------------------------------------------------------------------

ROUTE = re.compile(rf"((?:{'|'.join(METHODS)})(?:\\?\|(?:{'|'.join(METHODS)}))*) (/\S*)")


def _expand_route(span: str) -> set[tuple[str, str]]:
    match = ROUTE.fullmatch(span.strip())
    if not match:
        return set()
    methods, path = match.groups()
    path = re.sub(r"\[?\?.*$", "", path)  # a query string is not part of the route
    segments = [_alternatives(s) for s in path.split("/")]
    return {(m, _normalise("/".join(p))) for m in _alternatives(methods) for p in itertools.product(*segments)}


def documented_routes(text: str) -> set[tuple[str, str]]:
    routes: set[tuple[str, str]] = set()
    for cell in _first_cells(_section(text, "HTTP API")):
        for span in _spans(cell):
            routes |= _expand_route(span)
    return routes


def api_routes(tmp_path: Path) -> set[tuple[str, str]]:
    """The API's routes as its OpenAPI schema publishes them (contracts.md names that schema
    the authoritative list), plus any route outside the schema that is not FastAPI's own."""
    from ablab.platform.api.app import create_app
    from ablab.platform.config import Settings

    app = create_app(Settings(home=tmp_path, analytics=False))
    routes = {(method.upper(), _normalise(path)) for path, item in app.openapi()["paths"].items()
              for method in item if method.upper() in METHODS}
    for route in app.routes:  # FastAPI's own pages sit at the top level, outside the schema
        if hasattr(route, "path") and not getattr(route, "include_in_schema", True):
            routes |= {(m, _normalise(route.path)) for m in route.methods or () if m in METHODS}
    return routes - INTERNAL_API_ROUTES


def test_route_table_lists_exactly_the_api_routes(tmp_path: Path) -> None:
    documented, served = documented_routes(CONTRACTS.read_text()), api_routes(tmp_path)
    assert ("POST", "/v1/experiments/{}/start") in documented  # the parser expands `start\|pause\|stop`
    assert not documented - served, f"documented in docs/contracts.md but not served: {sorted(documented - served)}"
    assert not served - documented, f"served but missing from docs/contracts.md's route table: {sorted(served - documented)}"


def test_gateway_section_names_exactly_the_gateway_routes(tmp_path: Path) -> None:
    """The gateway's OpenAI routes are named in the Gateway section; its probes share the
    route table's `/healthz`, `/readyz`, `/metrics` row."""
    from ablab.platform.gateway.app import create_app
    from ablab.platform.gateway.settings import Backend, GatewaySettings

    text = CONTRACTS.read_text()
    named = set().union(*(_expand_route(s) for s in _spans(_section(text, "Gateway"))))
    probes = {r for r in documented_routes(text) if r[1] in ("/healthz", "/readyz", "/metrics")}
    settings = GatewaySettings(backends={"b": Backend("b", "http://127.0.0.1:9/v1")}, default_backend="b",
                               outbox_dir=tmp_path / "outbox")
    app = create_app(settings, ship=False)  # routes only: the lifespan never runs
    served = {(m, _normalise(r.path)) for r in app.routes for m in r.methods if m in METHODS}
    assert ("POST", "/v1/chat/completions") in served
    assert not named - served, f"named in docs/contracts.md's Gateway section but not served: {sorted(named - served)}"
    assert not served - named - probes, f"served by the gateway but not in docs/contracts.md: {sorted(served - named - probes)}"


# --- one map ------------------------------------------------------------------------------

def test_readme_links_to_the_architecture_map_instead_of_copying_it() -> None:
    readme = README.read_text()
    assert "docs/architecture.md" in readme
    assert not re.search(r"^\|\s*folder\s*\|", readme, re.M), "README.md copies the folder table; link docs/architecture.md"
    assert re.search(r"^\|\s*folder\s*\|", (ROOT / "docs" / "architecture.md").read_text(), re.M)


def test_architecture_folder_table_names_every_package_folder() -> None:
    """Every folder pyproject.toml maps onto ``ablab.*`` has its row, the CLI and the
    gateway included, each where it lives."""
    import tomllib

    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    rows = dict(re.findall(r"^\|\s*`([^`]+)/`\s*\|\s*`?([\w.—-]+)`?", (ROOT / "docs" / "architecture.md").read_text(), re.M))
    for package, folder in mapped.items():
        assert folder in rows, f"docs/architecture.md's folder table has no row for {folder}/ ({package})"
    assert rows["cli"] == "ablab.cli" and rows["platform/gateway"] == "ablab.platform.gateway"
