#!/usr/bin/env bash
# Session 8, call g (nvidia-h200), the last ~5 minutes: the GPU parity suite (FA3 against both Pallas kernels on
# every scenario, CUDA-graph replay, determinism) and the bench's GPU tests, on the code as landed this session
# (the bench's graph replay holding its inputs; fp8's default dequantization layout), as far as the limit allows.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 250 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_gpu_suite.py tests/test_bench.py \
  > "$OUT/pytest-gpu-suite.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest-gpu-suite.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$OUT/pytest-gpu-suite.log" | tail -8
