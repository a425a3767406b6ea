#!/usr/bin/env bash
# Session 9, call D (nvidia-h200), after the heuristic moved to the plain scores where a tile uses more than 16
# rows (s9-c: transposed 1.04-1.12x slower at H16 q_len 2, 1.35x at q_len 3; 1.12x faster at q_len 1) and
# fused_dequant=True became the fp8 default (s9-a: 1.04-1.06x on large shapes).
# 1. fp8: the same score-layout question (the heuristic applies to fp8 too). Prediction: plain 1.0-1.05x faster.
# 2. Issue #5's H = 16, q_len 2 rows against FA3 with the new heuristic (--grid mosaic_h16_q2). Prediction:
#    the four large B x S rows 1.03-1.07x faster than session 7's grid (3.68-3.78 -> ~3.85-3.95 TB/s at B64/B128
#    S16384), still short of 4.0; FA3/Mosaic on those ~0.97-1.0.
# 3. The fp8 grid with fused_dequant=True (s8-f's command). Prediction: fp8/bf16 0.743 -> ~0.77-0.79.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 80 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields transposed_scores --rounds 3 --reps 3 \
  --shapes H16_B64_S4096_q2,H16_B128_S16384_q2 --json "$OUT/sweep-fp8-scores.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?" >> "$L/sweep.log"
timeout 170 python3 -m parity bench --grid mosaic_h16_q2 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu --json "$OUT/bench-h16-q2.json" > "$L/bench-q2.log" 2>&1
echo "bench rc=$?" >> "$L/bench-q2.log"
timeout 300 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cut -c1-110 "$L/sweep.log" | grep -v Warning | tail -5
grep -v "Warning\|warn" "$L/bench-q2.log" | cut -c1-170 | tail -24
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-170 | tail -20
rm -rf "$L"
