#!/usr/bin/env bash
# For the next session's first call (nvidia-h200). Written at the end of session 11 (session 9's plan ran as
# 2026-12-01-s10-a.sh and session 11's calls). Copy it to parity/sessions/<date>-s12-a.sh before running; never
# edit it after. Then next-session-second-call.sh, twice (issue #5's whole grid, one half a call; not yet run).
# 1. Where the fp8 step's 2.6 us go with overlap_dequant (the default at H = 16, q_len 1), against the fused
#    conversion: the region profile of both at H16 B128 S4096 (`--space 512`: 16 KiB of ranges, beside the
#    overlap's ~203 KiB). Regions: warpgroup 0 qk (the scores, deq_ready's wait inside "kv_wait"), pv (its P @ V
#    with the next step's first-half chunks converting inside it: "deq_wait", "dequant"), p_free_wait, dequant (the
#    second half); warpgroup 1 p_ready_wait, pv (with its chunks inside), dequant. Prediction: warpgroup 0's
#    "pv" ~0.9-1.1 us (its 3 chunks longer than the wgmma), p_free_wait ~0.1-0.3, the late dequant ~0.4,
#    qk + softmax ~0.8; warpgroup 1's p_ready_wait ~1.2-1.5 (still idle half the step).
# 2. The same at H128 B64 S4096 fp8 (the fused conversion, unchanged; for the H = 128 fp8 rows at 0.68-0.73x of
#    FA3's bf16): only if the ranges fit (`--space 240`, p_in_kv is bf16-only, so it may not: then skipped).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 512 \
  --json "$OUT/regions-fp8-overlap.json" > "$L/regions-overlap.log" 2>&1; echo "regions rc=$?" >> "$L/regions-overlap.log"
timeout 120 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 512 --set overlap_dequant=False \
  --json "$OUT/regions-fp8-fused.json" > "$L/regions-fused.log" 2>&1; echo "regions rc=$?" >> "$L/regions-fused.log"
timeout 120 python3 -m parity.regions --fp8 --shapes H128_B64_S4096_q1 --space 240 \
  --json "$OUT/regions-fp8-h128.json" > "$L/regions-h128.log" 2>&1; echo "regions rc=$?" >> "$L/regions-h128.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for f in "$L"/regions-*.log; do echo "== $f"; grep -v "Warning\|warn" "$f" | cut -c1-160 | tail -22; done
rm -rf "$L"
