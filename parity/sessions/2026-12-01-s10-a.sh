#!/usr/bin/env bash
# Session 10, call A (nvidia-h200). From next-session-first-call.sh (session 9), with the new fp8_convert="bits"
# (integer e4m3 -> f16, CPU-checked: numpy formula exact over all 256 bytes, lowering for CUDA, ptxas on the snippet).
# 1. python -m parity.convert_probe: one [64, 576] fp8 step -> f16 in shared memory per CTA and iteration, 132 CTAs,
#    by method. Prediction: if cvt.rn.f16x2.e4m3x2 issues at 16 a clock per SM, "cvt" ~0.8 us a step (18432 cvts),
#    "bits" ~0.5 us (~5 integer/FMA instructions a pair at 64 a clock), "copy" ~0.3 us (the loads and stores).
# 2. Compiled fp8 tests (fused_group=4 default on every case; the "bits" cases; bits == cvt bit for bit).
# 3. fused_group 1/2 vs 4 and fp8_convert bits vs cvt, 3 interleaved rounds, four shapes. Prediction: bits
#    1.05-1.15x faster on the large shapes if the conversion pipe is what binds (the fused conversion 2.30 us inside
#    the scores, s9-a); fused_group 4 the fastest or tied with 2.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 90 python3 -m parity.convert_probe --json "$OUT/convert-probe.json" > "$L/probe.log" 2>&1
echo "probe rc=$?" >> "$L/probe.log"
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "mosaic_gpu_fp8_compiled or convert_bits" > "$L/pytest_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_fp8.log"
timeout 250 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields fused_group,fp8_convert --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B64_S4096_q2,H128_B64_S16384_q1 \
  --json "$OUT/sweep-fp8-group-convert.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v "Warning\|warn" "$L/probe.log" | tail -8
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_fp8.log" | tail -6
cut -c1-120 "$L/sweep.log" | grep -v Warning | tail -24
rm -rf "$L"
