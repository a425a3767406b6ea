#!/usr/bin/env bash
# Session 11, call A (nvidia-h200). New since session 10 (CPU-checked: interpret cases, the race detector, CUDA
# lowering): MosaicConfig(overlap_dequant=True), fp8 with transposed scores of <= 32 rows: the next step's rope and
# V's first half convert under this step's P @ V (two f16 buffers for that half), the second half after warpgroup
# 1's P @ V, two chunks a warpgroup; fp8_convert="mixed" (cvt on even chunks, bits on odd: the conversion pipe
# and the integer/FMA pipes at once); fused_group=2 the default (session 10's rounds).
# 1. Compiled fp8 tests: every MOSAIC_FP8_CASES (overlap ones included), the bits/mixed cases, bits == mixed == cvt
#    bitwise, overlap == fused_dequant=False bitwise.
# 2. Sweep (3 interleaved rounds), H = 16 q_len 1 shapes and one H = 128 control: heuristic (fused, cvt, group 2),
#    overlap_dequant=True, fp8_convert=mixed. Prediction: overlap 1.4-1.7x faster at H16 B128 S16384 (2.95 us a step
#    -> ~1.7-2.0: the conversion of step k + 1's 5 chunks hidden under P @ V, only 2 chunks a warpgroup left
#    between the P @ V and the next scores); mixed 1.05-1.1x faster than cvt if the cvt pipe binds (the probe:
#    conversion ~0.58 us a step over the bare copy), none at H128 from overlap (no effect there).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -x \
  -k "overlap_dequant_is_bitwise_unfused" > "$L/pytest_smoke.log" 2>&1; echo "smoke rc=$?" >> "$L/pytest_smoke.log"
timeout 250 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields overlap_dequant=True,fp8_convert=mixed \
  --rounds 3 --reps 3 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1,H16_B1_S1024_q1,H128_B64_S16384_q1 \
  --json "$OUT/sweep-fp8-overlap.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
timeout 220 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "mosaic_gpu_fp8_compiled or convert_bits or overlap_dequant" > "$L/pytest_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest_smoke.log" | tail -4
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest_fp8.log" | tail -12
cut -c1-130 "$L/sweep.log" | grep -v Warning | tail -26
rm -rf "$L"
