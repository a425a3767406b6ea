#!/usr/bin/env bash
# Session 36, call c (nvidia-h200 with needs_h200; carry [".fa3"]; s36-b, never run, folded in here).
# 1) parity.tma_probe: fp8_pair (session 36: the cache two tokens a row, [rows / 2, 1152], every box row a whole
#    line: the bf16 ring's boxes and pitch at half the rows) beside fp8_64 (the default ring), fp8_128r (wide_ring),
#    fp8_flat and bf16_128. s36-a on an H100 (HBM-capped): fp8_64 3.17, fp8_128r 2.93, flat 3.17 TB/s.
#    Predictions (H200): fp8_64 3.5-3.6; fp8_128r 3.6-4.3 (below flat: odd tokens' rows start mid-line, and on the
#    H100 it fell below fp8_64); fp8_pair 4.4-4.7 as bf16_128 (session 35: 4.70).
# 2) (done in s36-d on an H100: pair_ring bitwise the default; 1.04x / 1.02x at H16 B128 / B32 S16384 there)
# 3) parity.sweep --fields wide_ring=True,pair_ring=True on 3 rows, FA3 beside. Predictions: pair_ring 1.10-1.25x
#    at H16 B128 S16384 (335 -> 270-305 us) and B32 S16384 (95.7 -> 77-87), 0.97-1.05x at H16 B64 S4096 q2 (more
#    spill); wide_ring 1.00-1.10x (s36-a on the H100: 1.02x / 1.01x / 0.97x).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 70 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_128r_x4,fp8_pair_x4,fp8_pair_x2,fp8_flat_x4,bf16_128_x2 \
  --json "$OUT/tma-probe-pair.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -7
tar czf "$OUT/logs-1.tgz" -C "$OUT" logs  # (kept if the sweep runs past the call's limit)
timeout 280 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields wide_ring=True,pair_ring=True --rounds 3 \
  --reps 3 --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 --json "$OUT/sweep-fp8-rings.json" \
  > "$L/sweep-rings.log" 2>&1
echo "sweep rings rc=$?"; grep -v Warn "$L/sweep-rings.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
