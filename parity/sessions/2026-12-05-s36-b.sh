#!/usr/bin/env bash
# Session 36, call b (nvidia-h200 with needs_h200; carry [".fa3"]): s36-a's part 1 on the H200 without the bitwise
# test (it passed on an H100 in s36-a: the same sm_90a module); s36-a's part 2 left for later (budget).
# s36-a on the H100 (HBM-capped there): fp8_64 3.17, fp8_128r 2.93, flat 3.17 TB/s; wide_ring 1.02x / 1.01x / 0.97x.
# Predictions on the H200: fp8_128r 4.0-4.5 TB/s (fp8_64 3.5-3.6); wide_ring 1.08-1.15x at H16 B128 S16384 and B32
# S16384, 0.97-1.03x at H16 B64 S4096 q2; fp8_pair (the cache two tokens a row: the bf16 ring's boxes) 4.4-4.7 TB/s as
# bf16_128 (session 35: 4.70).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_128r_x4,fp8_pair_x4,fp8_pair_x2,fp8_flat_x4,bf16_128_x2 \
  --json "$OUT/tma-probe-128r.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -7
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields wide_ring=True --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 --json "$OUT/sweep-fp8-wide-ring.json" \
  > "$L/sweep-wide.log" 2>&1
echo "sweep wide_ring rc=$?"; grep -v Warn "$L/sweep-wide.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
