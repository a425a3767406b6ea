#!/usr/bin/env bash
# Session 11, call D (nvidia-h200): every GPU test of tests/test_fp8.py under the new defaults (overlap_dequant=True,
# fused_group=2): the heuristic's fp8 path at H = 16 q_len 1 now converts under the P @ V.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 320 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py > "$L/pytest.log" 2>&1
echo "pytest rc=$?" >> "$L/pytest.log"
cp "$L/pytest.log" "$OUT/pytest.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest.log" | tail -12
rm -rf "$L"
