#!/usr/bin/env bash
# Session 40, call e (nvidia-h200 with needs_h200, carry [".fa3"]): s40-d (no start) cut again, to ~460 s of budget:
# the probe and one row (a start is ~160 s). pair_ring's bitwise test passed on an H100 in s40-c (page-64 scenario
# included), so it is left out, and so is wide_ring. What is left: the probe of the fp8 ring's box rows on the H200's
# HBM, and pair_ring against the default at H16 B128 S16384, FA3 beside. Predictions (s40-a's header): fp8_64 3.5-3.6 TB/s,
# fp8_pair 4.4-4.7; pair_ring 1.10-1.25x at H16 B128 S16384 (335 -> 270-305 us).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 70 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_pair_x4,fp8_pair_x2,fp8_flat_x4,bf16_128_x2 \
  --json "$OUT/tma-probe-pair.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -6
tar czf "$OUT/logs-1a.tgz" -C "$OUT" logs  # (kept if the sweep runs past the call's limit)
timeout 130 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields pair_ring=True --rounds 3 \
  --reps 3 --cooldown 1 --shapes H16_B128_S16384 --json "$OUT/sweep-fp8-pair.json" \
  > "$L/sweep-pair.log" 2>&1
echo "sweep pair rc=$?"; grep -v Warn "$L/sweep-pair.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
