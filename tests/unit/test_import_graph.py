"""The import graph of the ablab packages, read from the source with ``ast``.

Three rules the architecture rests on (docs/architecture.md):

- no import cycles between subpackages (``ablab.platform.stats``, ``ablab.streaming.store``,
  ``ablab.inference.model``, a top-level module such as ``ablab.platform.config`` counts as
  its own), and none between the top-level packages;
- ``ablab.platform`` (the control plane, the SDK and the gateway) imports none of
  ``ablab.streaming``, ``ablab.inference``, ``ablab.dashboards``, ``ablab.cli``: the
  implementations it needs are passed in through protocols (``platform/api/ports.py``) by
  ``ablab.cli``, the one package that wires everything;
- ``ablab.platform.stats`` (the statistics) does no I/O: none of its modules, nor any ablab
  module they import, imports a database, network, process or file-system library or calls
  ``open``.

Every import counts, also those inside functions (a lazy import is still a dependency) and
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {
    "platform": "ablab.platform",
    "streaming": "ablab.streaming",
    "inference": "ablab.inference",
    "dashboards": "ablab.dashboards",
    "migrations": "ablab.migrations",
    "cli": "ablab.cli",
}

# Which top-level package may import which (besides itself). migrations holds the Alembic
# environment, which reads the registry's models.
MAY_IMPORT = {
    "ablab.platform": {"ablab.migrations"},
    "ablab.migrations": {"ablab.platform"},
    "ablab.streaming": {"ablab.platform"},
    "ablab.inference": {"ablab.platform"},
    "ablab.dashboards": {"ablab.platform", "ablab.streaming"},
    "ablab.cli": {"ablab.platform", "ablab.streaming", "ablab.inference", "ablab.dashboards", "ablab.migrations"},
}

# Libraries that reach a database, the network, another process or the file system.
IO_MODULES = frozenset({
    "alembic", "chdb", "clickhouse_connect", "psycopg", "sqlalchemy",  # databases
    "httpx", "requests", "urllib.request", "http.client", "socket", "kafka", "openai",  # network
    "subprocess", "multiprocessing",  # processes
    "pathlib", "shutil", "tempfile", "glob", "os",  # files
    "pyarrow.json", "pyarrow.csv", "pyarrow.parquet", "pyarrow.fs", "pyarrow.dataset",  # file readers
    "pyflink", "streamlit", "fastapi", "starlette", "uvicorn",  # services
})

# Allowances pending moves in flight; each names who removes it. Drop an entry when its
# move lands (the test then fails on any that is no longer needed).
PENDING: set[tuple[str, str]] = set()  # none: every rule holds without exception


def _module_name(path: Path) -> str:
    folder, *rest = path.relative_to(REPO).with_suffix("").parts
    if rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([ROOTS[folder], *rest])


@cache
def _modules() -> dict[str, Path]:
    found = {}
    for folder in ROOTS:
        for path in (REPO / folder).rglob("*.py"):
            if "__pycache__" not in path.parts and "versions" not in path.parts:
                found[_module_name(path)] = path
    return found


def _imports(name: str) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in module ``name``."""
    path = _modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                child = f"{module}.{alias.name}"
                yield (child if child in _modules() else module), node.lineno


def _opens(name: str) -> list[int]:
    tree = ast.parse(_modules()[name].read_text())
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"]


