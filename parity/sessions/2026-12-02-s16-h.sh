#!/usr/bin/env bash
# Session 16, call H (nvidia-h200; carry [".fa3"]; the session's last ~250 s of device time). Written after call G.
# The kernel's H = 128 step is 2.05 us against the memoryless step_flashmla_1p's 1.83: is the ~0.2 us the loads'
# waits (latency: a scheduling fix could help) or their traffic (each step's 72 KiB TMA writes share the shared
# memory's bandwidth with the wgmmas' operand reads: no schedule helps)? New probe step_flashmla_1p_tma: the same step
# with warpgroup 1 loading 64 KiB a step (from L2) into a spare slot nothing reads, after its P @ V as the kernel's
# refill, with no wait on the compute side. Prediction: 1.90-1.95 us (traffic ~half of the gap).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 100 python3 -m parity.wgmma_probe --probes step_flashmla_1p,step_flashmla_1p_tma,step_flashmla \
  --json "$OUT/wgmma-probe-steps-tma.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | tail -6
rm -rf "$L"
