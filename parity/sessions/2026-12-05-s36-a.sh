#!/usr/bin/env bash
# For the next session's first call (nvidia-h200 with needs_h200: an H100's HBM hides what part 1 asks; carry
# [".fa3"]), written at the end of session 35 (the template of sessions 30-34 ran as 2026-12-05-s35-a.sh; its parts
# 0, 4 and 6 answered). Copy to parity/sessions/<date>-s<n>-a.sh and commit before running; never edit it after.
# Run as calls, in this order where the budget is short: `bash <script> 1` (~7 min), `bash <script> 2` (~4 min),
# `bash <script> 3` (~6 min). Try for a machine two or three times a session, not more; respect a refusal's "later
# means in about N min" (each call inside that window costs 15 s of budget, each failed start ~90 s).
# 1) MosaicConfig.wide_ring (session 35, built on the CPU only: lowers, ptxas 234 registers and no spill at H16 B128
#    S16384 where the default has 239; 168 bytes of spill at 32 rows where the default spills 436): the fp8 slot's
#    latent in 128-byte TMA box rows. First parity.tma_probe's fp8_128r (the same boxes, loads alone) beside fp8_64
#    and fp8_flat, then the compiled bitwise test, then a sweep. Predictions: fp8_128r 4.0-4.5 TB/s (fp8_64 3.5-3.6,
#    flat 4.3-4.7; odd tokens' 128-byte rows start mid-line, so below flat); bitwise (if not: _vt_lane_offset's
#    128-byte swizzle or the pair split x[:, :64] / x[:, 64:]; an illegal address: the rounded-down descriptor);
#    wide_ring 1.08-1.15x faster at H16 B128 S16384 (335 -> 290-310 us) and B32 S16384 (95.7 -> 83-89), 0.98-1.05x
#    at H16 B64 S4096 q2 (32 rows, less bound by the intake).
# 2) (session 35, call e, never ran) the heuristic's q_in_kernel at 8 query tokens: the heuristic against
#    q_in_kernel=False at H16 B8 S4096 and H128 B8 S4096. Prediction 1.01-1.04x.
# 3) the fp8 grid side by side on today's heuristic (FA3 bf16, bf16 Mosaic, fp8 Mosaic), checked, and (if part 1
#    made wide_ring faster and bitwise) with wide_ring: the grid's rows where it runs, `--set`-style through
#    parity.sweep. Predictions: as session 30's table (fp8 H16 B128 S16384 ~335 us, 1.6-1.7x of bf16 Mosaic).
set -uo pipefail
PARTS="${1:-123}"  # which parts to run (digits)
run_part() { [[ "$PARTS" == *"$1"* ]]; }
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
if run_part 1; then
timeout 60 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_128r_x4,fp8_128r_x2,fp8_flat_x4 \
  --json "$OUT/tma-probe-128r.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -5
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fp8.py -k "wide_ring_is_bitwise" \
  > "$L/tests-wide.log" 2>&1
echo "tests wide_ring rc=$?"; grep -E "passed|failed|^E  .*(Error|Mismatch)" "$L/tests-wide.log" | tail -4 | cut -c1-200
tar czf "$OUT/logs-1a.tgz" -C "$OUT" logs  # (kept if the sweep runs past the call's limit)
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields wide_ring=True --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 --json "$OUT/sweep-fp8-wide-ring.json" \
  > "$L/sweep-wide.log" 2>&1
echo "sweep wide_ring rc=$?"; grep -v Warn "$L/sweep-wide.log" | grep -E " us " | cut -c1-110
fi
if run_part 2; then
timeout 190 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields q_in_kernel=False --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B8_S4096,H128_B8_S4096 --json "$OUT/sweep-fp8-q-in-kernel-b8.json" > "$L/sweep-q.log" 2>&1
echo "sweep q rc=$?"; grep -v Warn "$L/sweep-q.log" | grep -E " us " | cut -c1-110
fi
if run_part 3; then
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench.log" 2>&1
echo "bench rc=$?"; grep -v Warn "$L/bench.log" | tail -30 | cut -c1-160
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
