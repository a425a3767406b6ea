#!/usr/bin/env bash
# Session 8, call c (nvidia-h200): which step of the fp8 sweep faults (see 2026-12-01-s8-c.py), on the big
# shape with and without FA3, and on a small shape with FA3.
set -uo pipefail
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
P=parity/sessions/2026-12-01-s8-c.py
for args in "H16_B128_S16384_q1 fa3-first" "H16_B128_S16384_q1 no-fa3" "H16_B8_S4096_q1 fa3-first"; do
  echo "== $args"
  timeout 120 python3 $P $args 2>&1 | grep -v "Warning\|warn\|^E1201\|Source Loc\|cuda_status\|^$\|^jaxlib" | cut -c1-220 | head -12
done
