#!/usr/bin/env bash
# Session 7, call E (nvidia-h200, the session's last ~7 minutes): FlashMLA's seesaw (MosaicConfig(schedule="seesaw"),
# CPU-checked: interpret cases, race detector, CUDA lowering). 1. its compiled tests; 2. A/B against the default
# ("flashmla") in three interleaved rounds on H = 128 shapes, where call D's profile put warpgroup 0's softmax
# (outside its qk and pv regions) on the step's chain.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py -k "seesaw" \
  > "$L/pytest_seesaw.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_seesaw.log"
timeout 140 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields schedule=seesaw --rounds 3 --reps 3 \
  --shapes H128_B64_S16384_q1,H128_B32_S4096_q2,H128_B8_S16384_q1,H128_B1_S1024_q1 \
  --json "$OUT/sweep-seesaw.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_seesaw.log" | tail -6
cut -c1-160 "$L/sweep.log" | tail -16
rm -rf "$L"
