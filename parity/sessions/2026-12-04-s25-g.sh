#!/usr/bin/env bash
# Session 25, call G (nvidia-h200; carry [".fa3"]; ~4 minutes of device time left). Call F's region profile of the
# heuristic (H16 B128 S4096): warpgroup 1's trace spans 94.2 us against warpgroup 0's 65.7 (its steps slower: pv 2.71
# against 1.87 us, dequant 1.78 against 1.46), the halves split evenly: warpgroup 1 is the tile's critical path.
# New: MosaicConfig(wg0_share=p): warpgroup 0 runs ceil(n x p / 100) of a split's n steps (50: as before).
# Sweep wg0_share 56 and 62 against the heuristic at H16 B128 S16384.
# Prediction: 56 or 62 1.03-1.12x faster.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 140 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields wg0_share \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1 \
  --json "$OUT/sweep-fp8-wg0-share.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -6
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
