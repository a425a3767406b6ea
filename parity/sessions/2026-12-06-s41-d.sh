#!/usr/bin/env bash
# Session 41, call d (nvidia-h100-x1, carry [".fa3"]; 299 s of budget left): run's rules keep needs_h200 for work that
# cannot fit an H100's memory, not for timings, so #7's pair_ring question is asked on the card that comes, its
# baseline in the same run. pair_ring against the heuristic at the two 16-row rows where the heuristic would take it
# (pv_registers), FA3 beside, on today's kernels (after sessions 37-39's removals). Prediction (s36-d on an H100:
# 455.0 -> 439.1 us, 123.0 -> 120.1): 1.02-1.05x at H16 B128 S16384, 1.00-1.03x at H16 B32 S16384.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 180 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields pair_ring=True --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384 --json "$OUT/sweep-fp8-pair-ring.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$L/sweep.log" | tail -12 | cut -c1-150
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
