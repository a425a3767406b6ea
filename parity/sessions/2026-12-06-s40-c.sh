#!/usr/bin/env bash
# Session 40, call c (nvidia-h100-x1, carry [".fa3"]): after s40-b (rings' -q run printed nothing inside 100 s; 32 of
# the other fp8 compiled tests passed inside 200 s, none failed): the rest of those (collection order from the 33rd,
# same -k), then the two ring options' bitwise tests with -v and more time. Prediction: none fails.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/test_fp8.py \
  -k "not triton and not pair_ring_is_bitwise and not wide_ring_is_bitwise" 2>/dev/null | grep "::" | sed -n '33,$p' > "$L/ids.txt"
echo "$(wc -l < "$L/ids.txt") tests from $(head -1 "$L/ids.txt")"
timeout 300 xargs -d '\n' -a "$L/ids.txt" python3 -m pytest -m gpu -v -p no:cacheprovider -rfEs > "$L/pytest-fp8-rest.log" 2>&1
echo "fp8 rest rc=$?"; grep -c " PASSED" "$L/pytest-fp8-rest.log"; grep -E "FAILED|ERROR|passed|failed" "$L/pytest-fp8-rest.log" | tail -8
timeout 250 python3 -m pytest -m gpu -v -p no:cacheprovider -rfEs tests/test_fp8.py -k "pair_ring_is_bitwise or wide_ring_is_bitwise" \
  > "$L/pytest-rings.log" 2>&1; echo "rings rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$L/pytest-rings.log" | tail -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
