#!/usr/bin/env bash
# Session 30, call B (nvidia-h200; carry [".fa3"]), ~6 minutes. The sweep of lazy_rescale and pv_int_chunks (2, 3, 4)
# against the heuristic on the memory-bound fp8 rows: 16 rows (H16 B128 S16384, B32 S16384) and 32 rows (H16 B64
# S4096 q2: pv_wait 1, 255 registers), 3 rounds, 1 s idle, FA3 beside.
# Predictions: lazy_rescale 1.02-1.06x faster at 16 rows (64 of ~700 instructions a thread a step, most steps skip
# it once the maxima settle), 1.03-1.08x at 32 rows (128); pv_int_chunks: if the conversion pipe binds, 2-3 chunks
# 1.05-1.15x faster at 16 rows, 4 slower than 3 (the integer pipe then binds); if issue binds, all slower.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 520 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields lazy_rescale,pv_int_chunks --rounds 3 \
  --reps 3 --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 \
  --json "$OUT/sweep-fp8-lazy-int.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"; grep -v Warn "$L/sweep.log" | grep -E " us |rc=|Error" | cut -c1-120
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
