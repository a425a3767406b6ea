#!/usr/bin/env bash
# Session 35's copy of next-session-first-call.sh, with part 6 added: the Triton kernel's compiled tests (its clamps
# of traced metadata, session 34, never run on a GPU) and FA3's (the Impl's new checks), then a Triton sweep of the
# heuristic beside FA3 at two rows to compare with earlier sessions. Predictions: all pass (nothing refused: the
# clamps are jnp.minimum/where on values already in range); Triton's times within 3% of session 24's table.
# For the next session's first call (nvidia-h200; carry [".fa3"]), written at the end of session 30, revised in session
# 34 (parts 6 and 7 ran in session 33: interleave_steps 0.63-0.87x, removed; lazy_max's compiled tests passed, its
# timing mixed, so part 4 times it again). Copy to parity/sessions/<date>-s<n>-a.sh and commit before running; never
# edit it after. About 26 minutes in all, more than a command's 10 and a session's 30: run it as calls, in this
# order where the budget is short: `bash <script> 04` (~6-8 min), `bash <script> 12` (~8 min), and `bash <script> 35`
# (~6 min) if time is left. Device time: in session 34 six calls that got no machine cost ~90 s of budget each
# (783 -> 246 s, nothing ran); try two or three times a session, not more.
# (Session 28-29's template for qk_fp8 ran as 2026-12-05-s29-a.sh: qk_fp8 fails the lse tolerance; its second and
# third calls were dropped.)
# Session 30 made load_ahead the heuristic's with pv_registers (1.10-1.13x at the memory-bound fp8 rows, bitwise).
# 1) the whole fp8 grid on today's heuristic, FA3 (bf16), bf16 Mosaic and fp8 Mosaic side by side, checked;
# 2) a full ncu report of today's 16-row fp8 kernel at H16 B128 S16384 (what is left after load_ahead), summarized by
#    `python -m parity.ncu_stalls` (here, on the returned page);
# 3) load_ahead without pv_registers (session 30, end: the scores' chunks loaded ahead beside V's f16 copies, where a
#    split has fewer than 32 steps), its compiled bitwise test and a sweep at H16 B8 S4096 and H16 B128 S1024.
# Predictions: fp8 H16 B128 S16384 335-350 us (bf16 ~560: 1.6-1.7x), B32 S16384 95-100 (bf16 ~153), H16 B64 S4096 q2
# 76-80 (bf16 ~89), H128 rows and B1 as session 27 (0.71-0.81x of bf16: load_ahead does not run there); fp8 / bf16
# over the grid 1.00-1.03 (session 27: 0.959). ncu: issue slots 45-50%, the short-scoreboard share of the stall
# samples below 15% (call A of session 30: 24.6%). load_ahead without pv_registers: bitwise; 1.03-1.08x faster at
# both rows (the K loop's half of call C's gain, short splits).
# 4) (session 31, no device: built and checked on the CPU only) MosaicConfig(q_in_kernel=True), q's f16 conversion
#    inside the kernel instead of an XLA fusion before it: its compiled bitwise test, then a sweep on five rows.
#    Predictions: bitwise everywhere (if not: the swizzle or the word order of _convert_q_in_place, or the fence);
#    H16 B1 S1024 12.5 -> 11.0-11.5 us, H128 B1 S1024 14.8 -> 13.5-14.0, H16 B64 S4096 q2 76.9 -> 74-76, H16 B128
#    S16384 and B32 S16384 within 1% (one kernel less a call; the conversion ~0.3-1 us a CTA, under the first
#    KV TMA). Part 4 may change a default: run it first where the budget is short. Its sweep comes first and its
#    log is packed before the test, so that a call cut off at its limit keeps the timing.
# 5) (session 31) B = 1 on today's kv_halves path: fp8 is 0.8x of bf16 at H16 B1 S1024 (16 splits of one step, the
#    one-chain path: a whole step converted to f16 in shared memory before its scores). kv_halves at one step a split
#    (warpgroup 1 idle) was 1.03x slower in session 20, before qk_registers, qk_permuted, pv_registers and load_ahead
#    (the scores' and P @ V's operands from registers, no f16 copy on the step's critical path). Two sweeps on its
#    path (`--set`), FA3 in each as the common reference, beside the heuristic's q_in_kernel sweep (part 4).
#    Prediction: the kv_halves path with pv_registers and load_ahead 11.0-12.5 us at B1 (heuristic 12.5), equal or
#    slower at B4.
# 6), 7) ran in session 33 (2026-12-05-s33-b.sh): interleave_steps 0.87x / 0.82x / 0.63x, removed in session 34;
#    lazy_max's 8 compiled tests passed, 1.04x / 0.98x / 1.03x at H16 B128 S16384 / B32 S16384 / H16 B64 S4096 q2 (one
#    sweep of 3 rounds: within the noise), so part 4 times it again on five rows. Prediction: 1.00-1.04x at the
#    16-row rows, 0.98-1.03x at q2, no change at B1 and H = 128 (its kv_halves path does not run there).
# 0) (session 31) `python -m parity.tma_probe`: the SMs' intake of fp8 KV steps by TMA with the fp8 ring's 64-byte
#    box rows against 128-byte ones (and bf16's), loads alone: does the L2 (88% busy in session 30's ncu report, its
#    tag requests 60%) cap the fp8 kernel before HBM? Predictions: bf16_128_x2 4.4-4.5 TB/s (session 17's
#    stream_hbm_x3: 4.51); if the 64-byte rows cap it, fp8_64 and fp8_64p 3.6-4.0 and fp8_128p and fp8_flat (the
#    cache's rows seen as 128-byte rows: the layout a kernel could load without Mosaic GPU's rounding) 4.3-4.5; if
#    not, all within 3% of each other (then a wider-box ring is not worth building: the step's latency is left).
set -uo pipefail
PARTS="${1:-012345}"  # which parts to run (digits)
run_part() { [[ "$PARTS" == *"$1"* ]]; }
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
if run_part 0; then
timeout 90 python3 -m parity.tma_probe --json "$OUT/tma-probe.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -8
fi
if run_part 1; then
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench.log" 2>&1
echo "bench rc=$?"; grep -v Warn "$L/bench.log" | tail -30 | cut -c1-160
fi
if run_part 2; then
timeout 100 ncu --clock-control none --profile-from-start off --set full --import-source no --kernel-name regex:mosaic \
  -o "$L/full" python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape H16_B128_S16384_q1 > "$L/ncu.log" 2>&1
