#!/usr/bin/env bash
# Session 7, calls A and B (nvidia-h200, one GPU): issue #5's whole grid, one half a call
# (`bash parity/sessions/2026-12-01-s7-a.sh 0/2`, then `... 1/2`), v8 kernel (unchanged since session 5),
# --trace (device span per call beside the host clock), with the bench's new default launch of ~25 ms
# (N up to 8000; sessions 1-6 used ~3 ms, N <= 400, where the JAX loop's 0.1-0.7 ms per launch was up to a
# fifth of a small shape's t(N)/N). Joined here with `python -m parity merge`.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
shard=$1; tag=${shard/\//of}
timeout 545 python3 -m parity bench --grid mosaic --shard "$shard" --trace \
  --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-v8-trace-shard$tag.json" \
  > "$L/bench_shard$tag.log" 2>&1; echo "shard $shard rc=$?" >> "$L/bench_shard$tag.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -h "rc=" "$L"/bench_shard*.log; grep -h "check FAIL\|ERROR" "$L"/bench_shard*.log | head -5
cut -c1-150 "$L"/bench_shard*.log | tail -75
rm -rf "$L"
