#!/usr/bin/env bash
# Session 30, call A (nvidia-h200; carry [".fa3"]), ~4 minutes. Where the fp8 16-row kv_halves step's time goes, per
# SASS instruction: the 16-row fp8 kernel (heuristic: kv_halves, pv_registers, pv_wait 4) is ~1.22x over the copy
# ceiling in the kernel alone (session 27's ncu: 347.5 us at H16 B128 S16384 against ~284) and sessions 11 / 25 said
# "instruction issue binds" without a per-instruction count. This call: a full ncu report of the fp8 and the bf16
# kernels at H16 B128 S16384 q1 (details, raw metrics, SASS with executed counts and stall samples) and the fp8
# kernel's PTX (read here with parity.mosaic_sass).
# Predictions: fp8 issue slots busy >= 70% (instruction issue binds), the conversion (F2FP / PRMT / LDS / LDSM) over
# half of the loop's instructions, the O^T rescale (64 FMUL a thread a step) ~10%; bf16's issue slots < 50%.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
S=H16_B128_S16384_q1
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 80 \
  python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape $S > "$L/dump.log" 2>&1; echo "rc=$?" >> "$L/dump.log"
ls -la "$OUT/dump" | head; tail -3 "$L/dump.log"
for i in jax.pallas_mosaic_gpu.fp8 jax.pallas_mosaic_gpu; do
  timeout 150 ncu --clock-control none --profile-from-start off --set full --import-source no --kernel-name regex:mosaic \
    -o "$L/full_$i" python3 -m parity.profile --impl $i --shape $S > "$L/ncu_$i.log" 2>&1
  echo "ncu $i rc=$?"; tail -2 "$L/ncu_$i.log"
  ncu -i "$L/full_$i.ncu-rep" --page details > "$L/details_$i.txt" 2>&1
  ncu -i "$L/full_$i.ncu-rep" --page raw --csv > "$L/raw_$i.csv" 2>&1
  ncu -i "$L/full_$i.ncu-rep" --page source --csv --print-source sass > "$L/sass_$i.csv" 2>&1
  rm -f "$L/full_$i.ncu-rep"
  grep -E "Duration|Registers Per|Issue Slots Busy|Issued Ipc|Executed Ipc A|No Eligible|Active Warps Per|Memory Throughput|DRAM Throughput" "$L/details_$i.txt" | head -12
done
gzip -9 "$L"/*.csv
tar czf "$OUT/logs.tgz" -C "$OUT" logs dump
rm -rf "$L"
