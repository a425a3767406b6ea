#!/usr/bin/env bash
# Session 16, call G (nvidia-h200; carry [".fa3"]). Written after call F: split_ring 1.03-1.11x slower than the default
# on three H = 128 rows (its 14 compiled tests passed: bitwise the default at pages 16 / 64 / 128). split_ring's change
# also touched deferred_pv's kernel (the barriers: bt_bar_wg0 and the new bt_staged before qk_done; bt_staged arrived
# and awaited at a new block-table chunk): its compiled tests again. Prediction: pass (its order was already safe).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "TestGPU and deferred" > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -6
rm -rf "$L"