def _root(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _node(module: str) -> str:
    """The subpackage a module belongs to: ``ablab.<root>.<first part>``."""
    return ".".join(module.split(".")[:3])


def _ablab(module: str) -> str | None:
    """The known ablab module an import names (its longest known prefix)."""
    parts = module.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in _modules():
            return candidate
        parts.pop()
    return None


def _allowed(source: str, target: str) -> bool:
    return any(source.startswith(s) and (target == t or target.startswith(t + ".")) for s, t in PENDING)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _edges(level: str) -> dict[str, dict[str, list[str]]]:
    """``source → target → ["module:line imports module", ...]`` between distinct nodes."""
    key = _root if level == "root" else _node
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name in _modules():
        for imported, line in _imports(name):
            target = _ablab(imported) if imported.startswith("ablab.") else None
            if target is None or key(name) == key(target) or _allowed(name, target):
                continue
            out[key(name)][key(target)].append(f"{name}:{line} imports {imported}")
    return out


def test_the_source_tree_is_read() -> None:
    # guards the rules below against passing on an empty or misread tree
    names = _modules()
    assert {"ablab.platform.api.app", "ablab.streaming.loader.service", "ablab.cli.wiring", "ablab.platform.stats.engine"} <= set(names)
    assert ("ablab.platform.api.state", 0) not in set(_imports("ablab.platform.api.app"))
    assert any(m == "ablab.platform.api.state" for m, _ in _imports("ablab.platform.api.app"))


@pytest.mark.parametrize("level", ["root", "subpackage"])
def test_no_import_cycles(level: str) -> None:
    edges = _edges(level)
    cycles = _cycles({s: set(t) for s, t in edges.items()})
    detail = []
    for cycle in cycles:
        members = set(cycle)
        for s in cycle:
            for t, where in edges[s].items():
                if t in members:
                    detail.append(f"{s} -> {t}: {where[0]}")
    assert not cycles, "import cycles:\n" + "\n".join(detail)


def test_packages_import_only_what_they_may() -> None:
    wrong = [f"{s} may not import {t}: {where[0]}"
             for s, targets in _edges("root").items() for t, where in targets.items()
             if t not in MAY_IMPORT.get(s, set())]
    assert not wrong, "\n".join(wrong)


def test_the_control_plane_imports_no_implementation_package() -> None:
    # the same rule as above, said as the architecture states it
    forbidden = ("ablab.streaming", "ablab.inference", "ablab.dashboards", "ablab.cli")
    wrong = [f"{name}:{line} imports {imported}"
             for name in _modules() if _root(name) == "ablab.platform"
             for imported, line in _imports(name)
             if imported.startswith(forbidden) and not _allowed(name, imported)]
    assert not wrong, "\n".join(wrong)


def _reached(start: str) -> dict[str, str]:
    """Every ablab module ``start`` imports, directly or through others: module → the first importer."""
    seen = {start: start}
    todo = [start]
    while todo:
        current = todo.pop()
        for imported, _ in _imports(current):
            target = _ablab(imported) if imported.startswith("ablab.") else None
            if target is not None and target not in seen and not _allowed(current, target):
                seen[target] = current
                todo.append(target)
    return seen


def _is_io(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in IO_MODULES)


def test_statistics_do_no_io() -> None:
    stats = [name for name in _modules() if name.startswith("ablab.platform.stats")]
    assert len(stats) > 10
    wrong = set()
    for name in stats:
        for module, via in _reached(name).items():
            for imported, line in _imports(module):
                if _is_io(imported) and not _allowed(module, imported):
                    wrong.add(f"{name} reaches {imported} ({module}:{line}, through {via})")
            for line in _opens(module):
                wrong.add(f"{name} reaches open() ({module}:{line}, through {via})")
    assert not wrong, "\n".join(sorted(wrong))


def test_every_pending_allowance_is_still_needed() -> None:
    # an allowance whose import is gone must be dropped, so none outlives its move
    unused = []
    for source, target in sorted(PENDING):
        used = any(name.startswith(source) and (imported == target or imported.startswith(target + "."))
                   for name in _modules() for imported, _ in _imports(name))
        if not used:
            unused.append(f"{source} -> {target}")
    assert not unused, "drop these allowances from PENDING:\n" + "\n".join(unused)


def test_the_rules_catch_what_they_guard() -> None:
    # the checks themselves, on a graph with a known cycle and a known I/O import
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _is_io("clickhouse_connect.driver.client") and _is_io("pathlib") and not _is_io("pathlibx")
    assert not _is_io("numpy") and not _is_io("ablab.platform.stats.engine")
