#!/usr/bin/env bash
# For the next session's second call (nvidia-h200), after next-session-first-call.sh. Written at the end of session 13. Copy it to
# parity/sessions/<date>-s14-b.sh before running; never edit it after. Call with carry [".fa3"].
# Session 13 found the fp8 Mosaic kernel 1.16x slower right after FA3's timing than after 3 s idle (604 -> 699 us at
# H16 B128 S16384; bf16 Mosaic 1.01x) and added --cooldown S to bench and sweep. Here:
# 1) the fp8 grid of session 12's call D again, with --cooldown 3 (every row's timing after 3 s idle).
#    Prediction: fp8 / bf16 Mosaic 0.810 -> ~0.88-0.93, FA3 / fp8 Mosaic 0.886 -> ~0.95-1.0; bf16 rows within 2%.
# 2) three large rows with 1 s launches (--launch-ms 1000, --cooldown 3): each kernel under its own heat, the rate a
#    serving GPU sees. Prediction: fp8 slower than its idle-start time by up to ~1.1x, bf16 H = 16 within 2%, and at
#    H128 B64 S16384 (compute-bound: session 4 once timed bf16 Mosaic there at 494 us, 591 TFLOP/s, later runs
#    595-607 us) both FA3 and bf16 Mosaic slower than from idle.
# Then next-session-third-call.sh (the fp8 A/Bs with --cooldown).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# the GPU's clocks, power and throttle reasons every 100 ms (session 13's heat reading, unchecked then); the bench
# rows' timed_from / timed_to (unix seconds) line up with its timestamps
SMI_PID=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 100 > "$OUT/clocks.csv" 2>&1 &
  SMI_PID=$!
fi
I=torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8
timeout 260 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings --cooldown 3 --impls $I \
  --json "$OUT/bench-fp8-cooldown.json" > "$L/bench-fp8-cooldown.log" 2>&1; echo "rc=$?" >> "$L/bench-fp8-cooldown.log"
timeout 200 python3 -m parity bench --grid fp8 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H128_B64_S16384_q1 --reps 3 \
  --no-ceilings --cooldown 3 --launch-ms 1000 --impls $I --json "$OUT/bench-fp8-sustained.json" \
  > "$L/bench-fp8-sustained.log" 2>&1; echo "rc=$?" >> "$L/bench-fp8-sustained.log"
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for f in bench-fp8-cooldown bench-fp8-sustained; do echo "== $f"; cut -c1-150 "$L/$f.log" | grep -v "^  \|Warn" | tail -22; done
rm -rf "$L"
