#!/usr/bin/env bash
# For the next session's first call (nvidia-h200; carry [".fa3"]), written at the end of session 22. Copy to
# parity/sessions/<date>-s23-a.sh and commit before running; never edit it after. About 8-9 minutes.
# Session 22 changed kv_halves's step (P^T stored by store_tiled through a transposed ref, the column reductions'
# scratch in P's bytes, sums_at_end the heuristic's, l2_prefetch allowed with it) and removed upcast_loads and
# part_refill. Its calls compiled only the kv_halves / sums_at_end / l2_prefetch tests and the heuristic's H = 16
# picks (25 passed). This call: every compiled fp8 test (68, collection order), then the heuristic's fp8 sweep row
# as a check of the machine against session 22 (H16 B128 S16384: 410 us).
# Predictions: none fails; 405-420 us.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 450 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -10
timeout 60 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields none --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B128_S16384_q1 --json "$OUT/sweep-fp8-heuristic.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"; cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -4
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
