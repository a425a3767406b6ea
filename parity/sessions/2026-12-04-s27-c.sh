#!/usr/bin/env bash
# Session 27, call C (nvidia-h200; carry [".fa3"]), ~3 minutes. ncu kernel durations (one call, cold caches).
# Call B: the fp8 kernel takes 81.5 us at H16 B64 S4096 q_len 2 but 72.5 at H32 B64 S4096 q_len 1 (bf16: 82.1, 83.3).
# The one difference in the kernel's work: q_len 2's last step is masked (its first token sees 4095 keys), while at
# S4096 q_len 1 no step is (4096 = 64 x 64). If a split's masked step is slow (the 32-row kernel at 255 registers
# spills; the masked step adds the keys' selects on K and on V^T's 8 chunks), every CTA of the last split ends late.
# Prediction: S4095 q_len 1 ~80 us (like q_len 2), S4095 q_len 2 ~81; bf16 at S4095 ~83 (no change); at 16 rows
# (H16 B128 S16383 against S16384, pv_wait 4, no spills) the masked step costs < 2 us.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
NCU="ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum"
for s in H32_B64_S4096_q1 H32_B64_S4095_q1 H16_B64_S4096_q2 H16_B64_S4095_q2 H16_B128_S16384_q1 H16_B128_S16383_q1; do
  timeout 50 $NCU python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape $s > "$L/list_fp8_$s.txt" 2>&1
done
timeout 50 $NCU python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape H32_B64_S4095_q1 \
  > "$L/list_bf16_H32_B64_S4095_q1.txt" 2>&1
for f in "$L"/list_*.txt; do echo "== $(basename $f .txt)"; grep -E "^\s+\S+ \(|gpu__time_duration" "$f" | paste - - \
  | awk '{print substr($1,1,60), $NF}' | grep mosaic_gpu_kernel; done | tee "$OUT/ncu-summary.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
