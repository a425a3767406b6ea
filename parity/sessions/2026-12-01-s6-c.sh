#!/usr/bin/env bash
# Session 6, call C (nvidia-h200): the Mosaic fp8 path after the register fix (16-bit dequantization:
# e4m3 -> f16 -> bf16 bits, masking only in the tail step; call B: 3.2 us a step in dequant, 1 KiB spills).
# 1. compiled fp8 tests; 2. the regions profile again (2026-12-01-s6-b.py, unchanged) with ptxas info;
# 3. the fp8 grid, FA3 / Mosaic bf16 / Mosaic fp8.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_mosaic_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_mosaic_fp8.log"
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_mosaic_fp8.log" | tail -8
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 200 python3 parity/sessions/2026-12-01-s6-b.py 2>&1 \
  | grep -v Warning | tail -16
grep -h "spill\|registers" "$OUT"/dump/*ptxas* 2>/dev/null | sort | uniq -c; rm -rf "$OUT/dump" "$OUT/prof"
timeout 200 python3 -m parity bench --grid fp8 --no-ceilings --reps 3 --check \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 \
  --json "$OUT/h200-bench-fp8-mosaic.json" > "$L/bench_fp8.log" 2>&1; echo "bench rc=$?" >> "$L/bench_fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "^H|rc=" "$L/bench_fp8.log" | cut -c1-150; tail -7 "$L/bench_fp8.log"
rm -rf "$L"
