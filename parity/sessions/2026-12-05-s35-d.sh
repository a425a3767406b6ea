#!/usr/bin/env bash
# Session 35, call d (nvidia-h200; ~390 s of device time left): the heuristic now takes q_in_kernel with an fp8 cache
# where the batch has at most 32 query tokens (call a: 1.05x at H16 B1, 1.02x at H128 B1; call c: 1.01x at B32 S16384).
# B8 was not timed: the heuristic against q_in_kernel=False at H16 B8 S4096 and H128 B8 S4096, FA3 beside.
# Prediction: 1.01-1.04x (one XLA kernel less in a ~19 us call at H16; ~30 us at H128).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 220 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields q_in_kernel=False --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B8_S4096,H128_B8_S4096 --json "$OUT/sweep-fp8-q-in-kernel-b8.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$OUT/sweep.log" | grep -E " us " | cut -c1-110
