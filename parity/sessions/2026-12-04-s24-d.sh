#!/usr/bin/env bash
# Session 24, call D (nvidia-h200; carry [".fa3"]). About 5 minutes.
# The heuristic now takes fused_group=4 with an fp8 cache at H = 128 (calls B and C: 1.015-1.03x on four rows).
# This call: 1) the compiled fp8 tests at H = 128 (the heuristic's tiles among them); 2) the fp8 grid's H = 128 rows
# beside FA3 and bf16 Mosaic, with the check (session 23's grid: fp8 771.1 / 114.2 / 14.7 us).
# Predictions: the tests pass; fp8 735-760 us at B64 S16384, 110-114 at B32 S4096, 14.3-14.9 at B1 S1024.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "128 and not bitwise" > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -8
timeout 200 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --shapes H128_B64_S16384_q1,H128_B32_S4096_q1,H128_B1_S1024_q1 \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8-h128.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-150 | tail -14
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
