#!/usr/bin/env bash
# Session 27, call E (nvidia-h200; carry [".fa3"]), ~7 minutes. call D's sweep again: parity.sweep had no zero_tail field (call D: the 4 tests passed).
# Call C: the 32-row kv_halves kernel's masked step costs ~9 us (ncu: H32 B64 S4095 q1 82.1 against S4096 73.2 us);
# at 16 rows ~2 us (H16 B128 S16383 349.7 against 347.6). zero_tail: the masked step zeroes its slot's rows past
# kv_len in shared memory (an AND of each fp8 chunk with a byte mask, stored back), then converts as an unmasked step.
# 0) its compiled tests (3 interpret cases compiled; bitwise zero_tail=False on 6 scenarios);
# 1) the sweep, heuristic against zero_tail=True, FA3 beside (3 rounds, 1 s idle).
# Predictions: the tests pass (bitwise); H32 B64 S4095 q1 and H16 B64 S4096 q2 1.07-1.10x faster (~8 us of ~95);
# H32 B64 S4096 q1 (no masked step) unchanged; H16 B128 S16383 ~1.00x; H16 B8 S4095 1.02-1.05x.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 320 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields zero_tail=True --rounds 3 --reps 3 \
  --cooldown 1 --shapes H32_B64_S4095_q1,H16_B64_S4096_q2,H32_B64_S4096_q1,H16_B128_S16383_q1,H16_B8_S4095_q1 \
  --json "$OUT/h200-sweep-fp8-zero-tail-s27e-2026-12-04.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"; grep -v Warn "$L/sweep.log" | tail -16
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
