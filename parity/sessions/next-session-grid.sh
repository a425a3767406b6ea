#!/usr/bin/env bash
# For the next session, after next-session-first-call.sh (written at the end of session 18): issue #5's whole grid on today's defaults, against FA3 in
# the same run, for closing the issue. Copy to parity/sessions/<date>-s19-<x>.sh and commit before running; never
# edit it after. Usage (carry [".fa3"]):
#   on nvidia-h200:    bash <copy> 0/2   then, in a second call,   bash <copy> 1/2   (--shard counts from 0)
#   on nvidia-h200-x2: bash <copy> both  (the two halves at once, one a GPU)
# Then, here: python -m parity merge <files_at>/grid-shard0of2.json <files_at>/grid-shard1of2.json --json parity/results/h200-bench-mosaic-grid-s19-<date>.json
#   --png parity/results/h200-roofline-mosaic-grid-s19-<date>.png
# The method is the v8 grid's (session 7): --trace (the kernels' device span from the profiler, beside the host
# clock), --check (every output against FA3), 3 reps. Predictions (session 14's composite on the same defaults):
# geomean FA3/Mosaic 1.08-1.11 (host) / 1.09-1.12 (span); H = 16 q_len 1 B128 S16384 >= 4.1 TB/s; best H = 128
# 550-570 TFLOP/s; B = 1 S = 1024 under FA3 at both H; every check passes.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
shard_run() {  # shard, GPU
  local tag=${1/\//of}
  CUDA_VISIBLE_DEVICES=$2 timeout 545 python3 -m parity bench --grid mosaic --shard "$1" --trace \
    --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-shard$tag.json" \
    > "$L/bench_shard$tag.log" 2>&1; echo "shard $1 rc=$?" >> "$L/bench_shard$tag.log"
}
nvidia-smi --query-gpu=index,name,clocks.max.sm --format=csv > "$L/gpus.csv"
if [ "${1:-}" = both ]; then shard_run 0/2 0 & shard_run 1/2 1 & wait; else shard_run "$1" 0; fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -h "rc=" "$L"/bench_shard*.log; grep -h "check FAIL\|ERROR\|Traceback" "$L"/bench_shard*.log | head -5
cut -c1-150 "$L"/bench_shard*.log | grep -v "Warn\|^  " | tail -45
rm -rf "$L"
