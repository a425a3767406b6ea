#!/usr/bin/env bash
# Session 2, call A (nvidia-h200-x2): the whole GPU suite on GPU 0 while GPU 1 runs the parity report,
# the fp8 tile diagnosis and an Nsight Compute profile of the Mosaic kernel; then the 2-GPU DCP tests.
set -uo pipefail
# (helpers were editing these files when this ran: take the committed versions carried in .snap)
[ -d .snap ] && cp -r .snap/. . && rm -f tests/test_bench.py
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
( CUDA_VISIBLE_DEVICES=0 timeout 470 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=20 \
    --ignore=tests/test_dcp.py tests/ > "$OUT/pytest_gpu.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_gpu.log" ) &
PYT=$!
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 -m parity --quiet --json "$OUT/h200-parity.json" --png "$OUT/h200-parity-errors.png" > "$OUT/parity.log" 2>&1; echo "parity rc=$?" >> "$OUT/parity.log"
  timeout 120 python3 -m parity.fp8_tiles --json "$OUT/h200-fp8-tiles.json" > "$OUT/fp8_tiles.log" 2>&1; echo "fp8_tiles rc=$?" >> "$OUT/fp8_tiles.log"
  for s in H128_B64_S16384_q1 H16_B128_S16384_q1 H128_B8_S4096_q1; do
    timeout 90 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
      python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape $s > "$OUT/ncu_mosaic_$s.txt" 2>&1
  done
  timeout 60 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats --section LaunchStats \
      python3 -m parity.profile --impl torch.fa3 --shape H128_B64_S16384_q1 > "$OUT/ncu_fa3_H128_B64_S16384_q1.txt" 2>&1
) &
wait $PYT
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_dcp.py > "$OUT/pytest_dcp.log" 2>&1; echo "dcp rc=$?" >> "$OUT/pytest_dcp.log"
wait
tail -30 "$OUT/pytest_gpu.log"; tail -5 "$OUT/pytest_dcp.log"; tail -3 "$OUT/parity.log"; cat "$OUT/fp8_tiles.log" | cut -c1-200
for f in "$OUT"/ncu_*.txt; do echo "== $f"; grep -E "^\s+(Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Stall|Warp Cycles Per Issued)" "$f" | head -12; done
