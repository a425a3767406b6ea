#!/usr/bin/env bash
# Session 11, call E (nvidia-h200), on the last ~4 minutes of device time: step 1 of next-session-first-call.sh,
# the fp8 step's regions with overlap_dequant (the default) and without, H16 B128 S4096 (predictions there).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 75 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 512 \
  --json "$OUT/regions-fp8-overlap.json" > "$L/regions-overlap.log" 2>&1; echo "regions rc=$?" >> "$L/regions-overlap.log"
cp "$L/regions-overlap.log" "$OUT/"
timeout 75 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 512 --set overlap_dequant=False \
  --json "$OUT/regions-fp8-fused.json" > "$L/regions-fused.log" 2>&1; echo "regions rc=$?" >> "$L/regions-fused.log"
cp "$L/regions-fused.log" "$OUT/"
for f in "$L"/regions-*.log; do echo "== $f"; grep -v "Warning\|warn" "$f" | cut -c1-160 | tail -22; done
rm -rf "$L"
