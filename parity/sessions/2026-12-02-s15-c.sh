#!/usr/bin/env bash
# Session 15, call C. Never edit after running. Call with carry [".fa3"].
# MosaicConfig(deferred_pv=True) (new this session, CPU-checked: interpret cases against the reference, the race
# detector, CUDA lowering). Call A's region profile (H128 B64 S4096 q1, profiled step 3.2 us; unprofiled 2.13 us):
# warpgroup 0 qk 1.44 + softmax ~0.97 (the gap between its regions) + pv 0.60 + kv_wait 0.19; warpgroup 1 waits
# 1.72 for P and runs its P @ V (0.74) beside warpgroup 0's P @ V and next scores, so the tensor cores idle through
# warpgroup 0's softmax (~30% of the step). deferred_pv runs warpgroup 1's P @ V of step k under warpgroup 0's
# softmax of step k + 1 (after its scores: qk_done), the ring slots filled in two column halves so the later release
# does not stall the next scores.
# 1) parity.sweep --fields deferred_pv, 3 rounds, 2 s idle before each timing, on five H = 128 rows. Prediction:
#    1.10-1.20x faster (the softmax bubble shrinks by warpgroup 1's P @ V, ~0.3 of 0.64 us unprofiled, and the
#    scores and warpgroup 0's P @ V no longer share the tensor cores with it), if the two-part loads keep up; the
#    split-KV B8 S16384 row the same.
# 2) the compiled deferred_pv tests (bitwise the default at pages 16 / 64 / 128, scenarios, interpret cases on the
#    GPU, determinism). Prediction: pass.
# 3) the region profile with deferred_pv (no p_in_kv: 120 ranges a warpgroup to fit the profiler). Prediction:
#    warpgroup 0's step ~2.6 us profiled (from 3.2).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 330 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields deferred_pv --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B128_S4096_q2,H128_B64_S16384_q1,H128_B128_S8192_q2,H128_B8_S16384_q1 \
  --json "$OUT/sweep-deferred-pv.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "TestGPU and deferred" > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
timeout 80 python3 -m parity.regions --shapes H128_B64_S4096_q1 --space 120 --set deferred_pv=True \
  --json "$OUT/regions-h128-deferred-pv.json" > "$L/regions.log" 2>&1; echo "rc=$?" >> "$L/regions.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v "Warn\|^  " "$L/regions.log" | tail -14
tail -4 "$L/tests.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -14
rm -rf "$L"
