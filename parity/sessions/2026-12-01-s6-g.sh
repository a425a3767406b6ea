#!/usr/bin/env bash
# Session 6, call G (nvidia-h200): the Mosaic fp8 path with its wgmmas in f16 (v9e): e4m3 -> f16 is one cvt per two
# values (v9d's 16-bit bf16 bit trick took ~270 instructions a 64 x 64 chunk); bf16 q enters as f16, the output
# leaves in q's dtype. 1. compiled fp8 tests; 2. the regions profile (2026-12-01-s6-b.py, unchanged) + ptxas;
# 3. the fp8 grid: FA3, Mosaic bf16, Mosaic fp8, Triton fp8 (what impl="auto" picks for fp8 today).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_mosaic_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_mosaic_fp8.log"
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_mosaic_fp8.log" | tail -8
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 200 python3 parity/sessions/2026-12-01-s6-b.py 2>&1 \
  | grep -v Warning | tail -15
grep -h "spill\|registers" "$OUT"/dump/*ptxas* 2>/dev/null | sort | uniq -c; cp "$OUT"/dump/*.ptxas "$L/" 2>/dev/null
rm -rf "$OUT/prof" "$OUT/dump"
timeout 240 python3 -m parity bench --grid fp8 --no-ceilings --reps 3 --check \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8,jax.pallas_triton.fp8 \
  --json "$OUT/h200-bench-fp8-mosaic.json" > "$L/bench_fp8.log" 2>&1; echo "bench rc=$?" >> "$L/bench_fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "^H|rc=" "$L/bench_fp8.log" | cut -c1-150; tail -8 "$L/bench_fp8.log"
rm -rf "$L"
