#!/usr/bin/env bash
# Session 2, call B (nvidia-h200-x2): DCP on both GPUs; then the whole GPU suite on GPU 0 while GPU 1
# times the headline grid (FA3, FlashMLA, Triton, Mosaic v2), the fp8 grid, and a Mosaic sweep.
# Everything comes back in one tarball (a call returns at most 8 files).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"
L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$L/gpu.txt"
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_dcp.py > "$L/pytest_dcp.log" 2>&1; echo "dcp rc=$?" >> "$L/pytest_dcp.log"
( CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=15 \
    --ignore=tests/test_dcp.py tests/ > "$L/pytest_gpu.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_gpu.log" ) &
PYT=$!
( export CUDA_VISIBLE_DEVICES=1
  timeout 170 python3 -m parity bench --grid headline --impls torch.fa3,torch.flashmla,jax.pallas_triton,jax.pallas_mosaic_gpu \
    --check --reps 5 --json "$OUT/h200-bench-headline.json" --png "$OUT/h200-roofline-headline.png" > "$L/bench_headline.log" 2>&1
  echo "headline rc=$?" >> "$L/bench_headline.log"
  timeout 130 python3 -m parity bench --grid fp8 --impls torch.fa3,jax.pallas_triton,jax.pallas_triton.fp8 --no-ceilings \
    --check --reps 5 --json "$OUT/h200-bench-fp8.json" > "$L/bench_fp8.log" 2>&1
  echo "fp8 rc=$?" >> "$L/bench_fp8.log"
  timeout 110 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 3 \
    --shapes H16_B1_S1024_q1,H128_B8_S4096_q1,H128_B64_S16384_q1,H16_B128_S16384_q1 \
    --json "$OUT/h200-sweep-mosaic.json" > "$L/sweep_mosaic.log" 2>&1
  echo "sweep rc=$?" >> "$L/sweep_mosaic.log"
) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
tail -4 "$L/pytest_dcp.log"; grep -E "passed|failed" "$L/pytest_gpu.log" | tail -3; grep -E "^FAILED|^ERROR" "$L/pytest_gpu.log" | head -20
tail -12 "$L/bench_headline.log"; tail -14 "$L/bench_fp8.log"; tail -8 "$L/sweep_mosaic.log"
