#!/usr/bin/env bash
# Session 6, call F (nvidia-h200): as call C (2026-12-01-s6-c.sh), after the fp8 fix of call E: the dequantized step
# is indexed by info word 4 (0) at each use, so the compiler cannot hoist its wgmma descriptors (they spilled).
# 1. compiled fp8 tests; 2. the regions profile (2026-12-01-s6-b.py, unchanged) with ptxas info, PTX kept;
# 3. the fp8 grid, FA3 / Mosaic bf16 / Mosaic fp8.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_mosaic_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_mosaic_fp8.log"
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_mosaic_fp8.log" | tail -8
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 200 python3 parity/sessions/2026-12-01-s6-b.py 2>&1 \
  | grep -v Warning | tail -16
grep -h "spill\|registers" "$OUT"/dump/*ptxas* 2>/dev/null | sort | uniq -c; rm -rf "$OUT/prof" "$OUT"/dump/*mlir-passes*
timeout 200 python3 -m parity bench --grid fp8 --no-ceilings --reps 3 --check \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 \
  --json "$OUT/h200-bench-fp8-mosaic.json" > "$L/bench_fp8.log" 2>&1; echo "bench rc=$?" >> "$L/bench_fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "^H|rc=" "$L/bench_fp8.log" | cut -c1-150; tail -7 "$L/bench_fp8.log"
rm -rf "$L"
