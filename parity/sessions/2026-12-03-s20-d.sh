#!/usr/bin/env bash
# Session 20, call D (nvidia-h200; carry [".fa3"]). Call C: kv_halves (the fp8 heuristic's pick at 16 rows) 1.19x
# faster than kv_halves=False at H16 B128 S16384 and 1.20x at B32 S16384, 215 registers, no spills; call B's fp8 grid
# then had H16 B1 S1024 at 13.0 us (bf16 9.8), where session 11 had ~12.0-12.2 for the old path. This call: the sweep
# on the two small H = 16 rows. Prediction: kv_halves neutral to 1.1x slower at B1 S1024 (a split of 1-2 steps a
# warpgroup pays the merge), 1.0-1.1x faster at B8 S4096. If slower at B1, the heuristic keeps kv_halves only where a
# warpgroup has several steps.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields kv_halves --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B1_S1024_q1,H16_B8_S4096_q1 \
  --json "$OUT/sweep-fp8-kv-halves-small.json" > "$L/sweep-fp8.log" 2>&1; echo "rc=$?" >> "$L/sweep-fp8.log"
cut -c1-150 "$L/sweep-fp8.log" | grep -v "^  \|Warn" | tail -6
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
