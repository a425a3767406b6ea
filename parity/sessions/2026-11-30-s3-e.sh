#!/usr/bin/env bash
# Session 3, call E (nvidia-h200-x2): the split combine as one Pallas Triton kernel (mla_jax.combine) in both
# Pallas paths. GPU 0: its compiled tests and the split paths' (Mosaic scenarios with heuristic splits and 3
# splits, Triton, fp8, batch invariance). GPU 1: a third of the Mosaic grid (the shapes of shard 0/3 of
# call C's run, which had XLA's three-kernel combine), FA3 beside it, every row checked.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
( export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_combine.py \
    "tests/test_pallas_mosaic_gpu.py::TestGPU::test_scenario" tests/test_pallas_triton.py tests/test_fp8.py \
    tests/test_batch_invariant.py > "$L/pytest.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest.log" ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 280 python3 -m parity bench --grid mosaic --shard 0/3 --impls torch.fa3,jax.pallas_mosaic_gpu --check \
    --reps 3 --json "$OUT/h200-bench-mosaic-grid-shard0of3.json" > "$L/bench.log" 2>&1; echo "bench rc=$?" >> "$L/bench.log" ) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest.log" | tail -8; tail -28 "$L/bench.log"; rm -rf "$L"
