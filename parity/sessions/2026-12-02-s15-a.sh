#!/usr/bin/env bash
# For the next session's first call (nvidia-h200). Written at the end of session 14. Copy it to
# parity/sessions/<date>-s15-a.sh before running; never edit it after. Call with carry [".fa3"].
# Issue #5's last target, 600 TFLOP/s at H = 128: session 14's heads_fastest (now the heuristic's pick) brought the
# 13 compute-bound rows to 0.982 of FA3 (best 568 TFLOP/s), and kv_multicast (the KV read once per request) changed
# nothing: the step (2.16 us at H128 B64 S16384 q1) is bound by the compute warpgroups. Where does it go now?
# 1) python -m parity.regions (Mosaic GPU profiler, per warpgroup) on H128 B64 S4096 q1 with the heuristic's pick,
#    and with heads_fastest=False (session 7's profile order) beside; both with p_in_kv=True and 240 ranges (at
#    H = 128 the profiler's buffer needs the 7 KiB p_in_kv frees; session 7: p_in_kv 0.4-5% slower). Prediction: the KV wait (kv_ready) per step
#    drops from the default order to heads_fastest; the scores' wgmma (~1.33 us in session 7) and warpgroup 0's
#    softmax stay, and make up ~2 us of the step.
# 2) the fp8 A/Bs of next-session-third-call.sh are independent (run them next, or cut them).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 90 python3 -m parity.regions --shapes H128_B64_S4096_q1 --space 240 --set p_in_kv=True --json "$OUT/regions-h128-hf.json" \
  > "$L/regions-hf.log" 2>&1; echo "rc=$?" >> "$L/regions-hf.log"
timeout 90 python3 -m parity.regions --shapes H128_B64_S4096_q1 --space 240 --set p_in_kv=True,heads_fastest=False \
  --json "$OUT/regions-h128-default-order.json" > "$L/regions-default.log" 2>&1; echo "rc=$?" >> "$L/regions-default.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for f in regions-hf regions-default; do echo "== $f"; grep -v "Warn" "$L/$f.log" | tail -30; done
rm -rf "$L"
