#!/usr/bin/env bash
# Session 5, call C (nvidia-h200, one GPU).
# 1. parity.timeline: the device's busy time vs span per call inside one bench launch, FA3 (graph replay)
#    and Mosaic (jitted loop), on small shapes and one large: does the host decide the Mosaic numbers
#    (call B: its launches of one shape spread 22.4-29.5 us/call, FA3's 19.1-19.7)?
# 2. The compiled tests of the new default (transposed scores for H < 64): every scenario, heuristic tuning.
# 3. Half of issue #5's grid (shard 0/2) with v8 (the new default), --check; call D runs shard 1/2.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 90 python3 -m parity.timeline --shapes H16_B1_S1024_q1,H128_B1_S1024_q1,H16_B32_S1024_q1,H128_B8_S1024_q2,H128_B64_S16384_q1 \
  --json "$OUT/h200-timeline.json" > "$L/timeline.log" 2>&1; echo "timeline rc=$?" >> "$L/timeline.log"
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "test_scenario and heuristic" > "$L/pytest_default.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_default.log"
timeout 350 python3 -m parity bench --grid mosaic --shard 0/2 --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 \
  --json "$OUT/grid-v8-shard0.json" > "$L/bench_shard0.log" 2>&1; echo "shard 0 rc=$?" >> "$L/bench_shard0.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$L/timeline.log" | cut -c1-130
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_default.log" | tail -4
grep -h "rc=" "$L/bench_shard0.log"; grep -h "check FAIL\|error\|Error" "$L/bench_shard0.log" | head -5; tail -5 "$L/bench_shard0.log"
rm -rf "$L"
