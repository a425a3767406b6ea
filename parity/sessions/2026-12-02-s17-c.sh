#!/usr/bin/env bash
# Session 17, call C (nvidia-h200; carry [".fa3"]). Calls A, B (parity.wgmma_probe): the memoryless step
# step_flashmla_1p 1.75-1.77 us; with the ring's traffic, two loads in flight each awaited two steps after its issue,
# 1.77 (HBM, _hbmx2) and 1.79 (L2, _l2x2); with one in flight, awaited one step after, 3.27 (hot L2) and 3.85 (HBM).
# So the traffic costs ~0.02 us a step: the kernel's ~0.28 us over the probe (2.05 us a step at H128 B64 S4096 q1) is
# its loads' latency against the one step of lead its two-stage ring gives (the slot released after both P @ V
# halves of step k, refilled whole, awaited by the scores of step k + 2).
# New: MosaicConfig(part_wait=True): the two-part slot of split_ring ([0, 256), [256, 576), each its own kv_ready)
# refilled whole by warpgroup 1 as the default's (kv_consumed), the scores waiting for part 1 only after part 0's
# wgmmas (~0.33 us more lead for part 1, TMA'd after part 0). CPU-checked (interpret cases, races, lowering, errors,
# smem count).
# 1) its compiled tests (bitwise the default at pages 16 / 64 / 128, every parity scenario, determinism).
#    Prediction: pass.
# 2) parity.sweep --fields part_wait=True on three H = 128 rows (3 rounds, 2 s idle). Prediction: 0.97-1.08x faster.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "TestGPU and part_wait" > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields part_wait=True --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B64_S16384_q1,H128_B128_S4096_q2 --json "$OUT/sweep-part-wait.json" \
  > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -6
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -9
rm -rf "$L"
