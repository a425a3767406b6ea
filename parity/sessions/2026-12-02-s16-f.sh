#!/usr/bin/env bash
# Session 16, call F (nvidia-h200; carry [".fa3"]). Written after call E: the memoryless steps (parity.wgmma_probe,
# exact now) step_flashmla 1.800 us, step_flashmla_1p 1.831, step_deferred 1.714, step_three_wg 1.882; the kernel
# 2.05 us a step at H128 B64 S4096 q1 (131.5 us): ~0.25 us a step goes to the ring's loads and waits; p_in_kv
# 1.04-1.05x slower on today's defaults. New: MosaicConfig(split_ring=True), deferred_pv's two-part ring without the
# deferral (each warpgroup refills its column part right after its own P @ V; the scores wait for part 1 only after
# part 0's wgmmas are issued). CPU-checked: interpret cases (chunks at pages 8 and 16), the race detector, lowering,
# the config errors; a mutation (no bt_staged wait) fails the page-16 chunk case.
# 1) the compiled split_ring tests (bitwise the default at pages 16 / 64 / 128, every parity scenario, the interpret
#    cases, determinism). Prediction: pass.
# 2) parity.sweep --fields split_ring=True on three H = 128 rows (3 rounds, 2 s idle). Prediction: 1.00-1.06x faster
#    (part 1's extra ~0.3 us of lead against the ~0.25 us a step the ring costs).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "TestGPU and split_ring" > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields split_ring=True --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B64_S16384_q1,H128_B128_S4096_q2 --json "$OUT/sweep-split-ring.json" \
  > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -6
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -9
rm -rf "$L"
