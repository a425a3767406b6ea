#!/usr/bin/env bash
# Session 2, call C (nvidia-h200-x2): GPU 0 runs the kernel GPU tests (Mosaic v2, Triton, fp8,
# batch-invariant); GPU 1 dumps ptxas for the Mosaic kernel, times the headline grid (all impls),
# the fp8 grid and a Mosaic sweep. One tarball back (a call returns at most 8 files).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"
L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$L/gpu.txt"
( CUDA_VISIBLE_DEVICES=0 timeout 430 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=10 \
    tests/test_pallas_mosaic_gpu.py tests/test_pallas_triton.py tests/test_fp8.py tests/test_batch_invariant.py \
    > "$L/pytest_gpu.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_gpu.log" ) &
( export CUDA_VISIBLE_DEVICES=1
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 60 python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape H128_B64_S16384_q1 \
    > "$L/ptxas_mosaic.log" 2>&1
  timeout 170 python3 -m parity bench --grid headline --impls torch.fa3,torch.flashmla,jax.pallas_triton,jax.pallas_mosaic_gpu \
    --check --reps 5 --json "$OUT/h200-bench-headline.json" --png "$OUT/h200-roofline-headline.png" > "$L/bench_headline.log" 2>&1
  echo "headline rc=$?" >> "$L/bench_headline.log"
  timeout 170 python3 -m parity bench --grid fp8 --impls torch.fa3,jax.pallas_triton,jax.pallas_triton.fp8 --no-ceilings \
    --check --reps 5 --json "$OUT/h200-bench-fp8.json" > "$L/bench_fp8.log" 2>&1
  echo "fp8 rc=$?" >> "$L/bench_fp8.log"
  timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 3 \
    --shapes H16_B1_S1024_q1,H128_B8_S4096_q1,H16_B128_S16384_q1 --json "$OUT/h200-sweep-mosaic.json" > "$L/sweep_mosaic.log" 2>&1
  echo "sweep rc=$?" >> "$L/sweep_mosaic.log"
) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed" "$L/pytest_gpu.log" | tail -2; grep -E "^FAILED|^ERROR" "$L/pytest_gpu.log" | head -10
grep -iE "registers|spill|bytes stack" "$L/ptxas_mosaic.log" | head -6
tail -9 "$L/bench_headline.log"; tail -9 "$L/bench_fp8.log"; tail -6 "$L/sweep_mosaic.log"
rm -rf "$L"
