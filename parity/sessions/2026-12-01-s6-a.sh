#!/usr/bin/env bash
# Session 6, call A: run as written in next-session-fp8.sh.
# For the next session (nvidia-h200, ~4 min; written at the end of session 5, no device time left): the Mosaic
# kernel's fp8 path (CPU-checked: interpret mode, race detector, CUDA lowering) compiled for the first time.
# 1. Its compiled tests (tests/test_fp8.py -k mosaic_gpu_fp8_compiled; they set FP8_COMPILED themselves).
# 2. The fp8 grid: FA3 and Mosaic on bf16, Mosaic and Triton on fp8, --check (the fp8 rows' gap is recorded).
# If both pass and fp8 is faster than bf16 where memory-bound, set FP8_COMPILED = True in
# mla_jax/pallas_mosaic_gpu.py (then impl="auto" picks the Mosaic kernel for fp8 on Hopper) and update the tests
# that expect the gate (test_fp8.py, test_api.py, test_pallas_mosaic_gpu.py).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_mosaic_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_mosaic_fp8.log"
timeout 300 python3 -m parity bench --grid fp8 --no-ceilings --reps 3 --check \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8,jax.pallas_triton.fp8 \
  --json "$OUT/h200-bench-fp8-mosaic.json" > "$L/bench_fp8.log" 2>&1; echo "bench rc=$?" >> "$L/bench_fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_mosaic_fp8.log" | tail -8
grep -E "^H|rc=|geomean|fp8 vs" "$L/bench_fp8.log" | cut -c1-160; tail -8 "$L/bench_fp8.log"
rm -rf "$L"
