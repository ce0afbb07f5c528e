#!/usr/bin/env bash
# Wheels of the core package's dependencies (the light install: no extras), pinned by
# requirements.lock and cached outside the clone, so a fresh virtualenv installs ablab's
# core offline in seconds: pip install --no-index --find-links "$(scripts/wheelhouse.sh)" .
# Prints the wheelhouse directory. Needs the package index only the first time per lock.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
CACHE_ROOT=${ABLAB_CACHE:-$HOME/.cache/ablab}
key=$( (cat requirements.lock; sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml; "$PYTHON" --version) | sha256sum | cut -c1-16)
house="$CACHE_ROOT/wheels/core-$key"
if [ ! -f "$house/.complete" ]; then
  mkdir -p "$house"
  mapfile -t core < <("$PYTHON" -c 'import tomllib; [print(d) for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]]')
  # setuptools and wheel: the build backend, which an offline (--no-index) build also needs
  "$PYTHON" -m pip download --quiet --dest "$house" -c requirements.lock "${core[@]}" "setuptools>=68" wheel >&2
  touch "$house/.complete"
fi
echo "$house"
