#!/usr/bin/env bash
# Session 7, call C (nvidia-h200): with the bench's 25 ms launches (calls A and B), the headline grid with every
# implementation (FA3, FlashMLA, Pallas Triton, Pallas Mosaic GPU; the README's table was session 4's v6 run) and
# the fp8 grid (bf16 and fp8 rows of both Pallas kernels), both with --check and --trace.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m parity bench --grid headline --trace --check --reps 3 \
  --impls torch.fa3,torch.flashmla,jax.pallas_triton,jax.pallas_mosaic_gpu \
  --json "$OUT/headline.json" > "$L/headline.log" 2>&1; echo "headline rc=$?" >> "$L/headline.log"
timeout 300 python3 -m parity bench --grid fp8 --trace --check --reps 3 \
  --impls torch.fa3,jax.pallas_triton,jax.pallas_mosaic_gpu,jax.pallas_triton.fp8,jax.pallas_mosaic_gpu.fp8 \
  --json "$OUT/fp8.json" > "$L/fp8.log" 2>&1; echo "fp8 rc=$?" >> "$L/fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for f in headline fp8; do grep -h "rc=\|check FAIL\|ERROR" "$L/$f.log" | head -5; done
cut -c1-150 "$L/headline.log" | tail -12; cut -c1-150 "$L/fp8.log" | tail -14
rm -rf "$L"
