#!/usr/bin/env bash
# For the next session's first call (kind nvidia-h200, carry [".fa3"]; NOT needs_h200: run's rules keep it for work
# that cannot fit an H100's memory, never for timings; sessions up to 41 passed it, wrongly. Whichever card
# comes runs this; each timing has its baseline in the same run (the sweep's heuristic and FA3 beside it; the probe's
# rows against each other). On an H100 the probe caps at its HBM (~3.0-3.2 TB/s), but the sweep still answers
# pair_ring on that card (s36-d's H100: 1.04x / 1.02x at the 16-row rows; s41-d, never run, would have asked
# again on today's kernels). Rewritten at the end of session 36 (session 35's ran as 2026-12-05-s36-a.sh part 1, on
# an H100); part 1's bitwise test added in session 37, which had no device; sessions 38-41 copied it
# (2026-12-05-s38-a.sh, 2026-12-06-s39-a.sh, 2026-12-06-s40-a.sh, 2026-12-06-s41-a.sh), and no H200 came to any.
# Session 40 ran pair_ring's bitwise test on an H100 (s40-c: passed, its page-64 scenario included), so part 1 no
# longer runs it.
# Copy to parity/sessions/<date>-s<n>-a.sh and commit before running; never edit it after.
# Run as calls, in this order where the budget is short: `bash <script> 1` (~6 min: its timeouts, 70 + 300 s), `bash
# <script> 4` (~3 min), `bash <script> 2` (~4 min), `bash <script> 3` (~6 min). Try for a machine two or three times a
# session, not more; respect a refusal's "later means in about N min" (each call inside that window costs 15 s of
# budget, each failed start ~90 s).
# 1) (sessions 35-36) the fp8 ring's box rows on the H200, which session 36 never got (ten calls got none; every number
#    it has is an H100's, where HBM caps the probes at ~3.0-3.2 TB/s). parity.tma_probe: fp8_64 (the default
#    ring), fp8_128r (wide_ring), fp8_pair (pair_ring: the cache two tokens a row, [rows / 2, 1152], every box row a
#    whole line), flat, bf16_128. Then parity.sweep --fields wide_ring=True,pair_ring=True on 3 rows, FA3 beside.
#    Both options are bitwise the default (compiled, on an H100: s36-a, s36-d, s40-c). Predictions: fp8_64 3.5-3.6 TB/s,
#    fp8_128r 3.6-4.3, fp8_pair 4.4-4.7 (as bf16_128); pair_ring 1.10-1.25x at H16 B128 S16384 (335 -> 270-305 us)
#    and B32 S16384 (95.7 -> 77-87), 0.93-1.0x at H16 B64 S4096 q2 (H100: 0.93x; 572 bytes of spill against 436);
#    at 16 rows its SASS (session 37, parity.mosaic_sass on the CPU) has the default's step: 650 instructions a warp,
#    one more in each dequant loop's iteration, 243 registers against 239, no spill: any change there is the TMA's.
#    wide_ring 1.00-1.10x. H100 (s36): pair_ring 1.04x / 1.02x, wide_ring 1.02x / 1.01x at the two 16-row rows.
#    If pair_ring is faster at 16 rows and part 4 passes: the heuristic's there (rows == 16 with pv_registers;
#    kernel_hash: the H16 B128 and B32-type modules change), wide_ring removed (its shim round_down_tiling kept in
#    parity.tma_probe for fp8_128r, or that probe dropped).
# 2) (session 35, call e, never ran) the heuristic's q_in_kernel at 8 query tokens: the heuristic against
#    q_in_kernel=False at H16 B8 S4096 and H128 B8 S4096. Prediction 1.01-1.04x.
# 3) the fp8 grid side by side on today's heuristic (FA3 bf16, bf16 Mosaic, fp8 Mosaic), checked. Predictions: as
#    session 30's table (fp8 H16 B128 S16384 ~335 us, 1.6-1.7x of bf16 Mosaic).
# 4) (session 41) pair_ring's compiled bitwise test, which now also pairs it with q_in_kernel (the heuristic's pick
#    beside pv_registers at up to 32 tokens; never run on a GPU): needed before pair_ring can be the default.
#    `bash <script> 4` (~3 min; s40-c ran it, without the new case, beside wide_ring's in 188.5 s). Prediction: passes.
set -uo pipefail
PARTS="${1:-1234}"  # which parts to run (digits)
run_part() { [[ "$PARTS" == *"$1"* ]]; }
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
if run_part 1; then
timeout 70 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_128r_x4,fp8_pair_x4,fp8_pair_x2,fp8_flat_x4,bf16_128_x2 \
  --json "$OUT/tma-probe-pair.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -7
tar czf "$OUT/logs-1a.tgz" -C "$OUT" logs  # (kept if the sweep runs past the call's limit)
timeout 300 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields wide_ring=True,pair_ring=True --rounds 3 \
  --reps 3 --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 --json "$OUT/sweep-fp8-rings.json" \
  > "$L/sweep-rings.log" 2>&1
echo "sweep rings rc=$?"; grep -v Warn "$L/sweep-rings.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs-1b.tgz" -C "$OUT" logs
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
if run_part 4; then
timeout 280 python3 -m pytest -m gpu -v -p no:cacheprovider -rfEs tests/test_fp8.py -k pair_ring_is_bitwise \
  > "$L/pytest-pair-ring.log" 2>&1; echo "pair_ring bitwise rc=$?"; grep -E "PASSED|FAILED|ERROR|passed|failed" \
  "$L/pytest-pair-ring.log" | tail -5
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
