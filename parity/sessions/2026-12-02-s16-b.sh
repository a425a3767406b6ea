#!/usr/bin/env bash
# Session 16, call B (nvidia-h200; carry [".fa3"]). Written after call A: deferred_pv v3 (warpgroup 0 refilling part
# 0) 1.02-1.11x slower on three H = 128 rows; its profile: warpgroup 0's KV wait back to 0.11 us, but its step is
# qk 1.58 + softmax/hand-off ~1.4 + pv 0.58: the softmax stays on warpgroup 0's chain (its own P @ V waits for it),
# so deferring warpgroup 1's P @ V cannot shorten that chain. The schedule that takes P @ V off warpgroup 0's chain
# is "three_wg" (session 4: 1.30x slower, on v4-era defaults, never profiled). This call asks whether it can pay now.
# 1) python -m parity.wgmma_probe on the three-warpgroup step: pv+pv (both P @ V halves at once), qk+pv+pv (three_wg's
#    step), qk_rs+pv+pv (the same with Q from registers), beside qk and qk+pv. Prediction: pv+pv ~0.78 us (two halves
#    share the tensor cores: 2 x 0.39), qk+pv+pv 1.45-1.65 (the tensor work; shared memory may add), qk_rs+pv+pv
#    1.35-1.55.
# 2) parity.sweep --fields schedule=three_wg on two H = 128 rows (3 rounds, 2 s idle). Prediction: still slower,
#    1.05-1.25x (its chain: scores + softmax + hand-off ~2.3 us profiled-equivalent, against flashmla's 2.2).
# 3) the region profile of three_wg (H128 B64 S4096 q1), and ptxas's registers for it.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m parity.wgmma_probe --probes qk,qk+pv,pv+pv,qk+pv+pv,qk_rs+pv+pv \
  --json "$OUT/wgmma-probe-three-wg.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields schedule=three_wg --rounds 3 --reps 3 \
  --cooldown 2 --shapes H128_B64_S4096_q1,H128_B64_S16384_q1 --json "$OUT/sweep-three-wg.json" \
  > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
MOSAIC_GPU_DUMP_PTXAS=1 timeout 80 python3 -m parity.regions --shapes H128_B64_S4096_q1 --space 240 \
  --set schedule=three_wg --json "$OUT/regions-h128-three-wg.json" > "$L/regions.log" 2>&1
echo "rc=$?" >> "$L/regions.log"
grep -iE "registers|spill|bytes stack" "$L/regions.log" | sort | uniq -c | head -8 > "$L/ptxas.txt"
grep -v "^ptxas\|registers\|spill\|bytes stack\|Compiling\|Function prop" "$L/regions.log" > "$L/regions-clean.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$L/ptxas.txt"
grep -v "Warn" "$L/regions-clean.log" | tail -14
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -6
grep -v Warn "$L/probe.log" | tail -7
rm -rf "$L"
