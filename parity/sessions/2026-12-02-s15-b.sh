#!/usr/bin/env bash
# For the next session (nvidia-h200). Written at the end of session
# 13 (not run in session 14). Copy it to parity/sessions/<date>-s15-<x>.sh before running; never edit it after. Call with carry [".fa3"].
# Session 12's fp8 A/Bs (overlap_wait, transposed_pv) were timed with the heuristic right after FA3 in every round,
# which session 13 found slows the fp8 kernel up to 1.16x. Again with --cooldown 2 (every timing after 2 s idle)
# and 3 rounds. Prediction: each part 1.02-1.06x (session 12: overlap_wait 1.05-1.07x, transposed_pv 1.13-1.14x),
# the defaults together ~1.10x over the overlap alone (session 13, call B against the probe's a0: 666-679 vs 604 us).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 300 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields overlap_wait,transposed_pv --rounds 3 \
  --reps 3 --cooldown 2 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 --json "$OUT/sweep-fp8-cooldown.json" \
  > "$L/sweep-fp8-cooldown.log" 2>&1; echo "rc=$?" >> "$L/sweep-fp8-cooldown.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cut -c1-150 "$L/sweep-fp8-cooldown.log" | grep -v "^  \|Warn" | tail -22
rm -rf "$L"
