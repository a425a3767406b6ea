#!/usr/bin/env bash
# Session 35, call c (nvidia-h200 wanted; carry [".fa3"]). Call b (run on an H100, not an H200: HBM 3.35 TB/s) had
# the fp8 ring's 64-byte boxes at 2.93 TB/s of SM intake, with an L2 prefetch of the same step's lines just before
# (flat view) 3.04-3.08, prefetched 4 steps ahead 2.27, the flat view's 128-byte boxes 3.13. 1) the same probes (on
# the H200: call a had fp8_64 3.60, flat 4.70); 2) MosaicConfig.prefetch_lines (that prefetch in the kernel's
# kv_halves path) and q_in_kernel swept at the memory-bound rows, FA3 beside; 3) prefetch_lines's compiled bitwise
# test. Predictions (H200): pf0 4.0-4.6 TB/s; prefetch_lines 1.05-1.20x faster at H16 B128 S16384 and B32 S16384
# (the kernel's 3.64 TB/s was the 64-byte boxes' cap), 1.00-1.05x at H16 B64 S4096 q2 (32 rows, less
# memory-bound); q_in_kernel within 1% there; bitwise.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_64_pf0_x4,fp8_64_pf4_x4,fp8_64_pf0_x2,fp8_flat_x4 \
  --json "$OUT/tma-probe-prefetch.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -6
timeout 300 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields prefetch_lines=True,q_in_kernel=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 \
  --json "$OUT/sweep-fp8-prefetch-lines.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$L/sweep.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs-1.tgz" -C "$OUT" logs
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fp8.py -k "prefetch_lines_is_bitwise" \
  > "$L/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$L/tests.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs; rm -rf "$L"
