#!/usr/bin/env bash
# Session 21, call E (nvidia-h200; carry [".fa3"]), on the ~5 minutes of device time left: the compiled Mosaic tests
# call A's 270 s did not reach (186-217 of tests/test_pallas_mosaic_gpu.py's GPU tests; call A: 143-185, 43 passed).
# Prediction: every one passes or skips with its reason (none of their code changed in session 21).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/test_pallas_mosaic_gpu.py 2>/dev/null \
  | grep "::" | sed -n "186,\$p" > "$L/ids.txt"
echo "$(wc -l < "$L/ids.txt") tests, $(head -1 "$L/ids.txt") .. $(tail -1 "$L/ids.txt")"
timeout 200 xargs -d '\n' -a "$L/ids.txt" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
  > "$L/pytest-mosaic.log" 2>&1; echo "rc=$?" >> "$L/pytest-mosaic.log"
grep -E "passed|failed|skipped|^FAILED|^ERROR|rc=" "$L/pytest-mosaic.log" | tail -10; tail -c 400 "$L/pytest-mosaic.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
