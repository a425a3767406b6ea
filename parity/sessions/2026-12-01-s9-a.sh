#!/usr/bin/env bash
# For the next session's first call (nvidia-h200). Written at the end of session 8 (its plan, the session 7 one,
# ran as 2026-12-01-s8-a.sh). Copy it to parity/sessions/<date>-s9-a.sh before running; never edit it after.
# Then next-session-second-call.sh (issue #5's q_len 2 TB/s miss).
# 1. Compiled tests of the two kernel changes made at the end of session 8, CPU-checked only: the seesaw's row
#    sums' exchange (a barrier-phase hazard the interpreter caught), and MosaicConfig(fused_dequant=True) (fp8:
#    warpgroup 0 converts its columns of a step chunk by chunk between that step's scores' wgmmas), with the
#    rest of the fp8 cases.
# 2. The fp8 A/B: fused_dequant against the default, three interleaved rounds, call e's five shapes.
#    Prediction (parity/NOTES_pallas_mosaic_gpu.md, session 8): warpgroup 0's step ~4.3 -> ~3.8 us (its
#    conversion overlapping the scores' wgmmas), fp8 1.08-1.15x faster at H = 16, fp8 / bf16 0.74 -> ~0.8-0.85.
# 3. Its region profile at H16 B128 S4096 (beside session 8's of the default, h200-regions-fp8-wgmma_8bit).
# 4. If it is faster on the large shapes: make it the default and run the fp8 grid (s8-f's command).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py -k seesaw \
  > "$L/pytest_seesaw.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_seesaw.log"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_fp8.log"
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields fused_dequant=True --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B64_S4096_q2,H128_B64_S16384_q1,H16_B1_S1024_q1 \
  --json "$OUT/sweep-fp8-fused-dequant.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
timeout 80 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --set fused_dequant=True --space 1024 \
  --json "$OUT/regions-fp8-fused.json" > "$L/regions.log" 2>&1; echo "regions rc=$?" >> "$L/regions.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for f in pytest_seesaw pytest_fp8; do grep -E "passed|failed|^FAILED|rc=" "$L/$f.log" | tail -4; done
cut -c1-160 "$L/sweep.log" | grep -v Warning | tail -16
grep -v Warning "$L/regions.log" | cut -c1-160 | tail -20
rm -rf "$L"
