#!/usr/bin/env bash
# Session 24, call G (nvidia-h200; carry [".fa3"]). About 2 minutes.
# The review's commit 5d514d3 stores V's f16 copy once, before the interpret / compiled branch of kv_halves's
# conversion (the same operations in the same order when compiled). This call: the compiled qk_permuted fp8 tests.
# Prediction: all pass.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "compiled and qk_permuted" > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -6
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
