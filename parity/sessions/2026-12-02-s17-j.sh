#!/usr/bin/env bash
# Session 17, call J (nvidia-h200; no FA3). Call I: the kernel at H = 128 takes 255 registers with 68 bytes of spill
# stores at q_len 1 and 2 and page 16 (H = 16: 183, none). Its SASS (call H's PTX through Triton's ptxas 12.8 here,
# the same counts): WG0's unmasked loop has no spills, but 553 instructions a step against the ring probe's 474, 63
# more R2UR: the 36 descriptors of Q (loop-invariant) are hoisted into ordinary registers and moved into uniform ones
# before each wgmma. New: q_op() reads q's index from info word 4 at each use, as kv_tile does for K (the same trick
# session 6 used against the K descriptors' hoisting), Q_DESCRIPTORS_PER_USE=True.
# 1) ptxas of both forms; 2) both timed in turns on three H = 128 rows, outputs compared bitwise; 3) the compiled
# parity scenarios on the new form (as many as 110 s allow).
# Predictions: registers well under 255 and no spills with per-use; 1.00-1.08x faster; bitwise the same.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 200 python3 parity/sessions/2026-12-02-s17-j.py \
  "$OUT/q-per-use.json" > "$L/ab.log" 2>&1; echo "rc=$?" >> "$L/ab.log"
for f in $(ls "$OUT"/dump/*.ptxas | sort -V); do echo "$(basename $f): $(grep -h 'Used' $f) $(grep -h 'spill stores' $f | head -1)"; done > "$L/ptxas.log"
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "TestGPU and test_scenario and not other" > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
rm -rf "$OUT/dump"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cut -c1-160 "$L/ptxas.log"
grep -v Warn "$L/ab.log" | tail -4
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -5
rm -rf "$L"
