#!/usr/bin/env bash
# Session 24, call E (nvidia-h200; carry [".fa3"]). About 4 minutes.
# fused_group=4 is now the heuristic's pick with an fp8 cache at H = 128 (calls B-D). The other rows of the fused
# path are H = 16 at q_len 2 (32 rows), where session 10 had 2 ahead of 4 (109.1 against 110.8 us at B64 S4096).
# This call: fused_group=4 against the heuristic there.
# Prediction: within 1% either way.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --rounds 3 --reps 3 --cooldown 1 --fields fused_group=4 \
  --shapes H16_B64_S4096_q2,H16_B128_S16384_q2 --json "$OUT/sweep-h16q2-fg4.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn\|warn\|^$" | tail -8
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
