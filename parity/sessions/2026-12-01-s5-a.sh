#!/usr/bin/env bash
# Session 5, call A (nvidia-h200-x2): the call prepared at the end of session 4 (next-session-first-call.sh), run as written.
# GPU 0: the compiled tests of MosaicConfig(transposed_scores=True) (CPU-checked only), its A/B on six H = 16
# shapes, then the small shapes with XLA's command buffers for the JAX loop and with PDL (timing only).
# GPU 1: the run-to-run spread of the Mosaic kernel's times (session 4: 494-599 us for the same code at H128 B64
# S16384, while FA3 stayed within 5%): the same shapes re-timed twice in one process, beside FA3; then the compiled
# fp8 tests and the A/B of the fp8 Triton kernel's conversion (through f16 and f32, commit c15e040) against the one before, on the fp8
# grid. Before the call, put the old kernel beside the tree (it travels as an untracked file):
#   mkdir -p parity/sessions/ab && git show c15e040~1:mla_jax/pallas_triton.py > parity/sessions/ab/pallas_triton_before.py
# The GPUs' clocks, power and temperature are logged every 200 ms throughout.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 200 > "$L/smi.csv" 2>&1 &
SMI=$!
( export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
    -k "transposed or tscores" > "$L/pytest_tscores.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_tscores.log"
  timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 5 --fields transposed_scores \
    --shapes H16_B32_S16384_q1,H16_B8_S4096_q1,H16_B32_S4096_q1,H16_B64_S4096_q2,H16_B128_S16384_q1,H16_B8_S1024_q1 \
    --json "$OUT/h200-sweep-mosaic-tscores.json" > "$L/sweep_tscores.log" 2>&1; echo "rc=$?" >> "$L/sweep_tscores.log"
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
  S=H128_B64_S16384_q1,H128_B1_S1024_q1,H16_B32_S1024_q1
  timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 5 --fields none --shapes $S,$S \
    --json "$OUT/h200-spread-mosaic.json" > "$L/spread.log" 2>&1; echo "spread rc=$?" >> "$L/spread.log"
  # the fp8 conversion change compiled (CPU-checked only): the compiled fp8 tests first
  timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py > "$L/pytest_fp8.log" 2>&1
  echo "pytest rc=$?" >> "$L/pytest_fp8.log"
  if [ -f parity/sessions/ab/pallas_triton_before.py ]; then
    rm -rf /tmp/before && mkdir /tmp/before && cp -r mla_jax mla_spec mla_torch parity /tmp/before/ \
      && cp parity/sessions/ab/pallas_triton_before.py /tmp/before/mla_jax/pallas_triton.py
    for v in new before; do
      if [ $v = new ]; then P=/tmp/fa3:$PWD; else P=/tmp/fa3:/tmp/before; fi
      PYTHONPATH=$P timeout 110 python3 -m parity bench --grid fp8 --no-ceilings --reps 3 --check \
        --impls torch.fa3,jax.pallas_triton,jax.pallas_triton.fp8 --json "$OUT/h200-bench-fp8-$v.json" \
        > "$L/fp8_$v.log" 2>&1; echo "rc=$?" >> "$L/fp8_$v.log"
    done
  else
    echo "no parity/sessions/ab/pallas_triton_before.py: fp8 A/B skipped" > "$L/fp8_new.log"
  fi ) &
P1=$!
wait $P0 $P1; kill $SMI
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED" "$L/pytest_tscores.log" "$L/pytest_fp8.log" | tail -6; grep -E "^H|rc=" "$L/sweep_tscores.log"
tail -12 "$L/spread.log"; grep -E "^==|heuristic|rc=" "$L/xlaflags.log"
for v in new before; do echo "== fp8 $v"; grep -E "pallas_triton|rc=|skipped" "$L/fp8_$v.log" 2>/dev/null | tail -10; done
awk -F', ' 'NR > 1 {print $2, $3, $5, $6}' "$L/smi.csv" | sort | uniq -c | sort -rn | head -8
rm -rf "$L"
