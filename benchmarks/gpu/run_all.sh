#!/usr/bin/env bash
# The strategy table on the lent H200 (or any CUDA device), in well under 8 minutes.
#   benchmarks/gpu/run_all.sh [cuda|cpu]      (device defaults to auto-detection)
# Writes the markdown to $OUT/inference-gpu.md and the figures to $OUT/inference-gpu.json
# when $OUT is set (the device machine's result folder), else to ./bench-out/.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE="${1:-auto}"
DEST="${OUT:-bench-out}"
mkdir -p "$DEST"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$DEST/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$DEST/gpu.txt"
# int8 (dynamic, fbgemm) is CPU-only: on CUDA the registry refuses it and the row says why.
timeout 470 "$PY" benchmarks/bench_inference.py --device "$DEVICE" --threads 4 --json "$DEST/inference-gpu.json" | tee "$DEST/inference-gpu.md"
