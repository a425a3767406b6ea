#!/usr/bin/env bash
# Session 8, call d (nvidia-h200): which part of the fp8 runner breaks FA3's CUDA graph (2026-12-01-s8-d.py),
# then compute-sanitizer memcheck on one fp8 Mosaic call (small shape, no FA3).
set -uo pipefail
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
P=parity/sessions/2026-12-01-s8-d.py
F="Warning\|warn\|^E1201\|Source Loc\|cuda_status\|^$\|^jaxlib"
for args in "H16_B128_S16384_q1 bf16" "H16_B128_S16384_q1 quantize" "H16_B128_S16384_q1 fp8-once" "H16_B8_S4096_q1 quantize"; do
  echo "== $args"
  timeout 60 python3 $P $args 2>&1 | grep -v "$F" | cut -c1-200 | tail -4
done
echo "== sanitize"
timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 5 python3 $P H16_B8_S4096_q1 sanitize \
  2>&1 | grep -v "$F" | cut -c1-240 | tail -30
