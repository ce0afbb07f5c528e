#!/usr/bin/env bash
# Headless Chromium for the browser tests (tests/browser): Debian's own package, driven
# by Playwright through executable_path, so no Playwright browser download is needed.
set -euo pipefail
if [ -x /usr/bin/chromium ] && fc-list 2>/dev/null | grep -qi "color emoji"; then exit 0; fi
echo "==> Debian chromium for the browser tests"
apt-get update -qq && apt-get install -y -qq chromium fonts-noto-color-emoji
