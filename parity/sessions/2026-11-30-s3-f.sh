#!/usr/bin/env bash
# Session 3, call F (nvidia-h200, the last 160 s of device time): every kernel of one Mosaic call (v5) at the
# shape that got slower with the combine kernel in call E (H16 B1 S1024 q2) and at one that got faster.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for s in H16_B1_S1024_q2 H16_B8_S1024_q1; do
  timeout 45 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
    python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape $s > "$OUT/h200-ncu-kernels-mosaic-v5_$s.txt" 2>&1
  echo "== $s"; grep -E "^\s+\S+ \(|gpu__time_duration" "$OUT/h200-ncu-kernels-mosaic-v5_$s.txt" | paste - - | awk '{print $1, $2, $NF}'
done
