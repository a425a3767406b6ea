#!/usr/bin/env bash
# For the next session's first call (nvidia-h200; carry [".fa3"]), written at the end of session 30. Copy to
# parity/sessions/<date>-s<n>-a.sh and commit before running; never edit it after. About 10 minutes (split it if the device time is short).
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
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench.log" 2>&1
echo "bench rc=$?"; grep -v Warn "$L/bench.log" | tail -30 | cut -c1-160
timeout 100 ncu --clock-control none --profile-from-start off --set full --import-source no --kernel-name regex:mosaic \
  -o "$L/full" python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape H16_B128_S16384_q1 > "$L/ncu.log" 2>&1
echo "ncu rc=$?"
ncu -i "$L/full.ncu-rep" --page details > "$L/details.txt" 2>&1
ncu -i "$L/full.ncu-rep" --page source --csv --print-source sass > "$L/sass.csv" 2>&1
rm -f "$L/full.ncu-rep"; gzip -9 "$L/sass.csv"
grep -E "Duration|Registers Per|Issue Slots Busy|DRAM Throughput|L2 Cache Throughput" "$L/details.txt" | head -6
timeout 120 python3 -m pytest -q -x -m gpu tests/test_fp8.py -k "load_ahead_is_bitwise" > "$L/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$L/tests.log"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields load_ahead --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B8_S4096,H16_B128_S1024 --json "$OUT/sweep-fp8-load-ahead-short.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$L/sweep.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
