#!/usr/bin/env bash
# Session 36, call f (nvidia-h100-x1; no FA3 needed): H200s refused seven times; ~300 s of budget left. On an H100:
# the probe's fp8_pair beside fp8_64 and flat, and pair_ring at 32 rows (H16 B64 S4096 q2, H32 B64 S4096), where it
# spills 572 bytes against the default's 436 (ptxas). Predictions: fp8_pair 3.1-3.2 TB/s (HBM-capped as fp8_64 and
# flat on the H100: 3.17); pair_ring at 32 rows 0.97-1.03x.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 40 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_pair_x4,fp8_flat_x4 --json "$OUT/tma-probe-pair.json" \
  > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -4
timeout 140 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields pair_ring=True --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B64_S4096_q2,H32_B64_S4096 --json "$OUT/sweep-fp8-pair-32rows.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$L/sweep.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
