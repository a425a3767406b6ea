#!/usr/bin/env bash
# Session 16, call A (copied from next-session-first-call.sh, written at the end of session 15).
# Call with carry [".fa3"].
# Session 15, call E (python -m parity.wgmma_probe, one CTA per SM): the scores alone 0.806 us a step (5.85 TFLOP/s an
# SM, the matmul ceiling's rate), one P @ V half 0.390, the scores beside a P @ V half 1.055: a step's tensor work is
# ~1.45 us, the kernel's step 2.20 (H128 B64 S4096 q1), so ~0.75 us is exposed (warpgroup 0's softmax and hand-off).
# MosaicConfig(deferred_pv=True) runs warpgroup 1's P @ V under that softmax; its first versions (calls C, D) were
# 1.01-1.15x slower, losing to a later refill of the slot's part 0 (KV wait 0.19 -> 0.56 us profiled) and to the P @ V
# landing beside warpgroup 0's own. Now warpgroup 0 refills part 0 itself under its next scores' first wgmma, a step
# ahead (the block table in two half-size chunk buffers); CPU-checked (interpret cases, races, lowering), untimed.
# 1) parity.sweep --fields deferred_pv, 3 rounds, 2 s idle, on three H = 128 rows. Prediction: 1.00-1.08x faster
#    (from call D's 1.01-1.04x slower: the KV wait back to ~0.2 us profiled, the P @ V under the softmax kept).
# 2) the compiled deferred_pv tests (bitwise the default at pages 16, 64, 128, with and without p_in_kv; the H = 128
#    and p_in_kv cases). Prediction: pass.
# 3) the region profile with p_in_kv + deferred_pv (call D's beside it). Prediction: warpgroup 0's kv_wait ~0.2 us
#    (call D 0.56), its pv still ~1.0 (beside warpgroup 1's).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields deferred_pv --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B128_S4096_q2,H128_B64_S16384_q1 --json "$OUT/sweep-deferred-pv-v2.json" \
  > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
timeout 130 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "TestGPU and deferred" > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
timeout 80 python3 -m parity.regions --shapes H128_B64_S4096_q1 --space 240 --set p_in_kv=True,deferred_pv=True \
  --json "$OUT/regions-h128-deferred-pv-v2.json" > "$L/regions.log" 2>&1; echo "rc=$?" >> "$L/regions.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v "Warn\|^  " "$L/regions.log" | tail -12
tail -3 "$L/tests.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -9
rm -rf "$L"
