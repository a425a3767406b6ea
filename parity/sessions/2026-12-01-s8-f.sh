#!/usr/bin/env bash
# Session 8, call f (nvidia-h200): dequant_layout="wgmma_8bit" is now the fp8 default (call e's A/B): the compiled
# fp8 Mosaic tests (the default cases now run it; two cases keep "wgmma"), then the fp8 grid beside bf16 FA3 and
# bf16 Mosaic, checked, 25 ms launches (as session 7's h200-bench-fp8-v9e-launch25ms).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$OUT/pytest-fp8.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest-fp8.log"
grep -E "passed|failed|^FAILED|rc=" "$OUT/pytest-fp8.log" | tail -4
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$OUT/bench-fp8.log" 2>&1
echo "bench rc=$?"
grep -v "Warning\|warn" "$OUT/bench-fp8.log" | cut -c1-190 | tail -30
