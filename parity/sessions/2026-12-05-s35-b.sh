#!/usr/bin/env bash
# Session 35, call b (nvidia-h200; carry [".fa3"]): call a's part 0 had the fp8 ring's 64-byte boxes at 3.60 TB/s
# of SM intake and the flat view's 128-byte boxes at 4.70 (bf16's ring 4.70). Does an L2 prefetch of each step's
# whole lines (the flat view, cp.async.bulk.prefetch.tensor) lift the 64-byte boxes' intake, the ring's layout
# unchanged? Predictions: if the half-line misses cap it, fp8_64_pf0_x4 and fp8_64_pf4_x4 4.2-4.7 TB/s (pf4 the
# higher); if the L2's request rate does, 3.4-3.7 (the prefetch's requests on top).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_64_pf0_x4,fp8_64_pf4_x4,fp8_64_pf0_x2,fp8_flat_x4 \
  --json "$OUT/tma-probe-prefetch.json" > "$OUT/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$OUT/tma.log" | tail -7
