#!/usr/bin/env bash
# For the next session's first call (nvidia-h200; carry [".fa3"]). Written at the end of session 17. Copy this file
# and next-session-first-call.py to parity/sessions/<date>-s18-a.{sh,py} (the .sh calling the copy) before running;
# never edit them after.
# Session 17: the memoryless step over the kernel's two-stage ring (parity.wgmma_probe step_flashmla_1p_ring) runs
# ~1.8 us a step where the kernel runs ~2.2 (H128 B64 S4096 q1); the ring probe walks its KV in order, the bench's
# block tables are random permutations of the pages. Ring loads get about one step of lead: an HBM page's latency
# (a TLB miss included, in a 0.3-1.2 GB cache read at random) may be what the kernel waits for.
# 1) the ring probe in order, scattered (a permutation of the steps, as random pages), and scattered with L2
#    prefetches of the step one or two after each refill (plgpu.async_prefetch);
# 2) the kernel and FA3 on the bench's random pages and on the same requests' pages in order (interleaved);
# 3) MosaicConfig(l2_prefetch=1, 2, 3) (new, CPU-checked: interpret cases, bitwise the default, lowering) on three
#    H = 128 rows and one memory-bound H = 16 row, and its compiled bitwise tests.
# Predictions: scattered 2.0-2.2 us, pf1 / pf2 back to ~1.85; the kernel in order 1.85-1.95 us a step (580-610
# TFLOP/s at S = 16384), FA3 gaining less; l2_prefetch 1.03-1.15x faster at H = 128, neutral at H = 16.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m parity.wgmma_probe --probes step_flashmla_1p,step_flashmla_1p_ring,\
step_flashmla_1p_ring_scattered,step_flashmla_1p_ring_scattered_pf1,step_flashmla_1p_ring_scattered_pf2 \
  --json "$OUT/wgmma-probe-scattered.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
timeout 200 python3 parity/sessions/2026-12-03-s18-a.py "$OUT/page-order.json" > "$L/pages.log" 2>&1
echo "rc=$?" >> "$L/pages.log"
timeout 280 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields l2_prefetch --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B64_S16384_q1,H128_B128_S4096_q2,H16_B128_S16384_q1 \
  --json "$OUT/sweep-l2-prefetch.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | tail -7
grep -v Warn "$L/pages.log" | tail -9
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -18
rm -rf "$L"
