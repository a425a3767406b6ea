#!/usr/bin/env bash
# Session 24, call F (nvidia-h200; carry [".fa3"]). About 2 minutes.
# The heuristic now takes fused_group=4 with any fp8 cache (calls B-E). This call: the compiled fp8 tests that run
# the heuristic's pick (tuning=None: spec_decode at page 16, H = 8 at q_len 2, mixed lengths, H = 128 spec decode).
# Prediction: all pass.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k \
  "compiled[spec_decode_page_16-bfloat16] or compiled[heads_8_q2-bfloat16] or compiled[decode_mixed_lengths-bfloat16] or compiled[heads_128_spec-bfloat16]" \
  > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -6
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
