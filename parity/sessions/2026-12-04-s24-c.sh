#!/usr/bin/env bash
# Session 24, call C (nvidia-h200; carry [".fa3"]). About 5 minutes.
# Call B: at H128 B32 S4096 q1 (fp8) fused_group=4 was 1.02x faster than the heuristic's 2 (113.1 against 115.7 us,
# rounds 112.9-114.4 against 114.8-116.1); session 10 had 2 ahead at H128 B64 S16384 (777.6 against 785.3, before
# the later fp8 changes). This call: fused_group=4 against the heuristic on three more H = 128 rows, to decide
# whether H = 128 (the fused conversion's rows) should take 4.
# Prediction: 1.01-1.03x faster on each.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 270 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --rounds 3 --reps 3 --cooldown 1 --fields fused_group=4 \
  --shapes H128_B64_S16384_q1,H128_B32_S4096_q2,H128_B8_S4096_q1 --json "$OUT/sweep-h128-fg4.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn\|warn\|^$" | tail -10
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
