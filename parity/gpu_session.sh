#!/usr/bin/env bash
# One call on the lent H200: GPU tests, the parity report and the side-by-side bench, logs and JSON under $OUT.
#   run(command="bash parity/gpu_session.sh [GRID] [PYTEST_ARGS...]", carry=[".fa3"])
# GRID: a `python -m parity bench` grid (default: headline); "none" skips the bench.
# PYTEST_ARGS: which GPU tests (e.g. tests/test_gpu_suite.py). The whole `pytest -m gpu` suite takes more
# than one 10-minute call on one H200 (compiles dominate): split it over calls, or over the two GPUs of
# nvidia-h200-x2 as parity/sessions/2026-11-30-s2-*.sh do. A call returns at most 8 files: tar the logs.
set -uo pipefail
grid="${1:-headline}"; shift || true
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())"
python3 -m pytest -m gpu -q -p no:cacheprovider -x "$@" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
python3 -m parity --quiet --json "$OUT/h200-parity.json" --png "$OUT/h200-parity-errors.png" > "$OUT/parity.log" 2>&1; echo "parity rc=$?"
grep -E "FAIL|ERROR" "$OUT/parity.log" | head -20; tail -2 "$OUT/parity.log"
if [ "$grid" != "none" ]; then
  python3 -m parity bench --grid "$grid" --check --json "$OUT/h200-bench-$grid.json" --png "$OUT/h200-roofline-$grid.png" 2>&1 | tee "$OUT/bench.log" | tail -80
fi
