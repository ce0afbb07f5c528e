#!/usr/bin/env bash
# Refresh the README's screenshots (docs/screenshots/*.png) on purpose: runs the browser
# test (tests/browser, headless Chromium over a seeded store) with its screenshots written
# into docs/screenshots/ instead of a temporary directory. Review and commit the images.
set -euo pipefail
cd "$(dirname "$0")/.."
ABLAB_LLM=${ABLAB_LLM:-skip} bash scripts/bootstrap.sh
if [ -x scripts/browser-deps.sh ]; then bash scripts/browser-deps.sh; fi
ABLAB_SCREENSHOTS_DIR="$PWD/docs/screenshots" .venv/bin/python -m pytest tests/browser -q -p no:cacheprovider "$@"
git status --short docs/screenshots
