#!/usr/bin/env bash
# For the next session's first call (nvidia-h200-x2). Two opt-in variants were written after session 2's
# device time was spent and checked on the CPU only (interpret mode, CUDA/Triton lowering, race detector):
# the Mosaic kernel's FlashMLA schedule (MosaicConfig(schedule="flashmla")) and the Triton kernel's
# cache-tile-as-left-operand dots for fp8 (TritonConfig(kv_lhs=True)).
# GPU 0: their compiled tests. GPU 1: the Mosaic schedule A/B on 5 shapes, the fp8 grid with kv_lhs, the headline.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
( CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
    tests/test_pallas_mosaic_gpu.py::TestGPU::test_scenario_flashmla_schedule tests/test_pallas_mosaic_gpu.py::TestGPU::test_deterministic \
    tests/test_fp8.py tests/test_pallas_triton.py \
    > "$L/pytest_flashmla.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_flashmla.log"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 60 python3 -c "
from mla_jax.pallas_mosaic_gpu import MosaicConfig
from parity import bench
inp = bench.make_inputs(bench.Shape(128, 64, 16384))
bench.time_impl(bench._jax_kernel('pallas_mosaic_gpu', MosaicConfig(schedule='flashmla')), inp, 1)" > "$L/ptxas_flashmla.log" 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 3 --fields schedule \
    --shapes H16_B128_S16384_q1,H128_B64_S16384_q1,H128_B8_S4096_q1,H16_B1_S1024_q1,H16_B64_S4096_q2 \
    --json "$OUT/h200-sweep-mosaic-flashmla.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
  timeout 130 python3 -m parity bench --grid fp8 --impls torch.fa3,jax.pallas_triton,jax.pallas_triton.fp8,jax.pallas_triton.fp8.kv_lhs \
    --no-ceilings --check --reps 3 --json "$OUT/h200-bench-fp8.json" > "$L/bench_fp8.log" 2>&1
  timeout 170 python3 -m parity bench --grid headline --impls torch.fa3,torch.flashmla,jax.pallas_triton,jax.pallas_mosaic_gpu \
    --check --reps 5 --json "$OUT/h200-bench-headline.json" --png "$OUT/h200-roofline-headline.png" > "$L/bench.log" 2>&1 ) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED" "$L/pytest_flashmla.log" | tail -5; grep -E "Used .* registers|spill" "$L/ptxas_flashmla.log" | head -3
tail -12 "$L/sweep.log"; tail -6 "$L/bench_fp8.log"; tail -8 "$L/bench.log"; rm -rf "$L"
