#!/usr/bin/env bash
# For the next session's first call (kind nvidia-h200, carry [".fa3"]; NOT needs_h200: run's rules keep it for work
# that cannot fit an H100's memory, never for timings). Whichever card comes runs this; each timing has its baseline in
# the same run (the sweep's pair_ring=False and FA3 beside it; the grid's FA3 and bf16 Mosaic beside fp8).
# Rewritten at the end of session 42. Session 42 ran the previous version as 2026-12-06-s42-a.sh (parts 1, 4, 2, on an
# H100; the template's copies s38-a .. s41-a never ran): pair_ring 1.02x / 1.01x at the 16-row rows and its bitwise
# test with q_in_kernel passed, so the heuristic takes pair_ring at 16 rows (9280851) and wide_ring was removed; then
# s42-b on an H100: the new heuristic 1.04x / 1.01x against pair_ring=False, and the fp8 grid (fp8 1.88x of bf16
# Mosaic at H16 B128 S16384, 1.89x at B32 S16384); then this version's copy, s42-c, on a third H100 (1.04x / 1.04x;
# the grid 1.88x / 1.81x). Nothing of this has run on an H200.
# Copy to parity/sessions/<date>-s<n>-a.sh and commit before running; never edit it after.
# Run as calls, in this order where the budget is short: `bash <script> 1` (~4 min: 70 + 170 s), `bash <script> 2`
# (~5 min). Try for a machine two or three times a session, not more; respect a refusal's "later means in about N
# min" (each call inside that window costs 15 s of budget, each failed start ~90 s).
# 1) pair_ring on the H200 (where the probe is not capped by HBM): parity.tma_probe fp8_64 (the old ring), fp8_pair
#    (pair_ring's whole 128-byte lines), fp8_flat, bf16_128; then parity.sweep --fields pair_ring=False at the two
#    16-row rows, FA3 beside. Predictions on an H200: fp8_64 3.5-3.6 TB/s, fp8_pair 4.4-4.7 (session 35's fp8_128r
#    4.44, flat 4.70); the heuristic 1.05-1.25x over pair_ring=False at H16 B128 S16384 (session 35: 335 us without
#    pair_ring) and B32 S16384 (95.7). On an H100: the probes 3.0-3.4 (its HBM), 1.01-1.04x (s36-d, s42-a, s42-b).
#    If pair_ring is slower on the H200, the heuristic's pick is the H100's alone: say so in its comment, or gate it.
# 2) the fp8 grid side by side on today's heuristic (FA3 bf16, bf16 Mosaic, fp8 Mosaic), checked. Predictions on an
#    H200: fp8 H16 B128 S16384 270-320 us (session 30: 331.8, 1.65x of bf16 Mosaic's 548.1), 1.7-2.0x of bf16 Mosaic;
#    on an H100 as s42-b's (435.1 us, 1.88x).
set -uo pipefail
PARTS="${1:-12}"  # which parts to run (digits)
run_part() { [[ "$PARTS" == *"$1"* ]]; }
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
if run_part 1; then
timeout 70 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_pair_x4,fp8_pair_x2,fp8_flat_x4,bf16_128_x2 \
  --json "$OUT/tma-probe-pair.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -6
tar czf "$OUT/logs-1a.tgz" -C "$OUT" logs  # (kept if the sweep runs past the call's limit)
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields pair_ring=False --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384 --json "$OUT/sweep-fp8-pair-ring.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$L/sweep.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs-1b.tgz" -C "$OUT" logs
fi
if run_part 2; then
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench.log" 2>&1
echo "bench rc=$?"; grep -v Warn "$L/bench.log" | tail -30 | cut -c1-160
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
