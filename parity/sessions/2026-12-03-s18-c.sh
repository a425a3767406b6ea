#!/usr/bin/env bash
# Session 18 call C (nvidia-h200; carry [".fa3"]): correctness on the landed code, for closing issue #5. The last
# whole test_gpu_suite run was session 8 (2026-12-01); the Mosaic kernel's defaults moved since (heads_fastest,
# session 14). 1) `python -m parity` (the main job: FA3 against the Pallas kernels and the reference, every parity
# scenario, bf16 and fp16, out and LSE); 2) the GPU parity suite (NaN beyond seq_lens, eager vs jit, CUDA graph,
# determinism); 3) the Mosaic kernel's compiled tests, as far as the call's time goes.
# Prediction: no failure; the 4 known FA3 rows on NaN page tails as before.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 130 python3 -m parity --quiet --json "$OUT/parity-main.json" > "$L/parity-main.log" 2>&1
echo "rc=$?" >> "$L/parity-main.log"
timeout 160 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_gpu_suite.py \
  > "$L/pytest-gpu-suite.log" 2>&1; echo "rc=$?" >> "$L/pytest-gpu-suite.log"
timeout 250 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_pallas_mosaic_gpu.py \
  > "$L/pytest-mosaic.log" 2>&1; echo "rc=$?" >> "$L/pytest-mosaic.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/parity-main.log" | tail -6
grep -hE "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest-gpu-suite.log" "$L/pytest-mosaic.log" | tail -12
rm -rf "$L"
