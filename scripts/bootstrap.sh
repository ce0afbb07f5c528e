#!/usr/bin/env bash
# Idempotent set-up of the project's Python environment at .venv/.
#
# Third-party packages (torch alone is several GB) live in a venv cached under
# ~/.cache/ablab, keyed by a hash of the lock files and the Python version; the
# checkout's own .venv is a thin venv that sees those packages through a .pth file and
# holds only the editable install of ablab. A new clone therefore costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "ablab needs Python 3.11 or newer (found $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
}

CACHE_ROOT=${ABLAB_CACHE:-$HOME/.cache/ablab}
key=$( (cat requirements.lock requirements-nodeps.lock; "$PYTHON" --version) | sha256sum | cut -c1-16)
deps="$CACHE_ROOT/deps-$key"

if [ ! -f "$deps/.complete" ]; then
  echo "==> installing third-party packages into $deps (first run only; torch is large)"
  rm -rf "$deps"
  mkdir -p "$CACHE_ROOT"
  "$PYTHON" -m venv "$deps"
  "$deps/bin/pip" install --quiet --upgrade pip setuptools wheel
  "$deps/bin/pip" install --quiet -r requirements.lock
  "$deps/bin/pip" install --quiet --no-deps -r requirements-nodeps.lock
  touch "$deps/.complete"
fi
lint_key=$(sha256sum requirements-lint.lock | cut -c1-16)
if [ ! -f "$deps/.lint-$lint_key" ]; then
  "$deps/bin/pip" install --quiet --no-deps -r requirements-lint.lock
  touch "$deps/.lint-$lint_key"
fi

# The real-LLM backend (llama-cpp-python + SmolLM2): its wheel builds from source once per
# version into $CACHE_ROOT/wheels. ABLAB_LLM=wait (the test command) waits for the build with
# progress; the default starts a missing build in the background so `ablab up --demo` serves
# at once and the SmolLM2 backend joins when the wheel is ready; ABLAB_LLM=skip leaves it out.
case "${ABLAB_LLM:-start}" in
  wait) bash scripts/llm.sh wait "$deps" ;;
  skip) ;;
  *) bash scripts/llm.sh start "$deps" ;;
esac

site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.deps 2>/dev/null)" != "$deps" ]; then
  rm -rf .venv
  "$PYTHON" -m venv --without-pip .venv
  echo "$(site_of "$deps/bin/python")" > "$(site_of .venv/bin/python)/_ablab_deps.pth"
  echo "$deps" > .venv/.deps
fi
# Always re-point the editable install at this checkout (cheap). requirements.lock is the
# resolution of ablab[all,test,bench], so the deps venv already holds every extra.
log=$(mktemp)
.venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e . >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; exit 1; }
rm -f "$log"
.venv/bin/python -c 'import ablab.platform' || { echo "editable install of ablab failed" >&2; exit 1; }
