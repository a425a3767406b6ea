#!/usr/bin/env bash
# For the next session's first call (nvidia-h200). Written at the end of session 9 (its plan ran as
# 2026-12-01-s9-a.sh). Copy it to parity/sessions/<date>-s10-a.sh before running; never edit it after.
# Then next-session-second-call.sh, twice (the whole issue #5 grid, one half a call).
# 1. Compiled fp8 tests, with MosaicConfig(fused_group=2 / 4) (CPU-checked only: interpret, lowering): warpgroup 0
#    converts 2 or 4 of its V-half chunks between two fences instead of 1 (fused_dequant, the fp8 default since
#    session 9, fences after every chunk: 5 a step).
# 2. The fp8 A/B of fused_group 2 and 4 against 1, three interleaved rounds. Prediction (parity/NOTES_pallas_mosaic_gpu.md,
#    session 9): warpgroup 0's conversion inside the scores 2.30 us -> ~2.0 with 3 fences (session 9 measured
#    1.63 us for the same conversion without fences in between), the step ~0.2 us shorter: 1.02-1.04x at H = 16;
#    fused_group=4 may lose it again (its first V chunk's wgmma issued only after all four are converted).
# 3. Region profile of fused_group=2 at H16 B128 S4096 (beside s9-a's of fused_group=1).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_fp8.log"
timeout 260 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields fused_group --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B64_S4096_q2,H128_B64_S16384_q1 \
  --json "$OUT/sweep-fp8-fused-group.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
timeout 80 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --set fused_group=2 --space 1024 \
  --json "$OUT/regions-fp8-fused-group2.json" > "$L/regions.log" 2>&1; echo "regions rc=$?" >> "$L/regions.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_fp8.log" | tail -4
cut -c1-120 "$L/sweep.log" | grep -v Warning | tail -20
grep -v Warning "$L/regions.log" | cut -c1-160 | tail -18
rm -rf "$L"
