#!/usr/bin/env bash
# Session 9, call F (nvidia-h200, the last ~4 minutes of device time): MosaicConfig(fused_group=2 / 4), written
# after call E and CPU-checked: its two compiled fp8 cases, then a two-round A/B against fused_group=1 on two
# large shapes (next-session-first-call.sh has the fuller A/B). Prediction: g = 2 1.02-1.04x at H = 16; g = 4
# may lose it again.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "mosaic_gpu_fp8_compiled and (tuning9 or tuning10)" > "$OUT/pytest-fp8.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest-fp8.log"
timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields fused_group --rounds 2 --reps 3 \
  --shapes H16_B128_S16384_q1,H128_B64_S16384_q1 --json "$OUT/sweep-fp8-fused-group.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?" >> "$OUT/sweep.log"
grep -E "passed|failed|^FAILED|rc=" "$OUT/pytest-fp8.log" | tail -4
cut -c1-120 "$OUT/sweep.log" | grep -v Warning | tail -12
