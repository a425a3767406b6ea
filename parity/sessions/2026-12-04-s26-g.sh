#!/usr/bin/env bash
# Session 26, call G (nvidia-h200; carry [".fa3"]), with the session's last ~4 minutes. The 32-row change moved
# kv_halves's merge buffers at 16 rows too (the partials' O^T over q and the ring, the merge's vectors outside the
# union); calls D and E timed it (fp8 gaps as before) but no compiled 16-row test ran on it. Here: the 4 compiled
# pv_registers cases at 16 rows and the compiled kv_halves NaN-in-one-head test.
# Prediction: all pass.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "(compiled and pv_registers and not q2_page and not heads_32) or kv_halves_nan_in_one_head_compiled" \
  > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|Mismatch|rc=" "$L/tests.log" | cut -c1-200 | tail -8
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
