#!/usr/bin/env bash
# Session 30, call A (nvidia-h200; carry [".fa3"]), ~5 minutes. (1) The compiled bitwise tests of two new opt-ins of
# the fp8 kv_halves step: lazy_rescale (O^T's rescale in a branch a thread takes only where its alpha is not 1) and
# pv_int_chunks (n of P @ V's 8 chunks converted by Marlin's integer form, no prmt, no cvt, 2^-8 of the values; those
# O^T rows times 2^8 at the end). (2) Where the 16-row step's time goes: a full ncu report of the fp8 and the bf16
# kernels at H16 B128 S16384 q1 (details, raw metrics with the pipes' utilization, SASS with executed counts and
# stall samples) and the fp8 kernel's PTX (read here with parity.mosaic_sass).
# Predictions: both bitwise tests pass; fp8 issue slots busy >= 60%, the conversion pipe (F2FP) the busiest pipe
# (>= 80% of its peak) if sessions 11 / 25's "4-8 clocks a cvt" holds; the O^T rescale (64 FMUL a thread a step) ~8%
# of the loop's instructions; bf16's issue slots < 50%.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -x -m gpu tests/test_fp8.py -k "lazy_rescale_is_bitwise or pv_int_chunks_is_bitwise" \
  > "$L/tests.log" 2>&1; echo "tests rc=$?"; tail -3 "$L/tests.log"
S=H16_B128_S16384_q1
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 60 \
  python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape $S > "$L/dump.log" 2>&1; echo "dump rc=$?"
ls "$OUT/dump" | head
for i in jax.pallas_mosaic_gpu.fp8 jax.pallas_mosaic_gpu; do
  timeout 100 ncu --clock-control none --profile-from-start off --set full --import-source no --kernel-name regex:mosaic \
    -o "$L/full_$i" python3 -m parity.profile --impl $i --shape $S > "$L/ncu_$i.log" 2>&1
  echo "ncu $i rc=$?"; tail -1 "$L/ncu_$i.log"
  ncu -i "$L/full_$i.ncu-rep" --page details > "$L/details_$i.txt" 2>&1
  ncu -i "$L/full_$i.ncu-rep" --page raw --csv > "$L/raw_$i.csv" 2>&1
  ncu -i "$L/full_$i.ncu-rep" --page source --csv --print-source sass > "$L/sass_$i.csv" 2>&1
  rm -f "$L/full_$i.ncu-rep"
  grep -E "Duration|Registers Per|Issue Slots Busy|Issued Ipc|No Eligible|Memory Throughput|DRAM Throughput" \
    "$L/details_$i.txt" | head -8
done
gzip -9 "$L"/*.csv
tar czf "$OUT/logs.tgz" -C "$OUT" logs dump
rm -rf "$L" "$OUT/dump"
