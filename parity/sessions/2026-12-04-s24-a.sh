#!/usr/bin/env bash
# Session 24, call A (nvidia-h200; carry [".fa3"]), copied from next-session-first-call.sh written at the end of
# session 23. About 8 minutes.
# Session 23 made qk_permuted the heuristic's pick with kv_halves (1.06x at H16 B128 S16384: 376.7 us in its sweep,
# 392.9 in the grid). Its calls compiled only the qk_permuted tests and one NaN test. This call: 1) every compiled fp8
# test (72, collection order; the three bitwise ones last were not reached in session 23's 400 s: they go first);
# 2) the heuristic's fp8 sweep row as a check of the machine.
# Predictions: no test fails; 370-395 us.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "bitwise" > "$L/tests-bitwise.log" 2>&1
echo "rc=$?" >> "$L/tests-bitwise.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests-bitwise.log" | tail -6
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "not bitwise" > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -10
timeout 60 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields none --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B128_S16384_q1 --json "$OUT/sweep-fp8-heuristic.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"; cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -4
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
