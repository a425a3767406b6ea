#!/usr/bin/env bash
# Session 7, call D (nvidia-h200): P in the KV slot's rope columns (MosaicConfig(p_in_kv=True), CPU-checked:
# interpret cases, race detector, CUDA lowering). 1. its compiled tests; 2. A/B against the default in three
# interleaved rounds on H = 128 shapes (the compute-bound step); 3. the first H = 128 region profile (the
# 7 KiB it frees hold the profiler's buffer), 2026-12-01-s7-d.py.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py -k "p_in_kv" \
  > "$L/pytest_p_in_kv.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_p_in_kv.log"
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields p_in_kv --rounds 3 --reps 3 \
  --shapes H128_B64_S16384_q1,H128_B32_S4096_q2,H128_B128_S4096_q1,H128_B8_S16384_q1,H128_B1_S1024_q1 \
  --json "$OUT/sweep-p-in-kv.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
timeout 90 python3 parity/sessions/2026-12-01-s7-d.py > "$L/profile.log" 2>&1; echo "profile rc=$?" >> "$L/profile.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_p_in_kv.log" | tail -5
cut -c1-160 "$L/sweep.log" | tail -22
grep -v "Warning\|warn" "$L/profile.log" | cut -c1-200 | tail -16
rm -rf "$L" "$OUT/prof"
