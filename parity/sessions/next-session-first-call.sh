#!/usr/bin/env bash
# For the next session's first call (nvidia-h200-x2, ~8 min). Written at the end of session 4 (no device time left).
# GPU 0: the run-to-run spread of the Mosaic kernel's times (session 4: 494-599 us for the same code at H128 B64
# S16384, while FA3 stayed within 5%): the same shapes re-timed 3 times in one process, beside FA3, with the
# GPU's clocks, power and temperature logged every 200 ms. GPU 1: full ncu reports with SASS of the fp8 Triton
# kernel and the bf16 one at H16 B32 S16384 (issue #7: why fp8 is 2.2-2.7x slower than bf16; does the M = 16 tile
# lower to mma.sync?), and of the Mosaic kernel at the same shape (a mid H = 16 shape: 2.6-2.8 us a step, against
# 2.34 at H16 B128 S16384). GPU 0 then: the small shapes with XLA's command buffers for the loop, and with PDL.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 200 > "$L/smi.csv" 2>&1 &
SMI=$!
( export CUDA_VISIBLE_DEVICES=0
  S=H128_B64_S16384_q1,H128_B1_S1024_q1,H16_B32_S1024_q1
  timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 5 --fields none --shapes $S,$S,$S \
    --json "$OUT/h200-spread-mosaic.json" > "$L/spread.log" 2>&1; echo "spread rc=$?" >> "$L/spread.log"
  # FA3's graph replay beats the sum of its kernels' ncu times by ~7 us at H128 B1 S1024 (PDL, no launch gaps);
  # the JAX loop's kernels are launched one by one. XLA's own answers (flags checked to parse on jax 0.11.2):
  # the loop as one command buffer (a CUDA graph), and PDL. Timing only: before a flag is adopted, the parity
  # suite and the compiled tests run under it (PDL lets a kernel start before the previous one ends).
  S=H16_B1_S1024_q1,H128_B1_S1024_q1,H128_B8_S1024_q2
  for flags in "" "--xla_gpu_enable_command_buffer=+WHILE --xla_gpu_command_buffer_unroll_loops=true" \
               "--xla_gpu_enable_pdl=true"; do
    XLA_FLAGS="$flags" timeout 60 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 5 --fields none --shapes $S \
      > "$L/xlaflags.log.tmp" 2>&1; echo "rc=$?" >> "$L/xlaflags.log.tmp"
    { echo "== XLA_FLAGS=$flags"; cat "$L/xlaflags.log.tmp"; } >> "$L/xlaflags.log"
  done; rm -f "$L/xlaflags.log.tmp" ) &
P0=$!
( export CUDA_VISIBLE_DEVICES=1
  for impl in jax.pallas_triton.fp8 jax.pallas_triton jax.pallas_mosaic_gpu; do
    timeout 100 ncu --clock-control none --profile-from-start off --set full --kernel-name regex:'mla_decode|mosaic' \
      -o "$L/full_$impl" python3 -m parity.profile --impl $impl --shape H16_B32_S16384_q1 > "$L/ncu_$impl.log" 2>&1
    ncu -i "$L/full_$impl.ncu-rep" --page details > "$L/details_$impl.txt" 2>&1
    ncu -i "$L/full_$impl.ncu-rep" --page source --csv --print-source sass > "$L/sass_$impl.csv" 2>&1
    rm -f "$L/full_$impl.ncu-rep"
  done ) &
P1=$!
wait $P0 $P1; kill $SMI
for f in "$L"/sass_*.csv; do gzip "$f"; done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
tail -12 "$L/spread.log"; grep -E "^==|heuristic|rc=" "$L/xlaflags.log"
for f in "$L"/details_*.txt; do echo "== $(basename $f)"; grep -E "^  \S|Duration|Registers Per|Local Memory Spilling Requests  " "$f" | head -8; done
for f in "$L"/sass_*.csv.gz; do echo "== $(basename $f)"; zcat "$f" | grep -oE "HGMMA\.[^ ,\"]*|HMMA\.[^ ,\"]*|F2FP[^ ,\"]*|STL[^ ,\"]*" | sort | uniq -c | head -8; done
awk -F', ' 'NR > 1 {print $2, $3, $5, $6}' "$L/smi.csv" | sort | uniq -c | sort -rn | head -8
rm -rf "$L"
