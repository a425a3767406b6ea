#!/usr/bin/env bash
# Session 6, call B (nvidia-h200): the Mosaic kernel's named regions per step, bf16 vs fp8 (profiler),
# plus ptxas / PTX / SASS dumps of the compiled kernels. See 2026-12-01-s6-b.py.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/dump"
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump"
timeout 400 python3 parity/sessions/2026-12-01-s6-b.py 2>&1 | grep -v Warning | tail -40
ls -la "$OUT/dump" | head -20; du -sh "$OUT/dump"
grep -il "spill" "$OUT"/dump/* | head; grep -ih "registers\|spill" "$OUT"/dump/*ptxas* 2>/dev/null | sort | uniq -c | head -20
tar czf "$OUT/dump.tgz" -C "$OUT" dump prof && rm -rf "$OUT/dump" "$OUT/prof"
