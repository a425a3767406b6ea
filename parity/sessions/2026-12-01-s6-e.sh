#!/usr/bin/env bash
# Session 6, call E (nvidia-h200): the PTX of the Mosaic kernel, bf16 and fp8 (H16 B64 S8192), for ptxas /
# nvdisasm off the GPU (the fp8 kernel spills ~1 KiB a thread; the bf16 one 24-32 bytes; calls C, D).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/dump"
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$OUT/dump"
timeout 200 python3 - <<'PY' 2>&1 | grep -v Warning | tail -5
from parity import bench
for fp8 in (False, True):
    once, _ = bench._jax_kernel("pallas_mosaic_gpu", fp8=fp8)(bench.make_inputs(bench.Shape(16, 64, 8192)))
    once()
    print("fp8" if fp8 else "bf16", "compiled and ran")
PY
rm -f "$OUT"/dump/*mlir-passes*; ls -la "$OUT/dump"; cat "$OUT"/dump/*.ptxas; nvidia-smi --query-gpu=driver_version --format=csv; ptxas --version 2>&1 | tail -1
