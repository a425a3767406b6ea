#!/usr/bin/env bash
# For the next session's third call (nvidia-h200; carry [".fa3"]), written in session 28 (no device), extended in
# session 29 (no device either): run it only if the first call's qk_fp8 tests passed. Copy to
# parity/sessions/<date>-s<n>-c.sh, commit, never edit after. ~8 min. (Session 28's second call, H128 B64 S16384 moved to the second call in session 29.)
# 1) parity.sweep --fields qk_fp8=True against the heuristic at the other fp8 rows where kv_halves runs: H16 B32 S16384
#    (16 rows, 64 steps a split), H16 B8 S4096 (16 rows, 4 steps a split: V's f16 copies, no pv_registers; the slot is
#    refilled after the scores' wgmma, later than the default), H32 B64 S4095 q1 (32 rows, a masked step); and at the
#    fp8 grid's other compute-bound row, H128 B32 S4096, where qk_fp8 runs on the plain scores' fused conversion;
# 2) H16 B1 S1024 (16 splits of one step; the heuristic's one-chain path) with kv_halves and qk_fp8 forced, against
#    kv_halves alone (the sweep's base row there; the heuristic took 12.5 us in session 27).
# Predictions: qk_fp8 1.1-1.3x faster at B32 S16384, 0.95-1.1x at B8 S4096 (the later refill), 1.05-1.2x at H32 B64,
# 1.1-1.25x at H128 B32 S4096 (session 24: 113.1 us); at B1 kv_halves + qk_fp8 within 5% of the heuristic (12.5 us in
# session 27: a step's latency, not its throughput).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 330 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields qk_fp8=True --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B32_S16384,H16_B8_S4096,H32_B64_S4095_q1,H128_B32_S4096 \
  --json "$OUT/sweep-fp8-qk_fp8-more.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"; grep -v Warn "$L/sweep.log" | grep -E " us |rc=" | cut -c1-110
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --set kv_halves=True,qk_registers=True,sums_at_end=True \
  --fields qk_fp8=True --rounds 3 --reps 3 --cooldown 1 --shapes H16_B1_S1024 \
  --json "$OUT/sweep-fp8-qk_fp8-b1-halves.json" > "$L/sweep-b1.log" 2>&1
echo "rc=$?" >> "$L/sweep-b1.log"; grep -v Warn "$L/sweep-b1.log" | grep -E " us |rc=" | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
