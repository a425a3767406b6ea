#!/usr/bin/env bash
# Session 22, call E (nvidia-h200; carry [".fa3"]; ~430 s of device time left). Call B's profile of the heuristic's
# kv_halves step (sums_at_end; H16 B128 S4096, us a warpgroup's step): dequant + scores' issue 2.84-2.87, TMA wait
# 0.74-0.80, P @ V 0.87 (the step ends waiting for it). New: MosaicConfig(pv_in_flight=True) (opt-in): the P @ V is
# left running into the next step, under its TMA wait, its rope and its first two chunks, each chunk's conversion
# waiting (wgmma_wait(8)) for the P @ V of its columns before storing over them; O^T in one accumulator across the
# steps. Lowered on the CPU: 8 wait_group 8, 32 more stmatrix (chunks 0 and 1 out of the loop).
# 1) compiled: bitwise qk_registers (8 pairs: 4 scenarios, with and without sums_at_end); 2) the sweep, heuristic
# against pv_in_flight=True at H16 B128 / B32 S16384.
# Predictions: bitwise; 1.05-1.15x faster (the P @ V wait overlapped with the TMA wait: 410 -> 360-390 us).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 130 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "pv_in_flight" \
  > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=|Mismatch|assert" "$L/tests.log" | tail -8
timeout 120 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields pv_in_flight=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 \
  --json "$OUT/sweep-fp8-pv-in-flight.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -6
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
