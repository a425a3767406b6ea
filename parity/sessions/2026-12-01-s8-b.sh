#!/usr/bin/env bash
# Session 8, call b (nvidia-h200): isolate call a's illegal address (fp8 sweep, H16_B128_S16384_q1): each
# fp8 layout in its own process (once + a 400-call loop, then compute-sanitizer on one call if present),
# then the sweep's heuristic alone (--fields none) as in call a.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
P=parity/sessions/2026-12-01-s8-b.py
for s in H16_B128_S16384_q1 H16_B32_S16384_q1; do
  for lay in wgmma wgmma_8bit; do
    timeout 100 python3 $P $s $lay 400 2>&1 | grep -v "Warning\|warn" | grep -E "ok|Error|error|ILLEGAL" | head -4
    echo "$s $lay rc=${PIPESTATUS[0]}"
  done
done
which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields none --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q1 2>&1 | grep -v Warn | cut -c1-200 | grep -v "^E1201\|Source Loc\|cuda_status\|^$" | head -12
echo "sweep none rc=${PIPESTATUS[0]}"
