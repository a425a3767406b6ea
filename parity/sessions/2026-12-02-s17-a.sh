#!/usr/bin/env bash
# Session 17 call A (nvidia-h200): copied from next-session-first-call.sh (written at the end of session 16), plus
# the softmax probes re-timed with exp2.approx (session 16 timed them with an accurate exp2: an upper bound).
# Session 16: the kernel's H = 128 step is 2.05 us (H128 B64 S4096 q1) against the memoryless step_flashmla_1p's 1.83
# (parity.wgmma_probe): is the ~0.22 us the loads' waits (latency: a schedule could help) or their traffic (each step's
# 72 KiB of TMA writes share the shared memory's bandwidth with the wgmmas' operand reads: no schedule helps)?
# step_flashmla_1p_tma (built in session 16, CPU-checked): the same step with warpgroup 1 loading 64 KiB a step (from
# L2) into a spare slot nothing reads, after its P @ V as the kernel's refill, with no wait on the compute side.
# step_flashmla_1p_hbm (also session 16): the same loads from a 1 GiB buffer the CTAs walk through in pairs (each pair
# the same step at about the same time: one read from HBM, one mostly from L2, as heads_fastest's head tiles).
# Predictions: _tma 1.90-1.95 us (the traffic about half of the gap), _hbm 1.95-2.05 (HBM's share: 72 KiB a step per
# CTA pair is ~2.3 TB/s at 2 us a step). 600 TFLOP/s on these rows allows 1.90 us a step. If _hbm is ~2.05 (the
# kernel's step), the memory costs by traffic alone and no schedule recovers it; if ~1.85, the waits are the cost.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 240 python3 -m parity.wgmma_probe --probes qk,qk_sm,qk+pv+pv,qk_sm+pv+pv,step_flashmla_1p,step_flashmla_1p_tma,step_flashmla_1p_hbm \
  --json "$OUT/wgmma-probe-steps-tma.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | tail -6
rm -rf "$L"
