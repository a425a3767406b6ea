#!/usr/bin/env bash
# Session 22, call C (nvidia-h200; carry [".fa3"]). Call B: the barriers' cleanup (bar.sync 103 -> 79 in the PTX,
# 4 dead ldmatrix gone) left the heuristic where it was (432.2 us at H16 B128 S16384, call A 430.9; B32 120.3,
# call A 120.6); sums_at_end 1.05x / 1.06x / 1.02x faster (409.8, 113.1, 18.7 us), now the heuristic's pick. Its
# region profile: kv_wait 0.74-0.80 us a step (call A's part_refill profile 0.14-0.32 x 2): as the step shortens,
# each warpgroup waits longer for its one slot's TMA (36 KiB in flight a warpgroup, issued after its conversion).
# New: l2_prefetch with kv_halves (each warpgroup prefetches the step d ahead in its own range into L2 with each
# refill; TMA prefetches hold no shared memory).
# 1) compiled tests of kv_halves (l2_prefetch cases, sums_at_end, bitwise); 2) the sweep, heuristic (now with
# sums_at_end) against l2_prefetch = 1, 2 at B128 / B32 S16384.
# Predictions: tests pass; the heuristic ~410 / 113 us; l2_prefetch 1.02-1.08x faster (the slot's TMA reading L2:
# its kv_wait 0.75 -> < 0.4 us), d = 2 about d = 1.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "(compiled and (l2_prefetch or sums_at_end)) or bitwise_kv_halves or kv_halves_nan or (heuristic_tiles and 16)" \
  > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -8
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields l2_prefetch=1,l2_prefetch=2 \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 \
  --json "$OUT/sweep-fp8-l2-prefetch.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -8
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
