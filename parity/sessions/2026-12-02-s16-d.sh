#!/usr/bin/env bash
# Session 16, call D (nvidia-h200; carry [".fa3"]). Written after call C: the 32-key step is dead (the scores at N =
# 32 with a 64-byte swizzle take 1.108 us per 64 keys against 0.761; qk32+pv32+pv32 1.79 against qk+pv+pv 1.23),
# and the softmax costs warpgroup 0 only 0.31 us a step (qk_sm 1.075 against qk 0.761). New: the step probes, each
# schedule's whole step (its barriers, P and alpha hand-offs, rescales) over one KV step held in shared memory, no
# loads: the kernel's step minus these is what the ring's loads and waits cost each schedule.
# Predictions (us a step): step_flashmla 1.75-1.85 (qk 0.76 + softmax 0.31 + both P @ V halves 0.635 + rescale and
# hand-off ~0.1), step_deferred 1.45-1.60 (warpgroup 1's half under the softmax), step_three_wg 1.55-1.65
# (qk_sm+pv+pv 1.60). The kernel (same call, heuristic, 2 s idle): H128 B64 S16384 q1 ~2.05 us a step (526.5 us / 256
# steps in call B). The SM clock is logged (nvidia-smi, 100 ms) to set the probes' clock beside the kernel's.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
SMI_PID=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
    --format=csv,nounits -lms 100 > "$OUT/clocks.csv" 2>&1 &
  SMI_PID=$!
fi
T0=$(date +%s.%N)
timeout 200 python3 -m parity.wgmma_probe --probes qk,qk_sm,pv+pv,qk+pv+pv,qk_sm+pv+pv,step_flashmla,step_deferred,step_three_wg \
  --json "$OUT/wgmma-probe-steps.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
T1=$(date +%s.%N)
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields none --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B64_S16384_q1 --json "$OUT/sweep-h128-heuristic.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"
T2=$(date +%s.%N)
[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null
echo "probe $T0 $T1" > "$OUT/windows.txt"; echo "sweep $T1 $T2" >> "$OUT/windows.txt"
python3 - "$OUT/clocks.csv" "$OUT/windows.txt" <<'PY' > "$L/clocks-summary.txt" 2>&1
import csv, sys, datetime
rows = []
for r in csv.reader(open(sys.argv[1])):
    try:
        t = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append((t, float(r[1]), float(r[2])))
    except (ValueError, IndexError):
        pass
for line in open(sys.argv[2]):
    name, a, b = line.split()
    w = [(c, p) for t, c, p in rows if float(a) <= t <= float(b) and p > 150]  # samples under load (> 150 W)
    if w:
        print(f"{name}: {len(w)} loaded samples, SM clock mean {sum(c for c, _ in w) / len(w):.0f} MHz "
              f"(min {min(c for c, _ in w):.0f}), power mean {sum(p for _, p in w) / len(w):.0f} W")
    else:
        print(f"{name}: no loaded samples")
PY
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$L/clocks-summary.txt"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -5
grep -v Warn "$L/probe.log" | tail -10
rm -rf "$L"
