#!/usr/bin/env bash
# Session 42, call b (kind nvidia-h200 without needs_h200, carry [".fa3"]; ~8 min): after s42-a (H100: pair_ring 1.02x
# at H16 B128 S16384, 1.01x at B32 S16384; its bitwise test with q_in_kernel and split-KV passed) the heuristic takes
# pair_ring at 16 rows with pv_registers. 1) the new heuristic against pair_ring=False (the old default) at those two
# rows, FA3 beside. Prediction: 1.01-1.03x (the card that comes; on an H200 1.05-1.25x if its probe's 4.4-4.7 TB/s
# for whole-line boxes holds in the kernel). 2) the fp8 grid side by side on the new heuristic (FA3 bf16, bf16 Mosaic,
# fp8 Mosaic), checked against the reference. Prediction on an H100: every row checked; fp8 H16 B128 S16384 ~430 us,
# 1.6-1.8x of bf16 Mosaic's. Never edited after its first run.
set -uo pipefail
PARTS="${1:-12}"
run_part() { [[ "$PARTS" == *"$1"* ]]; }
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
if run_part 1; then
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields pair_ring=False --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B128_S16384,H16_B32_S16384 --json "$OUT/sweep-fp8-pair-ring-default.json" \
  > "$L/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$L/sweep.log" | grep -E " us " | cut -c1-110
tar czf "$OUT/logs-1.tgz" -C "$OUT" logs
fi
if run_part 2; then
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench.log" 2>&1
echo "bench rc=$?"; grep -v Warn "$L/bench.log" | tail -30 | cut -c1-160
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
