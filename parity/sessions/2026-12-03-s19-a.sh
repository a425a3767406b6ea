#!/usr/bin/env bash
# For the next session's first call (nvidia-h200; carry [".fa3"]), written at the end of session 18. Copy to
# parity/sessions/<date>-s19-a.sh and commit before running; never edit it after. About 5 minutes, leaving the
# rest of the session's device time for issue #5's whole grid (next-session-grid.sh, two calls).
# Session 18 found that the step probes ran without the softmax's row sums (the compiler dropped sums nothing read;
# now part of their output) and built MosaicConfig(late_row_sums=True): warpgroup 0's row sums under its P @ V
# instead of before P's hand-over (bitwise its base in interpret mode; the lowered module shows the move).
# 1) its compiled bitwise tests; 2) the probes with their row sums; 3) the sweep on two H = 128 rows and one H = 16.
# Predictions: bitwise; the memoryless step 1.85-1.95 us (1.72-1.86 without the sums), the ring probe likewise, their
# _late forms 0.05-0.1 us a step faster;
# late_row_sums 1.02-1.05x faster at H = 128, neutral at H = 16. If it gains on both H = 128 rows, make it the
# heuristic's default (CPU tests) before the grid, so that the grid times it.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py tests/test_fp8.py \
  -k late_row_sums > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
timeout 80 python3 -m parity.wgmma_probe --probes step_flashmla_1p,step_flashmla_1p_late,step_flashmla_1p_ring,step_flashmla_1p_ring_late \
  --json "$OUT/wgmma-probe-row-sums.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields late_row_sums=True --rounds 3 --reps 3 \
  --cooldown 2 --shapes H128_B64_S4096_q1,H128_B64_S16384_q1,H16_B128_S16384_q1 \
  --json "$OUT/sweep-late-row-sums.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -4
grep -v Warn "$L/probe.log" | tail -4
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -8
rm -rf "$L"
