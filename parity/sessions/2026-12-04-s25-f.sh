#!/usr/bin/env bash
# Session 25, call F (nvidia-h200; carry [".fa3"]; ~5 minutes of device time left). Call E: pv_registers's compiled
# cases passed with pv_wait=4; the fp8 grid: H16 B128 S16384 fp8 390.2 us (call A 397.6), fp8 / bf16 0.930, FA3/fp8
# 1.018. Region profile of the heuristic (pv_registers, pv_wait=4) at H16 B128 S4096, beside call B's pv_wait=1.
# Prediction: pv 1.95 / 2.61 -> 1.5-2.2 us a warpgroup step, dequant 1.5-1.7, kv_wait < 0.3.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 56 \
  --json "$OUT/regions-fp8-heuristic.json" > "$L/regions.log" 2>&1; echo "rc=$?" >> "$L/regions.log"
grep -v Warn "$L/regions.log" | tail -14
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
