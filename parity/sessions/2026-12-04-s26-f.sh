#!/usr/bin/env bash
# Session 26, call F (nvidia-h200; carry [".fa3"]). The heuristic takes kv_halves at 32 rows where a split has >= 32
# steps (call C: 1.06-1.58x at 32-256 steps a split, 1.30x slower at 4). Between: 16 steps a split (H16 B32 S4096 q2,
# B128 S1024 q2, B8 S16384 q2) and 8 (B64 S1024 q2): the heuristic (the one-chain path there), then kv_halves at 32
# rows (pv_wait 1), each sweep with FA3 beside it.
# Predictions: at 16 steps 0.95-1.05x; at 8 slower (0.85-0.95x).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
K32=transposed_scores=True,transposed_pv=True,kv_halves=True,qk_registers=True,sums_at_end=True,qk_permuted=True,pv_registers=True
S=H16_B32_S4096_q2,H16_B128_S1024_q2,H16_B8_S16384_q2,H16_B64_S1024_q2
timeout 130 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields none --rounds 3 --reps 3 --cooldown 1 \
  --shapes $S --json "$OUT/sweep-fp8-32rows-heuristic.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -7
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --set $K32,pv_wait=1 --fields none \
  --rounds 3 --reps 3 --cooldown 1 --shapes $S \
  --json "$OUT/sweep-fp8-32rows-halves.json" > "$L/sweep2.log" 2>&1; echo "rc=$?" >> "$L/sweep2.log"
cut -c1-150 "$L/sweep2.log" | grep -v "^  \|Warn" | tail -7
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
