#!/usr/bin/env bash
# The strategy table on the lent H200 (or any CUDA device), in well under 8 minutes.
#   benchmarks/gpu/run_all.sh [cuda|cpu|dry]  (device defaults to auto-detection)
# `dry` is the CPU dry run a test exercises: same script and table code, --device cpu,
# --quick, one thread, no pip install, so the script is known to start without a GPU.
# Writes the markdown to $OUT/inference-gpu.md and the figures to $OUT/inference-gpu.json
# when $OUT is set (the device machine's result folder), else to ./bench-out/.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE="${1:-auto}"
DRY=0
# batching: one 2 s run per policy and load fits the 8 min; WORKLOAD=serving|both adds the
# serving-shaped workload (fixed output lengths, EOS ignored; "both" about doubles that section)
EXTRA=(--threads 4 --reps 1 --duration 2 --workload "${WORKLOAD:-task}")
if [ "$DEVICE" = "dry" ]; then
  DEVICE=cpu
  DRY=1
  EXTRA=(--threads 1 --quick --sections "${DRY_SECTIONS:-strategies,decode}")
fi
DEST="${OUT:-bench-out}"
mkdir -p "$DEST"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
# a fresh device machine needs the editable install; the dry run uses the venv as it is
[ "$DRY" = 1 ] || "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$DEST/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$DEST/gpu.txt"
# int8 (dynamic, fbgemm) is CPU-only: on CUDA the registry refuses it and the row says why.
timeout 470 "$PY" benchmarks/bench_inference.py --device "$DEVICE" "${EXTRA[@]}" --json "$DEST/inference-gpu.json" | tee "$DEST/inference-gpu.md"
