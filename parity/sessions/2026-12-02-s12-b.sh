#!/usr/bin/env bash
# For the next session's second call (nvidia-h200), after next-session-first-call.sh. Written at the end of
# session 11; copy it to parity/sessions/<date>-s12-b.sh before running.
# MosaicConfig(transposed_pv=True) (CPU-checked in session 11: O^T = V^T P^T, 4x less P @ V tensor work at 16
#    rows, transposed back once per tile by an identity wgmma of a bf16 hi / lo split): compiled cases (bf16 and
#    fp8), then a sweep on bf16 H = 16 q_len 1 shapes (the heuristic's transposed scores) and on fp8. Prediction:
#    bf16 H16 B128 S16384 unchanged (memory bound, 4.35 TB/s), H16 B32 S16384 1.02-1.05x (mid shapes 0.83-0.90
#    of FA3 in session 4 were chain bound); fp8 1.05-1.1x at H16 B128 S16384 (the P @ V regions 0.85-1.35 us a
#    step profiled, ~1/4 of their tensor work left).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py tests/test_fp8.py \
  -k "tpv or transposed_pv" > "$L/pytest-tpv.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest-tpv.log"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields transposed_pv=True --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1 --json "$OUT/sweep-tpv.json" > "$L/sweep-tpv.log" 2>&1
echo "sweep rc=$?" >> "$L/sweep-tpv.log"
timeout 120 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields transposed_pv=True --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 --json "$OUT/sweep-tpv-fp8.json" > "$L/sweep-tpv-fp8.log" 2>&1
echo "sweep rc=$?" >> "$L/sweep-tpv-fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest-tpv.log" | tail -8
cut -c1-130 "$L/sweep-tpv.log" "$L/sweep-tpv-fp8.log" | grep -v Warning | tail -16
rm -rf "$L"
