#!/usr/bin/env bash
# Session 17, call D (nvidia-h200; carry [".fa3"]). Call C: part_wait=True passed its 14 compiled tests and is neutral
# (1.00x, 0.98x, 1.01x on three H = 128 rows; H128 B64 S4096 q1 144.0 us, 2.25 us a step on that machine). If the
# ring's one step of lead were the cost, part 1's extra ~0.33 us should have shown. New probe
# step_flashmla_1p_ring: the memoryless step over the kernel's two-stage ring (two K slots, loads from HBM in CTA
# pairs, awaited by the scores, the slot released after both P @ V halves and refilled whole by warpgroup 1): the
# kernel's loads and waits without its block table, masks, prologue and epilogue. Beside it, in the same call, the
# kernel's step (H128 B64 S4096 q1, 64 steps a CTA, one wave) to compare on one machine's clocks.
# Predictions: _ring 1.95-2.10 us (the ring's waits are the kernel's gap); if ~1.80, the gap is elsewhere (the block
# table and TMA issue, masks, the tile's prologue and epilogue).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m parity.wgmma_probe \
  --probes step_flashmla_1p,step_flashmla_1p_ring,step_flashmla_1p_hbmx2 \
  --json "$OUT/wgmma-probe-steps-ring.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields part_wait=True --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1 --json "$OUT/sweep-part-wait-2.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | tail -5
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -5
rm -rf "$L"
