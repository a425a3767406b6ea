#!/usr/bin/env bash
# Session 4, call A (nvidia-h200-x2, written at the end of session 3 as next-session-first-call.sh, ~8 min).
# the Mosaic kernel's three-warpgroup schedule (MosaicConfig(schedule="three_wg")) is checked on the CPU only.
# GPU 0: its compiled tests, ptxas registers/spills, every kernel of one call at the two q_len 2 shapes
# that got slower with the combine kernel in session 3's call E, and of the bench's loop of 4 calls. GPU 1: the schedule A/B on 5 shapes, then the
# headline with the defaults.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
( export CUDA_VISIBLE_DEVICES=0
  # the whole compiled Mosaic suite: the default schedule's code was also restructured after session 3's last
  # GPU run (flashmla and three_wg share one function; CPU-checked only)
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
    tests/test_pallas_mosaic_gpu.py > "$L/pytest_three_wg.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_three_wg.log"
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 60 python3 -c "
from mla_jax.pallas_mosaic_gpu import MosaicConfig
from parity import bench
inp = bench.make_inputs(bench.Shape(128, 64, 16384))
bench.time_impl(bench._jax_kernel('pallas_mosaic_gpu', MosaicConfig(schedule='three_wg')), inp, 1)" > "$L/ptxas_three_wg.log" 2>&1
  for s in H16_B1_S1024_q2 H128_B8_S1024_q2; do
    timeout 45 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
      python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape $s > "$L/list_mosaic_$s.txt" 2>&1
  done
  # the bench's loop of 4 calls: does the schedule fusion run once (shared by the 4 calls) or 4 times?
  timeout 45 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
    python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape H16_B8_S1024_q1 --loop 4 > "$L/list_mosaic_loop4.txt" 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 3 --fields schedule \
    --shapes H16_B128_S16384_q1,H128_B64_S16384_q1,H128_B8_S4096_q1,H16_B1_S1024_q1,H16_B64_S4096_q2 \
    --json "$OUT/h200-sweep-mosaic-three-wg.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
  timeout 150 python3 -m parity bench --grid headline --impls torch.fa3,torch.flashmla,jax.pallas_triton,jax.pallas_mosaic_gpu \
    --check --reps 5 --json "$OUT/h200-bench-headline.json" > "$L/bench.log" 2>&1 ) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED" "$L/pytest_three_wg.log" | tail -4; grep -E "Used .* registers|spill" "$L/ptxas_three_wg.log" | head -4
tail -16 "$L/sweep.log"; tail -6 "$L/bench.log"
for f in "$L"/list_*.txt; do echo "== $f"; grep -E "^\s+\S+ \(|gpu__time_duration" "$f" | paste - - | awk '{print $1, $NF}'; done
rm -rf "$L"
