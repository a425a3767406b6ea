#!/usr/bin/env bash
# Session 8, call e (nvidia-h200): with the bench's graph replay now holding its inputs (commit after call d),
# call d's failing case (FA3 replayed after quantize_fp8) again, then call a's fp8 A/B sweep as written there:
# dequant_layout wgmma vs wgmma_8bit, 3 interleaved rounds, 5 shapes.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
F="Warning\|warn\|^E1201\|Source Loc\|cuda_status\|^$\|^jaxlib"
for args in "H16_B128_S16384_q1 quantize" "H16_B8_S4096_q1 quantize"; do
  echo "== $args"
  timeout 60 python3 parity/sessions/2026-12-01-s8-d.py $args 2>&1 | grep -v "$F" | cut -c1-200 | tail -4
done
timeout 400 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields dequant_layout=wgmma_8bit --rounds 3 \
  --reps 3 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B64_S4096_q2,H128_B64_S16384_q1,H16_B1_S1024_q1 \
  --json "$OUT/sweep-fp8-dequant-layout.json" 2>&1 | grep -v "$F" | cut -c1-200 | tail -20
