#!/usr/bin/env bash
# Session 2, call D (nvidia-h200-x2): Mosaic v3 (warpgroup 0 issues the TMAs, 2 warpgroups).
# GPU 1: the grid (61 shapes) FA3 vs Mosaic. GPU 0: the Mosaic GPU tests, ptxas of the kernel,
# and the A/B against the warp-specialized variant (memory_warpgroup=True) on 4 shapes.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"
L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
( export CUDA_VISIBLE_DEVICES=1
  timeout 390 python3 -m parity bench --grid mosaic --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 \
    --json "$OUT/h200-bench-mosaic.json" --png "$OUT/h200-roofline-mosaic.png" > "$L/bench_mosaic.log" 2>&1
  echo "grid rc=$?" >> "$L/bench_mosaic.log" ) &
( export CUDA_VISIBLE_DEVICES=0
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 60 python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape H128_B64_S16384_q1 \
    > "$L/ptxas_mosaic.log" 2>&1
  timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py > "$L/pytest_mosaic.log" 2>&1
  echo "pytest rc=$?" >> "$L/pytest_mosaic.log"
  timeout 120 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 3 --fields memory_warpgroup \
    --shapes H16_B128_S16384_q1,H128_B64_S16384_q1,H128_B8_S4096_q1,H16_B1_S1024_q1 \
    --json "$OUT/h200-sweep-mosaic-v3.json" > "$L/sweep_mosaic.log" 2>&1
  echo "sweep rc=$?" >> "$L/sweep_mosaic.log" ) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -iE "Used .* registers|spill stores" "$L/ptxas_mosaic.log" | head -3
grep -E "passed|failed" "$L/pytest_mosaic.log" | tail -2; grep -E "^FAILED|^ERROR" "$L/pytest_mosaic.log" | head -10
cat "$L/sweep_mosaic.log" | tail -14; tail -8 "$L/bench_mosaic.log"
rm -rf "$L"
