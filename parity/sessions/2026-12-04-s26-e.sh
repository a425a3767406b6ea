#!/usr/bin/env bash
# Session 26, call E (nvidia-h200; carry [".fa3"]). Call D's second bench named shapes outside the fp8 grid (a
# ValueError); its grid: H16 B64 S4096 q2 fp8 102.7 us (bf16 Mosaic in the same run below). Here the 32-row shapes of
# grid mosaic_h16_q2 at S16384 with the three impls in one run.
# Predictions: H16 B128 S16384 q2 fp8 ~470 us against bf16 Mosaic ~650-750; B32 S16384 q2 fp8 1.2-1.5x faster than
# bf16 Mosaic.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m parity bench --grid mosaic_h16_q2 --check --reps 3 --no-ceilings \
  --shapes H16_B32_S16384_q2,H16_B128_S16384_q2 --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 \
  --json "$OUT/bench-fp8-32rows.json" > "$L/bench-fp8-32rows.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8-32rows.log"
grep -v "Warning\|warn" "$L/bench-fp8-32rows.log" | cut -c1-150 | tail -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
