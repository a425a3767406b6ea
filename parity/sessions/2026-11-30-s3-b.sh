#!/usr/bin/env bash
# Session 3, call B (nvidia-h200-x2). The Mosaic kernel now defaults to FlashMLA's schedule, writes
# split partials per token through a shared-memory stage that aliases q and the KV ring, loads the
# first block-table chunk with the request info, and picks splits with a cost model. kv_lhs is gone.
# GPU 0: the compiled Mosaic tests, then the headline. GPU 1: split sweep on small shapes, the fp8
# Triton sweep and profile, the compiled Triton and fp8 tests.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
NCU="ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis_Tables"
( export CUDA_VISIBLE_DEVICES=0
  timeout 320 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
    > "$L/pytest_mosaic.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_mosaic.log"
  timeout 150 python3 -m parity bench --grid headline --impls torch.fa3,torch.flashmla,jax.pallas_triton,jax.pallas_mosaic_gpu \
    --check --reps 5 --json "$OUT/h200-bench-headline.json" > "$L/bench.log" 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 130 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 3 --fields num_splits \
    --shapes H16_B1_S1024_q1,H16_B8_S4096_q1,H128_B8_S4096_q1,H128_B1_S1024_q1,H16_B64_S4096_q2,H128_B32_S4096_q2 \
    --json "$OUT/h200-sweep-mosaic-splits.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
  timeout 90 python3 -m parity.sweep --impl pallas_triton --fp8 --reps 3 --fields num_warps,num_stages,block_kv \
    --shapes H16_B128_S16384_q1 --json "$OUT/h200-sweep-triton-fp8.json" > "$L/sweep_fp8.log" 2>&1
  for impl in jax.pallas_triton.fp8 jax.pallas_triton; do
    timeout 50 $NCU python3 -m parity.profile --impl $impl --shape H16_B32_S16384_q1 > "$L/ncu_$impl.txt" 2>&1
  done
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_triton.py tests/test_fp8.py \
    > "$L/pytest_triton.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_triton.log" ) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for f in "$L"/pytest_*.log; do grep -E "passed|failed|^FAILED|^ERROR" "$f" | tail -6; done
tail -9 "$L/sweep.log"; tail -6 "$L/sweep_fp8.log"
for f in "$L"/ncu_*.txt; do echo "== $f"; grep -E "^\s+(Duration|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Dynamic Shared|Local)" "$f" | head -8; done
tail -8 "$L/bench.log"; rm -rf "$L"
