#!/usr/bin/env bash
# For the next session's second call (nvidia-h200), if the first call's deferred_pv sweep gained. Written at the end of
# session 15. Copy it to parity/sessions/<date>-s16-b.sh before running; never edit it after. Call with carry [".fa3"].
# deferred_pv on issue #5's 13 compute-bound rows (H = 128, B >= 32, S >= 4096, q_len 1 and 2, and B128 S8192 q2),
# against the heuristic in the same sweep (3 rounds, 2 s idle before each timing), FA3 beside. Prediction: the first
# call's gain on each row; a heuristic change then needs the bench's grid on it (session 14's call E, with the heuristic
# turning deferred_pv on at H >= 128, plain scores).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
S=""
for q in 1 2; do for b in 32 64 128; do for s in 4096 16384; do S="$S,H128_B${b}_S${s}_q${q}"; done; done; done
S="$S,H128_B128_S8192_q2"
timeout 540 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields deferred_pv --rounds 3 --reps 3 --cooldown 2 \
  --shapes "${S#,}" --json "$OUT/sweep-deferred-pv-grid13.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -30
rm -rf "$L"
