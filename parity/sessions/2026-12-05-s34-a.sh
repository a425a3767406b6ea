#!/usr/bin/env bash
# Session 34, one call (nvidia-h200; carry [".fa3"]): the template's part 4 (2026-12-05-s33-a.sh: q_in_kernel, session
# 31) and part 0 (tma_probe) in one command, the sweep first and every log written to $OUT as it goes, because the
# session's device budget is 783 s (s33-a's part-04 call was cut off by an environment restart, result unknown).
# The sweep also times lazy_max a second time (s33-b: 1.04x at H16 B128 S16384, 0.98x at B32 S16384, 1.03x at q2).
# Predictions (s33-a's header): q_in_kernel bitwise; H16 B1 S1024 12.5 -> 11.0-11.5 us, H128 B1 S1024 14.8 ->
# 13.5-14.0, H16 B64 S4096 q2 76.9 -> 74-76, H16 B128 S16384 within 1%; lazy_max 1.00-1.05x at H16 B128 S16384,
# 0.98-1.03x at q2, no change at B1 (its kv_halves path does not run there); tma_probe: bf16_128_x2 4.4-4.5 TB/s,
# fp8_64 within 3% of fp8_128p unless the 64-byte box rows cap the L2 (then 3.6-4.0 against 4.3-4.5).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 230 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields q_in_kernel=True,lazy_max=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B1_S1024,H128_B1_S1024,H16_B64_S4096_q2,H16_B128_S16384 \
  --json "$OUT/sweep-fp8-q-in-kernel-lazy.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$OUT/sweep.log" | grep -E " us " | cut -c1-110
timeout 170 python3 -m pytest -q -m gpu tests/test_fp8.py -k "q_in_kernel_is_bitwise" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -8 | cut -c1-200
timeout 60 python3 -m parity.tma_probe --json "$OUT/tma-probe.json" > "$OUT/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$OUT/tma.log" | tail -8
