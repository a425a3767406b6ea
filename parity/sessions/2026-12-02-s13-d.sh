#!/usr/bin/env bash
# Session 13, call D (nvidia-h200), the last ~5 minutes: call C's probe (parity/sessions/2026-12-02-s13-probe-fa3-order.py)
# on two more shapes. Call C at H16 B128 S16384: fp8 Mosaic 604 us before FA3 ran, 699 right after FA3 was timed,
# 604 again after a 3 s sleep; bf16 Mosaic 559 / 566 / 559 (memory-bound, barely moved). Prediction: H16 B32
# S16384 the same pattern (fp8 ~1.1x slower right after FA3, bf16 ~1.01x); H128 B64 S16384 (compute-bound, bf16
# Mosaic ~600 us) bf16 also slower right after FA3 (~1.05x), the clock mattering where the SMs bind.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for s in H16_B32_S16384_q1 H128_B64_S16384_q1; do
  timeout 115 python3 parity/sessions/2026-12-02-s13-probe-fa3-order.py $s > "$L/probe-$s.log" 2>&1
  echo "probe $s rc=$?" >> "$L/probe-$s.log"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for s in H16_B32_S16384_q1 H128_B64_S16384_q1; do grep -v "Warn\|warn\|^  " "$L/probe-$s.log" | tail -4; done
rm -rf "$L"
