#!/usr/bin/env bash
# Session 3, call D (nvidia-h200-x2): fp8 Triton with 8 warps (compiled tests, the fp8 grid, sweeps around
# it), and profiles for the next Mosaic steps: every kernel of one call at three small shapes (Mosaic and
# FA3: where the fixed cost goes) and a full ncu report of the Mosaic kernel at H128 B64 S16384 (SASS stalls).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
LIST="ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum"
SMALL="H16_B8_S1024_q1 H128_B1_S1024_q1 H16_B1_S16384_q1"
( export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py > "$L/pytest_fp8.log" 2>&1
  echo "pytest rc=$?" >> "$L/pytest_fp8.log"
  timeout 120 python3 -m parity bench --grid fp8 --impls torch.fa3,jax.pallas_triton,jax.pallas_triton.fp8 \
    --no-ceilings --check --reps 3 --json "$OUT/h200-bench-fp8.json" > "$L/bench_fp8.log" 2>&1
  for s in $SMALL; do
    timeout 40 $LIST python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape $s > "$L/list_mosaic_$s.txt" 2>&1
  done ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 60 python3 -m parity.sweep --impl pallas_triton --fp8 --reps 3 --fields block_kv,num_stages \
    --shapes H16_B128_S16384_q1 --json "$OUT/h200-sweep-triton-fp8-h16.json" > "$L/sweep_fp8_h16.log" 2>&1
  timeout 60 python3 -m parity.sweep --impl pallas_triton --fp8 --reps 3 --fields num_warps,block_kv \
    --shapes H128_B64_S16384_q1 --json "$OUT/h200-sweep-triton-fp8-h128.json" > "$L/sweep_fp8_h128.log" 2>&1
  timeout 120 ncu --clock-control none --profile-from-start off --set full --kernel-name regex:mosaic \
    -o "$L/mosaic_full" python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape H128_B64_S16384_q1 \
    > "$L/ncu_full.log" 2>&1
  ncu -i "$L/mosaic_full.ncu-rep" --page details > "$L/mosaic_full_details.txt" 2>&1
  ncu -i "$L/mosaic_full.ncu-rep" --page source --csv --print-source sass > "$L/mosaic_full_sass.csv" 2>&1
  rm -f "$L/mosaic_full.ncu-rep"
  for s in $SMALL; do
    timeout 40 $LIST python3 -m parity.profile --impl torch.fa3 --shape $s > "$L/list_fa3_$s.txt" 2>&1
  done ) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED" "$L/pytest_fp8.log" | tail -4; tail -12 "$L/bench_fp8.log"
tail -4 "$L/sweep_fp8_h16.log"; tail -4 "$L/sweep_fp8_h128.log"
for f in "$L"/list_*.txt; do echo "== $(basename $f)"; grep -E "^\s+[a-zA-Z_].*\(|gpu__time_duration" "$f" | paste - - | awk '{print $1, $(NF)}' | head -12; done
wc -c "$L/mosaic_full_sass.csv" "$L/mosaic_full_details.txt"; rm -rf "$L"
