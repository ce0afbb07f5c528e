#!/usr/bin/env bash
# Re-resolve pyproject.toml's dependencies (all extras, test and bench) into requirements.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
python3.11 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --upgrade pip setuptools wheel
"$tmp/venv/bin/pip" install --quiet ".[all,test,bench]"
{
  echo "# Exact versions of every third-party package (pip freeze of a working environment)."
  echo "# Regenerate after changing pyproject.toml dependencies: scripts/lock.sh"
  "$tmp/venv/bin/pip" freeze --exclude-editable | grep -v '^ablab'
} > requirements.lock
rm -rf "$tmp"
