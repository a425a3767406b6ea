#!/usr/bin/env bash
# Session 26, call C (nvidia-h200; carry [".fa3"]). Call B: kv_halves at 32 rows compiled at 255 registers (pv_wait 1:
# 444 bytes of spills, 2: 968, 4: none); its 3 compiled tests passed; H16 B64 S4096 q2: heuristic 107.6 us (FA3/impl
# 0.87), kv_halves at 32 rows pv_wait 1 102.7 (0.91), 2 114.3, 4 116.7, 8 119.4; the sweep's 200 s ran out there.
# Now both on the other 32-row shapes, each sweep with FA3 beside it (the ratio FA3/impl compares across the two):
# the heuristic alone, then kv_halves at 32 rows (pv_wait 1).
# Predictions: kv_halves at 32 rows 1.0-1.1x faster at B128 S16384 q2 and H32 B64 S4096 q1, slower at B8 S4096 q2.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
K32=transposed_scores=True,transposed_pv=True,kv_halves=True,qk_registers=True,sums_at_end=True,qk_permuted=True,pv_registers=True
S=H16_B128_S16384_q2,H32_B64_S4096_q1,H16_B8_S4096_q2,H16_B64_S4096_q2
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields none --rounds 3 --reps 3 --cooldown 1 \
  --shapes $S --json "$OUT/sweep-fp8-32rows-heuristic.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -7
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --set $K32,pv_wait=1 --fields none \
  --rounds 3 --reps 3 --cooldown 1 --shapes $S \
  --json "$OUT/sweep-fp8-32rows-halves.json" > "$L/sweep2.log" 2>&1; echo "rc=$?" >> "$L/sweep2.log"
cut -c1-150 "$L/sweep2.log" | grep -v "^  \|Warn" | tail -7
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
