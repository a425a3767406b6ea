#!/usr/bin/env bash
# Session 27, call G (nvidia-h200; carry [".fa3"]), ~3 minutes, the session's last ~6 minutes of device time.
# B = 1 (fp8 ~0.8x of bf16: call F 12.5 against 10.1 us at H16 B1 S1024): the heuristic runs 16 splits of one step
# on the one-chain path. Does kv_halves with 8 splits of two steps (a step a warpgroup) do better?
# Predictions: 8 splits kv_halves 0.95-1.05x of the heuristic at B1 S1024 (session 20: kv_halves at 16 splits of one
# step 1.03x slower); at B4 S1024 (heuristic: see the sweep) within 5%.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --set num_splits=8,qk_registers=True,sums_at_end=True,qk_permuted=True \
  --fields kv_halves=True --rounds 3 --reps 3 --cooldown 1 --shapes H16_B1_S1024_q1,H16_B4_S1024_q1 \
  --json "$OUT/h200-sweep-fp8-b1-halves-s27g-2026-12-04.json" > "$L/sweep-halves.log" 2>&1
echo "rc=$?" >> "$L/sweep-halves.log"; grep -v Warn "$L/sweep-halves.log" | grep -E "us |rc=" | cut -c1-110
timeout 80 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields none --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B1_S1024_q1,H16_B4_S1024_q1 --json "$OUT/h200-sweep-fp8-b1-heuristic-s27g-2026-12-04.json" \
  > "$L/sweep-heuristic.log" 2>&1
echo "rc=$?" >> "$L/sweep-heuristic.log"; grep -v Warn "$L/sweep-heuristic.log" | grep -E "us |rc=" | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
