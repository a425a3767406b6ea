#!/usr/bin/env bash
# Session 9, call C (nvidia-h200).
# 1. The seesaw's compiled tests that s9-a's 100 s limit cut off (as in session 7's s7-e: 10 of 14 ran and
#    passed, the 11th, single_token, was still compiling): the last four, one by one with their durations.
# 2. The compiled fp8 tests with fused_dequant=True now the default (False the explicit case).
# 3. Score layout at H = 16 across q_len (s9-b: the plain scores were 1.03-1.06x faster than the transposed
#    ones, the heuristic's pick, at q_len 2 with S = 16384). Prediction: plain faster at q_len 2 and 3 on
#    large B x S, transposed still faster at q_len 1 (session 5: 1.04-1.16x) and at B = 1.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -v -p no:cacheprovider -rfEs --durations=0 tests/test_pallas_mosaic_gpu.py \
  -k "seesaw and (single_token or spec_decode or deterministic)" > "$L/pytest_seesaw.log" 2>&1
echo "pytest rc=$?" >> "$L/pytest_seesaw.log"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_fp8.log"
timeout 280 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields transposed_scores --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q2,H16_B64_S4096_q2,H16_B8_S4096_q2,H16_B1_S1024_q2,H16_B64_S4096_q3,H16_B128_S16384_q1,H16_B8_S4096_q1 \
  --json "$OUT/sweep-h16-scores.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "PASSED|FAILED|SKIPPED|passed|failed|rc=|s call" "$L/pytest_seesaw.log" | cut -c1-150 | tail -14
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_fp8.log" | tail -4
cut -c1-110 "$L/sweep.log" | grep -v Warning | tail -26
rm -rf "$L"
