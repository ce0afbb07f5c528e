"""Package discovery for the design card's folder mapping (see pyproject.toml).

setuptools' `find` cannot follow `package-dir` renames, so every folder below a mapped
root that holds an `__init__.py` is listed here under its `ablab.*` name.
"""

from pathlib import Path

from setuptools import setup

ROOTS = {
    "ablab.platform": "platform",
    "ablab.streaming": "streaming",
    "ablab.inference": "inference",
    "ablab.dashboards": "dashboards",
    "ablab.migrations": "migrations",
    "ablab.cli": "cli",
}


def discover() -> list[str]:
    packages = []
    for name, folder in ROOTS.items():
        root = Path(folder)
        packages.append(name)
        for init in sorted(root.rglob("__init__.py")):
            rel = init.parent.relative_to(root)
            if rel.parts and "__pycache__" not in rel.parts:
                packages.append(".".join((name, *rel.parts)))
    return packages


setup(packages=discover())
