#!/usr/bin/env bash
# Session 30, call C (nvidia-h200; carry [".fa3"]), ~7 minutes. Call A's ncu profile of the 16-row fp8 kv_halves
# kernel (H16 B128 S16384): issue slots 40% busy, no pipe above 41% (ALU), DRAM 73%; stall samples: wait 28%, short
# scoreboard 25% (most on the first F2FP / PRMT after each chunk's LDSM, and LEA after the per-chunk LDS of P's
# buffer index), selected 22%: latency-bound with 2 warps a scheduler. Call B: lazy_rescale 1.007x / 1.00x / 0.98x,
# pv_int_chunks 2-4 all slower (1.01-1.07x). New: load_ahead (each chunk's loads a chunk ahead of its conversion, V^T
# chunk 0's before the softmax, P's index once a step).
# 1) sweep load_ahead against the heuristic on the three memory-bound fp8 rows (3 rounds, 1 s idle, FA3 beside);
# 2) its compiled bitwise test (6 scenarios, 16 and 32 rows); 3) its ptxas registers at H16 B128 S16384 and H16 B64
# S4096 q2; 4) with load_ahead, pv_wait 1 / 2 / 8 at H16 B128 S16384.
# Predictions: load_ahead 1.08-1.15x faster at H16 B128 S16384 (370 -> 320-345 us), 1.05-1.12x at B32 S16384, at the
# 32-row q2 row (255 registers, pv_wait 1) 0.95-1.05x (spills); bitwise passes; registers 240 -> ~250 at 16 rows.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 210 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields load_ahead --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B128_S16384,H16_B32_S16384,H16_B64_S4096_q2 --json "$OUT/sweep-fp8-load-ahead.json" > "$L/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$L/sweep.log" | grep -E " us " | cut -c1-110
timeout 150 python3 -m pytest -q -x -m gpu tests/test_fp8.py -k "load_ahead_is_bitwise" > "$L/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$L/tests.log"
for s in H16_B128_S16384_q1 H16_B64_S4096_q2; do
  MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump/$s" timeout 40 python3 -m parity.profile \
    --impl jax.pallas_mosaic_gpu.fp8 --shape $s --set load_ahead=True > "$L/dump_$s.log" 2>&1
  echo "$s: $(grep -h -o 'Used [0-9]* registers[^$]*' "$OUT"/dump/$s/*.ptxas | head -1)"
done
timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --set load_ahead=True --fields pv_wait --rounds 3 \
  --reps 3 --cooldown 1 --shapes H16_B128_S16384 --json "$OUT/sweep-fp8-load-ahead-pv-wait.json" > "$L/sweep2.log" 2>&1
echo "sweep2 rc=$?"; grep -v Warn "$L/sweep2.log" | grep -E " us " | cut -c1-110
find "$OUT/dump" -name "*.mlir*" -delete
tar czf "$OUT/logs.tgz" -C "$OUT" logs dump
rm -rf "$L" "$OUT/dump"
