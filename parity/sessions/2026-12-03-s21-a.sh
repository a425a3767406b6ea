#!/usr/bin/env bash
# Session 21, call A (nvidia-h200; carry [".fa3"]): next-session-first-call.sh as written at the end of session 20,
# plus the compiled kv_halves tests of tests/test_fp8.py (commit f73ad8d, not yet run on the GPU). About 7-9 minutes.
# Session 20 made MosaicConfig(kv_halves=True) the fp8 heuristic's pick at 16 rows (a split of two steps or more): a
# step ~2.0 us a warpgroup pair at H16 B128 S16384 (514-517 us), i.e. ~4 us a warpgroup's own step, against the 1.14
# us its bytes take at the copy ceiling. Where those 4 us go is not measured.
# 1) the region profile of kv_halves there (kv_wait: the TMA of a warpgroup's next step, one slot a warpgroup;
#    dequant: its 9 chunks; qk, pv), the profiler's buffer in the ~1.9 KiB left (--space 56: 32 bytes a range for
#    the two warpgroups); and of kv_halves=False for comparison (its regions as in session 11's);
# 2) the Mosaic kernel's compiled tests not yet run on today's code (143-217 of tests/test_pallas_mosaic_gpu.py).
# Predictions: kv_halves's dequant ~1.2-1.6 us a step (both warpgroups converting at once), kv_wait 0.5-1.5 us (the
# one slot's TMA lead is scores + softmax + P @ V), qk + softmax + pv ~1.2 us; every test passes or skips with its
# reason.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 90 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 56 \
  --json "$OUT/regions-fp8-kv-halves.json" > "$L/regions-halves.log" 2>&1; echo "rc=$?" >> "$L/regions-halves.log"
timeout 90 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 56 --set kv_halves=False \
  --json "$OUT/regions-fp8-one-chain.json" > "$L/regions-one.log" 2>&1; echo "rc=$?" >> "$L/regions-one.log"
grep -v Warn "$L/regions-halves.log" | tail -14; grep -v Warn "$L/regions-one.log" | tail -14
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k kv_halves \
  > "$L/pytest-fp8-halves.log" 2>&1; echo "rc=$?" >> "$L/pytest-fp8-halves.log"
grep -E "passed|failed|skipped|^FAILED|^ERROR|rc=" "$L/pytest-fp8-halves.log" | tail -6
python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/test_pallas_mosaic_gpu.py 2>/dev/null \
  | grep "::" | sed -n "143,\$p" > "$L/ids.txt"
echo "$(wc -l < "$L/ids.txt") tests, $(head -1 "$L/ids.txt") .. $(tail -1 "$L/ids.txt")"
timeout 270 xargs -d '\n' -a "$L/ids.txt" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
  > "$L/pytest-mosaic.log" 2>&1; echo "rc=$?" >> "$L/pytest-mosaic.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|skipped|^FAILED|^ERROR|rc=" "$L/pytest-mosaic.log" | tail -10
rm -rf "$L"
