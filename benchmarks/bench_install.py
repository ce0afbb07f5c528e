"""Install size and time: the light core (`pip install ablab`: SDK, CLI, gateway) against the
full install (`ablab[all]`: torch, PyFlink, chDB, Streamlit...), each into a fresh virtualenv
in one run, versions pinned by requirements.lock.

Routes timed:
- ``light-offline``: the core from the cached wheelhouse (scripts/wheelhouse.sh), ``--no-index``;
  what the light-install test does.
- ``light-index``: the core from the package index, pip's cache off (a new user's first install).
- ``full-index`` (``--full``): ``ablab[all]`` from the package index, pip's cache off.

Size is the virtualenv on disk after the install (pip itself included in every row).

Usage: .venv/bin/python benchmarks/bench_install.py [--full] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("platform", "streaming", "inference", "dashboards", "migrations", "pyproject.toml", "setup.py", "README.md")
HEAVY = ("torch", "pyflink", "chdb", "streamlit")


def du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def copy_sources(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, dest / name)
    return dest


def install(route: str, work: Path, src: Path, wheelhouse: str | None) -> dict:
    venv = work / route
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "-c", str(ROOT / "requirements.lock")]
    if route == "light-offline":
        pip += ["--no-index", "--find-links", wheelhouse or "", str(src)]
    elif route == "light-index":
        pip += ["--no-cache-dir", str(src)]
    else:
        pip += ["--no-cache-dir", f"{src}[all]"]
    t0 = time.perf_counter()
    done = subprocess.run(pip, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{route}: pip failed\n{done.stdout}{done.stderr}")
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            f"import importlib.util as u; print(sum(u.find_spec(m) is not None for m in {HEAVY!r}))"],
                           capture_output=True, text=True, check=True)
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format", "json"], capture_output=True, text=True, check=True)
    row = {"route": route, "seconds": round(seconds, 1), "size_mb": round(du(venv) / 2**20), "packages": len(json.loads(listed.stdout)),
           "heavy_importable": int(probe.stdout.strip())}
    shutil.rmtree(venv)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="Also time ablab[all] from the index (several GB).")
    parser.add_argument("--json", type=Path, help="Write the rows here too.")
    args = parser.parse_args()
    wheelhouse = subprocess.run(["bash", str(ROOT / "scripts" / "wheelhouse.sh")], capture_output=True, text=True, check=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ablab-install-") as tmp:
        src = copy_sources(Path(tmp) / "src")
        for route in ("light-offline", "light-index", *(("full-index",) if args.full else ())):
            rows.append(install(route, Path(tmp), src, wheelhouse))
            print(json.dumps(rows[-1]), flush=True)
    light = next(r for r in rows if r["route"] == "light-index")
    print(f"\n{'route':<14} {'seconds':>8} {'size MB':>8} {'packages':>8} {'heavy':>5}")
    for r in rows:
        print(f"{r['route']:<14} {r['seconds']:>8} {r['size_mb']:>8} {r['packages']:>8} {r['heavy_importable']:>5}")
    if args.full:
        full = rows[-1]
        print(f"full / light (index): {full['seconds'] / light['seconds']:.1f}x time, {full['size_mb'] / light['size_mb']:.1f}x size")
    print(f"load average: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
