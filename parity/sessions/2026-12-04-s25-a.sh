#!/usr/bin/env bash
# Session 25 call A (2026-12-04; nvidia-h200; carry [".fa3"]): session 24's next-session-first-call.sh. About 6 minutes.
# Session 24 ran every compiled fp8 test of session 23's kernel (all passed) and made fused_group=4 the heuristic's
# pick with an fp8 cache at H = 128 (1.015-1.03x on four rows). This call: issue #7's whole fp8 grid with that
# heuristic, beside FA3 and bf16 Mosaic, with the check (session 23: fp8 / bf16 0.896, FA3/fp8 0.989).
# Predictions: fp8 / bf16 0.90-0.92, FA3/fp8 0.99-1.02; H16 B128 S16384 fp8 375-395 us.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 340 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-150 | tail -24
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
