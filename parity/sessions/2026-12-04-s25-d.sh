#!/usr/bin/env bash
# Session 25, call D (nvidia-h200; carry [".fa3"]). Call C: pv_wait 1 / 2 / 4 / 8: 202 / 223 / 254 / 255 registers
# (8 spills 8 bytes); bitwise against qk_permuted, all four; sweep (--set pv_registers=True) H16 B128 S16384 389.1 /
# 389.6 / 374.5 / 382.8 us, B32 S16384 109.3 / 109.0 / 108.6 / 107.1: the wait depth is not what binds P @ V.
# Count: pv_registers converts each fp8 value twice (the scores' K, P @ V's V^T): 272 cvt.rn.f16x2.e4m3x2 warp
# instructions a warp a step, at ~4-8 clocks each on a sub-partition (session 11's probe) the cvt pipe is now ~1.1-2.2
# us of a ~1.46 us pair of steps.
# New: fp8_convert applies to pv_registers's loads ("bits": integer arithmetic, its prmt placing the bytes, no cvt;
# "mixed": the odd chunks).
# 1) bits / mixed bitwise against cvt (4 scenarios); 2) sweep heuristic against pv_registers (pv_wait=4) on three
# rows; 3) sweep fp8_convert under pv_registers on two rows.
# Predictions: bitwise passes; pv_registers 1.02-1.05x faster at B128 S16384, 0.99-1.02 at B32, 0.92-0.98 at B8 S4096;
# bits or mixed 1.03-1.10x faster than cvt at B128 S16384 if the cvt pipe binds.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "pv_registers_bits_is_bitwise" > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|Mismatch|rc=" "$L/tests.log" | cut -c1-200 | tail -10
timeout 190 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --set pv_wait=4 --fields pv_registers=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1 \
  --json "$OUT/sweep-fp8-pv-registers-4.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -9
timeout 190 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --set pv_registers=True,pv_wait=4 --fields fp8_convert \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 \
  --json "$OUT/sweep-fp8-pv-convert.json" > "$L/sweep2.log" 2>&1; echo "rc=$?" >> "$L/sweep2.log"
cut -c1-150 "$L/sweep2.log" | grep -v "^  \|Warn" | tail -9
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
