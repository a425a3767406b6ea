#!/usr/bin/env bash
# For the next session's second call (nvidia-h200), after next-session-first-call.sh (which runs the compiled
# seesaw tests). Written at the end of session 8. Copy it to parity/sessions/<date>-s9-b.sh before running.
# Issue #5's other miss (session 8's reading of the grid): H = 16 with q_len 2 at large B x S runs at 3.68-3.78 TB/s
# (FA3 3.91-4.09), under the 4.0 target, while q_len 1 reaches 4.22-4.32. Session 7 guessed the step's chain
# (transposed scores with N = 32, twice the softmax columns) outlasts the step's bytes (~2.27 us a 64-key step
# per SM at 4.26 TB/s). Nothing measured it. This call:
# 1. Region profiles of q_len 2 against q_len 1 at H16 B128 S16384 and at H16 B64 S4096 q2 (the transposed
#    scores keep only the rows in use of q in shared memory, so the profiler's buffer fits at H = 16: --space 1024).
#    Prediction: warpgroup 0's chain (kv_wait excluded) ~2.0 us a step at q_len 1 and ~2.5 us at q_len 2, with
#    kv_wait near 0 at q_len 2 (compute-latency bound) and larger at q_len 1 (memory bound).
# 2. A sweep of the split count and of the plain scores at the q_len 2 shapes (3 interleaved rounds), to see
#    whether more, shorter blocks or the other score layout shorten the chain there.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m parity.regions --shapes H16_B128_S16384_q2,H16_B128_S16384_q1,H16_B64_S4096_q2 --space 1024 \
  --json "$OUT/regions-h16-q2-q1.json" > "$L/regions.log" 2>&1; echo "regions rc=$?" >> "$L/regions.log"
timeout 330 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields num_splits,transposed_scores --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q2,H16_B64_S16384_q2,H16_B32_S16384_q2 --json "$OUT/sweep-h16-q2.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warning "$L/regions.log" | cut -c1-160 | tail -45
cut -c1-160 "$L/sweep.log" | grep -v Warning | tail -16
rm -rf "$L"
