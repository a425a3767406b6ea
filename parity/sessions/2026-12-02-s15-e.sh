#!/usr/bin/env bash
# Session 15, call E. Never edit after running. Call with carry [".fa3"].
# Calls C and D: the scores' wgmma (64 x 64 x 576, both operands in shared memory) took 1.36 us profiled alone
# against 1.44 beside warpgroup 1's P @ V: ~60% of the tensor peak by itself. python -m parity.wgmma_probe (new)
# times the step's matmuls alone and side by side, one CTA per SM, operands in the kernel's layouts.
# Predictions (us an iteration, 1.98 GHz; the peak is 1024 bf16 FMA a cycle an SM):
#   qk ~0.9 (peak 0.58); qk_n128 per 64 keys ~0.65 (a wider N amortizes each instruction's A read);
#   qk_rs ~0.65-0.75 (only K from shared memory); pv ~0.35 (peak 0.26); qk+pv ~1.0 (the P @ V nearly free, calls C-D);
#   qk+qk ~1.5-1.8 (the tensor pipe shared, a bit better than 2 x 0.9).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m parity.wgmma_probe --json "$OUT/wgmma-probe.json" > "$L/probe.log" 2>&1
echo "rc=$?" >> "$L/probe.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v "Warn\|^  " "$L/probe.log" | tail -12
rm -rf "$L"
