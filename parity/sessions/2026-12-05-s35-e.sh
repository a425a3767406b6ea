#!/usr/bin/env bash
# Session 35, call e (nvidia-h200; ~290 s of device time left; supersedes s35-d.sh, which got no machine and never
# ran). 1) parity.tma_probe's fp8_128r (new): the latent's 128-byte boxes from the cache's own 576-byte rows (a
# descriptor of the first 512 columns, Rounding.DOWN through a shim), beside fp8_64 and fp8_flat. Prediction: 4.0-4.5
# TB/s (fp8_64 3.5-3.6, flat 4.3-4.7): if so, an fp8 ring of 128-byte latent boxes is the next build. 2) s35-d's
# sweep: the heuristic (q_in_kernel at <= 32 tokens) against q_in_kernel=False at H16 B8 S4096 and H128 B8 S4096.
# Prediction 1.01-1.04x.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
[ -f .fa3/unpack.sh ] && bash .fa3/unpack.sh /tmp/fa3 >/dev/null; export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_128r_x4,fp8_128r_x2,fp8_flat_x4 \
  --json "$OUT/tma-probe-128r.json" > "$OUT/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$OUT/tma.log" | tail -5
timeout 190 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields q_in_kernel=False --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B8_S4096,H128_B8_S4096 --json "$OUT/sweep-fp8-q-in-kernel-b8.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; grep -v Warn "$OUT/sweep.log" | grep -E " us " | cut -c1-110
