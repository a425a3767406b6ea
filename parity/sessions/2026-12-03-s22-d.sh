#!/usr/bin/env bash
# Session 22, call D (nvidia-h200; carry [".fa3"]). Call C: l2_prefetch=2 with kv_halves 1.07x / 1.10x slower than
# the heuristic (410.4 / 113.4 us at H16 B128 / B32 S16384; sums_at_end now its pick); compiled tests 10 passed.
# Issue #7's fp8 grid on today's defaults (session 21's call D: fp8 / bf16 Mosaic 0.893, FA3/fp8 0.977; H16 B128
# S16384 fp8 427.5 us, B32 119.4).
# Predictions: H16 B128 S16384 fp8 ~410 us, B32 ~114; the rows without kv_halves as session 21's (+-3%); fp8 / bf16
# ~0.91, FA3/fp8 ~0.99.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 340 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-150 | tail -24
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
