#!/usr/bin/env bash
# For the next session's first call(s). Written at the end of session 5 (no device time left).
# Issue #5's whole grid with v8 (transposed scores for H < 64) and --trace: each row also timed on the device
# (the kernels' span per call from the JAX profiler's trace), so the summary gives both geomeans, host-timed
# t(N)/N and device span (session 5: the JAX loop's launches carry 0.1-0.7 ms outside its kernels).
# Usage: one shard per GPU, in parallel, e.g.
#   bash parity/sessions/next-session-first-call.sh 0/2 1/2     # nvidia-h200-x2, both halves in one call (~9 min)
#   bash parity/sessions/next-session-first-call.sh 0/2         # nvidia-h200: one half a call, then 1/2
# then, here: python -m parity merge <shard JSONs> --json parity/results/h200-bench-mosaic-grid-v8-trace-<date>.json
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
gpu=0
for shard in "$@"; do
  tag=${shard/\//of}
  ( CUDA_VISIBLE_DEVICES=$gpu timeout 560 python3 -m parity bench --grid mosaic --shard "$shard" --trace \
      --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-v8-trace-shard$tag.json" \
      > "$L/bench_shard$tag.log" 2>&1; echo "shard $shard rc=$?" >> "$L/bench_shard$tag.log" ) &
  gpu=$((gpu + 1))
done
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -h "rc=" "$L"/bench_shard*.log; grep -h "check FAIL\|ERROR" "$L"/bench_shard*.log | head -5; tail -4 "$L"/bench_shard*.log
rm -rf "$L"
