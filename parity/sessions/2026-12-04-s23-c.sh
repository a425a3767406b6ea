#!/usr/bin/env bash
# Session 23, call C (nvidia-h200; carry [".fa3"]). Call B: qk_permuted compiled, 196 registers (heuristic 201), no
# spills; PTX ld.shared.b16 192 -> 0, ldmatrix 50 -> 74, st.shared.v2 52 -> 116; its 8 compiled tests passed; region
# profile (H16 B128 S4096) dequant 2.60 / 2.58 us a step (session 22's heuristic 2.84 / 2.87). Its sweep did not run
# (parity.sweep's --fields did not list qk_permuted: added). This call: the sweep, heuristic against qk_permuted.
# Prediction: qk_permuted 1.03-1.08x faster (B128 S16384 ~411 -> 380-400 us).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields qk_permuted=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1 \
  --json "$OUT/sweep-fp8-qk-permuted.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -8
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
