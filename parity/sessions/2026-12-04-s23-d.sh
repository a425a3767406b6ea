#!/usr/bin/env bash
# Session 23, call D (nvidia-h200; carry [".fa3"]). Call C: qk_permuted 1.06x faster at H16 B128 S16384 (400.9 ->
# 376.7 us), 1.05x at B32 S16384, 1.01x at B8 S4096: now the heuristic's pick wherever kv_halves runs. This call:
# 1) the compiled tests of the heuristic's fp8 picks and the kv_halves NaN test; 2) issue #7's fp8 grid.
# Predictions: tests pass; H16 B128 S16384 fp8 375-390 us (session 22: 417.1), B32 105-112 (113.6); fp8 / bf16
# Mosaic ~0.93 (0.907); FA3/fp8 ~1.02 (0.992); the rows kv_halves does not touch as session 22's +-3%.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "heuristic_tiles_run_compiled or nan_in_one_head_compiled" > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -8
timeout 340 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-150 | tail -24
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
