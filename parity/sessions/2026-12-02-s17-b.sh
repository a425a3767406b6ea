#!/usr/bin/env bash
# Session 17 call B (nvidia-h200; no FA3). Call A: step_flashmla_1p 1.77 us, _tma 3.27, _hbm 3.85: one load in flight,
# awaited one step after its issue, puts a load's latency under the whole chip's loads on the step (the probes did not
# separate traffic from waits). The two-in-flight forms (as the kernel's two-stage ring): _l2x2 (a 10 MiB window,
# distinct lines per CTA pair) and _hbmx2 (the 1 GiB buffer). Predictions: _l2x2 1.80-1.90 us (the shared memory's
# write traffic only), _hbmx2 1.85-2.05 (2.05 = the kernel's step: the ring's memory costs by traffic, no schedule
# recovers it; near 1.8: the kernel's waits, not the traffic, are its 0.22 us).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 -m parity.wgmma_probe \
  --probes step_flashmla_1p,step_flashmla_1p_l2x2,step_flashmla_1p_hbmx2,step_flashmla_1p_hbm \
  --json "$OUT/wgmma-probe-steps-x2.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | tail -6
rm -rf "$L"
