#!/usr/bin/env bash
# Session 18 call B (nvidia-h200; carry [".fa3"]). Call A's probe and l2_prefetch sweep aborted: a prefetch of a
# KV row's 576 columns is a TMA box wider than 256 ("Window shape must be in [0, 256]"); now one box of <= 256 a
# dimension at a time (prefetch_to_l2). Call A's page order: the kernel on in-order pages 141.7 vs 148.1 us (S4096),
# 560.3 vs 564.8 (S16384); FA3 unchanged. So random pages cost the kernel 1-4%, not the ~0.4 us a step it misses.
# 1) the ring probe in order / scattered / scattered + L2 prefetch 1 and 2 steps ahead;
# 2) the compiled l2_prefetch tests (bitwise the default);
# 3) l2_prefetch=1,2,3 on two H = 128 rows and one H = 16 row.
# Predictions: scattered 0-0.1 us a step over in order, pf1/pf2 take back at most that; l2_prefetch 0.98-1.03x.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m parity.wgmma_probe --probes step_flashmla_1p,step_flashmla_1p_ring,\
step_flashmla_1p_ring_scattered,step_flashmla_1p_ring_scattered_pf1,step_flashmla_1p_ring_scattered_pf2 \
  --json "$OUT/wgmma-probe-scattered.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
timeout 150 python3 -m pytest -q -m gpu tests/test_pallas_mosaic_gpu.py -k "l2_prefetch" -p no:cacheprovider \
  > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields l2_prefetch --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B64_S16384_q1,H16_B128_S16384_q1 \
  --json "$OUT/sweep-l2-prefetch.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | tail -8
tail -3 "$L/tests.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -14
rm -rf "$L"