echo "ncu rc=$?"
ncu -i "$L/full.ncu-rep" --page details > "$L/details.txt" 2>&1
ncu -i "$L/full.ncu-rep" --page source --csv --print-source sass > "$L/sass.csv" 2>&1
rm -f "$L/full.ncu-rep"; gzip -9 "$L/sass.csv"
grep -E "Duration|Registers Per|Issue Slots Busy|DRAM Throughput|L2 Cache Throughput" "$L/details.txt" | head -6
fi
if run_part 3; then
timeout 120 python3 -m pytest -q -x -m gpu tests/test_fp8.py -k "load_ahead_is_bitwise" > "$L/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$L/tests.log"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields load_ahead --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B8_S4096,H16_B128_S1024 --json "$OUT/sweep-fp8-load-ahead-short.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$L/sweep.log" | grep -E " us " | cut -c1-110
fi
if run_part 4; then
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields q_in_kernel=True,lazy_max=True --rounds 3 \
  --reps 3 --cooldown 1 --shapes H16_B1_S1024,H128_B1_S1024,H16_B64_S4096_q2,H16_B128_S16384,H16_B32_S16384 \
  --json "$OUT/sweep-fp8-q-in-kernel-lazy.json" > "$L/sweep-q.log" 2>&1
echo "sweep q rc=$?"; grep -v Warn "$L/sweep-q.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs-4.tgz" -C "$OUT" logs  # (kept if a later part runs past the call's limit)
timeout 200 python3 -m pytest -q -x -m gpu tests/test_fp8.py -k "q_in_kernel_is_bitwise" > "$L/tests-q.log" 2>&1
echo "tests q_in_kernel rc=$?"; tail -2 "$L/tests-q.log"
fi
if run_part 5; then
K="transposed_scores=True,transposed_pv=True,kv_halves=True,qk_registers=True,sums_at_end=True,qk_permuted=True"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --shapes H16_B1_S1024,H16_B4_S1024 --set "$K" \
  --fields pv_registers,load_ahead --rounds 3 --reps 3 --cooldown 1 --json "$OUT/sweep-fp8-b1-halves.json" \
  > "$L/sweep-b1.log" 2>&1
echo "sweep b1 rc=$?"; grep -v Warn "$L/sweep-b1.log" | grep -E " us " | cut -c1-110
timeout 120 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --shapes H16_B1_S1024,H16_B4_S1024 \
  --set "$K,pv_registers=True,zero_tail=True" --fields load_ahead --rounds 3 --reps 3 --cooldown 1 \
  --json "$OUT/sweep-fp8-b1-halves-pv.json" > "$L/sweep-b1-pv.log" 2>&1
echo "sweep b1 pv rc=$?"; grep -v Warn "$L/sweep-b1-pv.log" | grep -E " us " | cut -c1-110
fi
if run_part 6; then
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_pallas_triton.py tests/test_fa3.py \
  tests/test_dcp.py tests/test_combine.py tests/test_batch_invariant.py > "$L/tests-triton-fa3.log" 2>&1
echo "tests triton/fa3 rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" "$L/tests-triton-fa3.log" | tail -8 | cut -c1-200
timeout 120 python3 -m parity.sweep --impl pallas_triton --fields none --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B128_S16384,H128_B64_S4096 --json "$OUT/sweep-triton.json" > "$L/sweep-triton.log" 2>&1
echo "sweep triton rc=$?"; grep -v Warn "$L/sweep-triton.log" | grep -E " us " | cut -c1-110
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
