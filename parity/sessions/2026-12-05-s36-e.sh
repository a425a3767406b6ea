#!/usr/bin/env bash
# Session 36, call e (nvidia-h200 with needs_h200; carry [".fa3"]): s36-c cut to the budget left (~390 s after six
# refused starts): the probe without fp8_128r, the sweep with pair_ring alone. Predictions as s36-c's: fp8_pair
# 4.4-4.7 TB/s (fp8_64 3.5-3.6); pair_ring 1.10-1.25x at H16 B128 S16384 and B32 S16384, 0.97-1.05x at q2.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 50 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_pair_x4,fp8_flat_x4,bf16_128_x2 \
  --json "$OUT/tma-probe-pair.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -5
timeout 180 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields pair_ring=True --rounds 3 \
  --reps 3 --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 --json "$OUT/sweep-fp8-pair.json" \
  > "$L/sweep-pair.log" 2>&1
echo "sweep pair rc=$?"; grep -v Warn "$L/sweep-pair.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
