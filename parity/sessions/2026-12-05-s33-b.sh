#!/usr/bin/env bash
# Session 33, one call (nvidia-h200; carry [".fa3"]): the template's parts 6 and 7 (2026-12-05-s33-a.sh) in one
# command, the sweep first and the logs written to $OUT after each part, because machines came rarely this session
# (five refusals before it). Predictions as s33-a's header: interleave_steps 0.97-1.08x at the 16-row rows (H16
# B128 S16384, B32 S16384), 0.85-0.95x at 32 rows (H16 B64 S4096 q2: C7511, spills); lazy_max 1.02-1.06x at the
# 16-row rows, 0.98-1.03x at q2; interleave_steps's compiled bitwise test passes; lazy_max's 7 compiled tests pass.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 260 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields interleave_steps=True,lazy_max=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 \
  --json "$OUT/sweep-fp8-interleave-lazy.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$OUT/sweep.log" | grep -E " us " | cut -c1-110
timeout 290 python3 -m pytest -q -m gpu tests/test_fp8.py -k "interleave_steps_is_bitwise or lazy_max" \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12 | cut -c1-200
