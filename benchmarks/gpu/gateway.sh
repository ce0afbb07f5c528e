#!/usr/bin/env bash
# The gateway on the lent accelerator machine: its added latency and throughput on a quiet
# many-core host (the scripted backend), and in front of the in-repo worker serving on CUDA.
#   benchmarks/gpu/gateway.sh            (device machine: python3 holds torch with CUDA)
# Packages the image lacks travel as wheels in .whl/ (see docs/benchmarks/gateway.md).
# Writes $OUT/gateway-gpu.txt and $OUT/gateway-gpu.json (./bench-out/ without $OUT).
set -uo pipefail
cd "$(dirname "$0")/../.."
DEST="${OUT:-bench-out}"
mkdir -p "$DEST"
PY="${PYTHON:-python3}"
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "editable install failed" >&2; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$DEST/gpu.txt" 2>&1
nproc >> "$DEST/gpu.txt"; uptime >> "$DEST/gpu.txt"
PYTHONUNBUFFERED=1 timeout "${GATEWAY_TIMEOUT_S:-300}" "$PY" benchmarks/bench_gateway.py \
  --levels 1,16,64 --requests 400 --rounds 4 --throughput-requests 2000 \
  --worker "${WORKER_DEVICE:-cuda}" --worker-levels 1,16,64 --worker-requests 256 \
  --json "$DEST/gateway-gpu.json" 2>&1 | tee "$DEST/gateway-gpu.txt"
