#!/usr/bin/env bash
# Session 36, call d (nvidia-h100-x1; carry [".fa3"]): H200s did not come; s36-c's part 2 alone on an H100 (the same
# sm_90a module): is pair_ring bitwise the default? (Prediction: yes; s36-c's header says where to look if not.)
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fp8.py -k "pair_ring_is_bitwise" \
  > "$L/tests-pair.log" 2>&1
echo "tests pair_ring rc=$?"; grep -E "passed|failed|^E  .*(Error|Mismatch)|^E  " "$L/tests-pair.log" | tail -12 | cut -c1-200
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
