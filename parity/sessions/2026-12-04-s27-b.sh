#!/usr/bin/env bash
# Session 27, call B (nvidia-h200; carry [".fa3"]), ~4 minutes. Every kernel of one call (ncu durations, cold caches).
# Call A: the kv_halves step's regions are alike at H16 B64 S4096 q_len 2 and H32 B64 S4096 q_len 1 (dequant 1.6-1.9,
# pv 2.0-2.7 us), so the 102 against 89 us is outside the step chain, or outside the kernel: q's f16 conversion
# (fp8 only), the schedule fusion, the combine (2 splits), pv_registers's column gather (out[..., PV_UNPERM]).
# Also B1 S1024 (fp8 13.0 us against bf16 9.8) and the bench's loop of 4 calls at the q_len 2 row.
# Predictions: the fp8 kernel alike at the two B64 shapes (~80-85 us); q2's gap in the XLA ops around it (3-6 us);
# at B1 the fp8 kernel ~1-2 us over bf16's, plus ~2-3 us for q's conversion.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
NCU="ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum"
for s in H16_B64_S4096_q2 H32_B64_S4096_q1 H16_B1_S1024_q1; do
  for i in jax.pallas_mosaic_gpu.fp8 jax.pallas_mosaic_gpu torch.fa3; do
    timeout 50 $NCU python3 -m parity.profile --impl $i --shape $s > "$L/list_${i}_$s.txt" 2>&1
  done
done
timeout 50 $NCU python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape H16_B64_S4096_q2 --loop 4 \
  > "$L/list_loop4_fp8_H16_B64_S4096_q2.txt" 2>&1
for f in "$L"/list_*.txt; do echo "== $(basename $f .txt)"; grep -E "^\s+\S+ \(|gpu__time_duration" "$f" | paste - - \
  | awk '{print substr($1,1,60), $NF}'; done | tee "$OUT/ncu-summary.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
