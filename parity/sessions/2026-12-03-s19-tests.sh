#!/usr/bin/env bash
# For the next session (written at the end of session 18), after the grid: the Mosaic kernel's compiled tests that
# session 18's call C did not reach (it ran the first 58 of 209 in collection order, 54 passed and 4 skipped, before
# its limit). Copy to parity/sessions/<date>-s19-<x>.sh before running (carry [".fa3"]). Usage: bash <copy> FIRST
# [LAST] runs tests FIRST..LAST (1-based, collection order of `pytest --collect-only -m gpu`; default LAST: the end).
# If tests/test_pallas_mosaic_gpu.py changed since session 18, FIRST=59 no longer means "the rest": check first.
# Prediction: none fails (~3.8 s a test: 59-135 in one call, 136-209 in another).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/test_pallas_mosaic_gpu.py 2>/dev/null \
  | grep "::" | sed -n "${1},${2:-\$}p" > "$L/ids.txt"
echo "$(wc -l < "$L/ids.txt") tests, $(head -1 "$L/ids.txt") .. $(tail -1 "$L/ids.txt")"
timeout 540 xargs -d '\n' -a "$L/ids.txt" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
  > "$L/pytest-mosaic.log" 2>&1; echo "rc=$?" >> "$L/pytest-mosaic.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|skipped|^FAILED|^ERROR|rc=" "$L/pytest-mosaic.log" | tail -10
rm -rf "$L"
