#!/usr/bin/env bash
# Session 15, call F. Never edit after running. Call with carry [".fa3"].
# Call E (python -m parity.wgmma_probe, one CTA per SM): the scores alone 0.806 us a step (5.85 TFLOP/s an SM, the
# matmul ceiling's rate), one P @ V half 0.390, the scores beside a P @ V half 1.055: a step's tensor work is
# ~1.45 us, the kernel's step 2.13, so ~0.68 us is exposed (the softmax). deferred_pv's first versions lost to a later
# part-0 refill (call D: KV wait 0.19 -> 0.56 us profiled). Now warpgroup 0 refills part 0 itself, under its next
# scores' first wgmma, a whole step ahead (the block table in two half-size chunk buffers).
# 1) parity.sweep --fields deferred_pv, 2 rounds, 2 s idle, on two H = 128 rows. Prediction: 1.00-1.08x faster
#    (from call D's 1.01-1.04x slower: the KV wait back to ~0.2 us profiled, the P @ V under the softmax kept).
# 2) the compiled deferred_pv bitwise tests (pages 16, 64, 128; with and without p_in_kv) and the H = 128 case.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields deferred_pv --rounds 2 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B128_S4096_q2 --json "$OUT/sweep-deferred-pv-v2.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "TestGPU and (deferred_pv_is or deferred_pv_h128 or deferred_pv_p_in_kv)" > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
tail -3 "$L/tests.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -7
rm -rf "$L"
