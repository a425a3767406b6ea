#!/usr/bin/env bash
# Session 40, call b (nvidia-h100-x1, carry [".fa3"]): a copy of s39-b (which never ran), for an H100 while the H200
# is not lent (call a: failed starts). Below, s39-b's header as it was.
# Session 39, call b (nvidia-h100-x1, carry [".fa3"]): a copy of s38-c (which never ran), for an H100 while the H200
# is not lent (call a: two failed starts). It checks what sessions 37-38 changed without a GPU (qk_fp8 / deferred_pv /
# split_ring / part_wait, the two-part ring and fp8_convert removed; the default kernels lower as before): the fp8
# compiled tests of tests/test_fp8.py (the Triton ones left out), the ring options' bitwise tests first (pair_ring's
# page-64 scenario never ran). Prediction: none fails (~4 s a test: ~45 of the ~80 inside 200 s; the log says which ran).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "pair_ring_is_bitwise or wide_ring_is_bitwise" \
  > "$L/pytest-rings.log" 2>&1; echo "rings rc=$?"; tail -3 "$L/pytest-rings.log"
timeout 200 python3 -m pytest -m gpu -v -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "not triton and not pair_ring_is_bitwise and not wide_ring_is_bitwise" > "$L/pytest-fp8.log" 2>&1
echo "fp8 rc=$?"; grep -cE " PASSED" "$L/pytest-fp8.log"; grep -E "FAILED|ERROR|passed|failed" "$L/pytest-fp8.log" | tail -8
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
