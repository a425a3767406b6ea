#!/usr/bin/env bash
# Session 17, call E (nvidia-h200; no FA3). Call D: step_flashmla_1p 1.732 us, _ring 2.046 (the kernel's two-stage
# ring reproduces the kernel's gap: +0.31 us), _hbmx2 1.857 (call B: 1.769). The ring moves 72 KiB a CTA a step: 35.2
# KiB/us an SM; _hbmx2 64 KiB at 1.857: 34.5 KiB/us. Nearly equal: is the SMs' intake of TMA bytes the bound (~4.8
# TB/s over 132 SMs), not the loads' latency? 600 TFLOP/s at H = 128 needs 72 KiB per 1.90 us = 5.1 TB/s of it.
# New stream probes: loads alone, 64 KiB an iteration, two or three in flight per CTA.
# Predictions: stream_hbm_x3 3.9-4.2 TB/s (each CTA its own steps: HBM's copy ceiling 4.26); stream_pairs_x2/x3
# 4.6-5.5 (half from L2); stream_l2_x3 5-7 (L2 alone). If pairs ~4.8: the ring is at the intake's ceiling.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 -m parity.wgmma_probe \
  --probes stream_hbm_x3,stream_pairs_x2,stream_pairs_x3,stream_l2_x3,step_flashmla_1p,step_flashmla_1p_ring \
  --json "$OUT/wgmma-probe-streams.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv >> "$L/probe.log" 2>&1
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | tail -10
rm -rf "$L"
