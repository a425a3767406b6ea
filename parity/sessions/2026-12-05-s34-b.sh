#!/usr/bin/env bash
# Session 34, call b (nvidia-h100-x1, any Hopper; carry [".fa3"]): 246 s of device time left after six refusals of
# s34-a, so the smallest useful part of it: q_in_kernel's compiled bitwise test (session 31; never run on a GPU),
# then, in what is left, a q_in_kernel sweep at the B = 1 row where its saving (one XLA kernel a call) is largest.
# Predictions: bitwise; H16 B1 S1024 1.05-1.12x faster (12.5 -> 11.0-11.5 us on the H200).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 100 python3 -m pytest -q -m gpu tests/test_fp8.py -k "q_in_kernel_is_bitwise" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -8 | cut -c1-200
timeout 60 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields q_in_kernel=True --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B1_S1024 --json "$OUT/sweep-fp8-q-in-kernel-b1.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$OUT/sweep.log" | grep -E " us " | cut -c1-110
nvidia-smi --query-gpu=name --format=csv,noheader
