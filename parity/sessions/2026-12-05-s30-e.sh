#!/usr/bin/env bash
# Session 30, call E (nvidia-h200; carry [".fa3"]), ~2 minutes, on the last ~4 minutes of device time (call D got no
# machine). The headline fp8 row side by side on the load_ahead heuristic: FA3 (bf16), bf16 Mosaic, fp8 Mosaic, each
# checked against FA3. Prediction: fp8 335-350 us against bf16 ~560 (1.6-1.7x) and FA3 ~590; the check passes.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 140 python3 -m parity bench --grid fp8 --shapes H16_B128_S16384_q1 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8-h16-b128.json" \
  > "$L/bench.log" 2>&1
echo "bench rc=$?"; grep -v Warn "$L/bench.log" | tail -14 | cut -c1-160
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
