#!/usr/bin/env bash
# For the next session's first call (nvidia-h200). Written at the end of session 11. Copy it to
# parity/sessions/<date>-s12-a.sh before running; never edit it after. Then next-session-tpv-call.sh, then next-session-second-call.sh, twice
# (issue #5's whole grid, one half a call; not yet run).
# Session 11's region profile (call E) of the fp8 step with overlap_dequant at H16 B128 S4096: warpgroup 0's P @ V
# region 1.82 us a step (its 3 chunks of the next step inside, ~0.9 us, longer than the wgmma), then 2 late chunks
# another 0.89; warpgroup 1 still waited 1.80 us a step for P. The candidate MosaicConfig(overlap_wait=True),
# CPU-checked in session 11 (interpret cases at 16 and 32 rows, one stage, the race detector, CUDA lowering):
# warpgroup 1 converts V's first half of step k + 1 while it waits for P of step k, warpgroup 0 only the rope under
# its P @ V.
# 1. Compiled: the overlap_wait cases, H = 8 (24 rows, overlap and overlap_wait), and overlap / overlap_wait ==
#    fused_dequant=False bitwise.
# 2. Sweep, 3 interleaved rounds: heuristic (overlap_dequant) vs overlap_wait=True, four H = 16 q_len 1 shapes.
#    Prediction: 1.08-1.15x at H16 B128 S16384 (673-683 us -> ~600-630: warpgroup 0's P @ V region back to
#    ~0.9 us, the step 2.6 -> ~2.3-2.4 us); equal at B8 S4096 and B1 S1024.
# 3. The region profile of both (`--space 512`). Prediction: warpgroup 0's pv ~0.9-1.0, wg1 p_ready_wait ~1.0.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "(compiled and (overlap_wait or heads_8)) or overlap_dequant_is_bitwise" > "$L/pytest.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest.log"
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields overlap_wait=True \
  --rounds 3 --reps 3 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1,H16_B1_S1024_q1 \
  --json "$OUT/sweep-fp8-overlap-wait.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
timeout 75 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 512 --set overlap_wait=True \
  --json "$OUT/regions-fp8-overlap-wait.json" > "$L/regions-wait.log" 2>&1; echo "regions rc=$?" >> "$L/regions-wait.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest.log" | tail -8
cut -c1-130 "$L/sweep.log" | grep -v Warning | tail -14
grep -v "Warning\|warn" "$L/regions-wait.log" | cut -c1-160 | tail -18
rm -rf "$L"
