#!/usr/bin/env bash
# Session 26, call D (nvidia-h200; carry [".fa3"]). Call C (each sweep with FA3 beside it): kv_halves at 32 rows
# (pv_wait 1) against the heuristic: H16 B128 S16384 q2 739.1 -> 467.3 us, H32 B64 S4096 q1 107.0 -> 89.1, H16 B64
# S4096 q2 107.6 -> 101.7, B8 S4096 q2 24.6 -> 31.9. The heuristic now takes it at 32 rows where a split has >= 32
# steps (pv_registers, pv_wait 1). The kernel is call B's (its 3 compiled 32-row tests passed there).
# 1) the fp8 grid (as session 25 call E); 2) the same three impls on two more 32-row shapes.
# Predictions: H16 B64 S4096 q2 fp8 107.2 -> ~100 us (still below bf16 Mosaic's ~90); the other grid rows as
# session 25 call E (+-3%); H16 B128 S16384 q2 fp8 ~470 us against bf16 Mosaic ~650-750; H32 B64 S4096 q1 fp8 ~90
# against bf16 ~85-95.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
I=torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8
timeout 300 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls $I --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-150 | tail -24
timeout 150 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings --shapes H16_B128_S16384_q2,H32_B64_S4096_q1 \
  --impls $I --json "$OUT/bench-fp8-32rows.json" > "$L/bench-fp8-32rows.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8-32rows.log"
grep -v "Warning\|warn" "$L/bench-fp8-32rows.log" | cut -c1-150 | tail -10
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
