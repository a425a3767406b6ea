#!/usr/bin/env bash
# Session 26, call A (nvidia-h200; carry [".fa3"]): session 25's next-session-first-call.sh, unchanged but for
# this header (session 25's device time ran out before it could run). About 9 minutes.
# Session 25 call F's region profile of the heuristic (pv_registers, H16 B128 S4096): warpgroup 1's trace spans
# 94.2 us against warpgroup 0's 65.7 (its steps slower: pv 2.71 against 1.87 us, dequant 1.78 against 1.46) while
# the halves split a split's steps evenly: warpgroup 1 is the tile's critical path. And pv_registers converts each
# fp8 value twice; the warps' instruction issue binds.
# Two opt-ins built after the device time was spent, never compiled yet (CPU: interpret mode for wg0_share, lowering
# and the builder for both):
# - MosaicConfig(wg0_share=p): warpgroup 0 runs ceil(n x p / 100) of a split's n steps (50: as before);
# - MosaicConfig(pv_copy_chunks=n): P @ V's first n chunks of V from an f16 copy the scores' conversion stores
#   (converted once), the other 8 - n from the fp8 slot (pv_registers's).
# 1) the compiled wg0_share cases and the pv_copy_chunks bitwise test; 2) sweep wg0_share 56 and 62 at H16 B128 and
# B32 S16384; 3) sweep pv_copy_chunks 1-3 at H16 B128 S16384.
# Predictions: tests pass; wg0_share 56 or 62 1.03-1.12x faster at B128 S16384; pv_copy_chunks 1.00-1.05x faster.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "(compiled and wg0_share) or pv_copy_chunks_is_bitwise" > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|Mismatch|rc=" "$L/tests.log" | cut -c1-200 | tail -6
timeout 180 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields wg0_share \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 \
  --json "$OUT/sweep-fp8-wg0-share.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -8
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields pv_copy_chunks \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1 \
  --json "$OUT/sweep-fp8-pv-copy.json" > "$L/sweep2.log" 2>&1; echo "rc=$?" >> "$L/sweep2.log"
cut -c1-150 "$L/sweep2.log" | grep -v "^  \|Warn" | tail -6
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
