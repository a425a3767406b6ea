#!/usr/bin/env bash
# For the next session's second and third calls (nvidia-h200), one half of issue #5's grid each:
#   bash parity/sessions/<date>-s10-b.sh 0/2   and   bash parity/sessions/<date>-s10-b.sh 1/2
# then `python -m parity merge` the two JSONs (on the CPU). Written at the end of session 9; copy it before running.
# Session 7's command (s7-a), on the code of session 9: the heuristic's plain scores at H = 16 with q_len 2
# (session 9 timed 11 of those 15 rows: 1.025-1.153x faster than in session 7's grid, geomean 1.057).
# Prediction: the whole-grid geomean FA3/Mosaic 1.047 (host) / 1.085 (span) -> ~1.06 / ~1.10 (the 15 rows'
# gain spread over 61), the other 46 rows as in session 7 within the run-to-run spread (~2%).
# Session 12 (not yet run then): the heuristic now has both transposed (scores and P @ V) at H = 16 q_len 1 and 2;
# its bench of the q_len 2 S = 16384 column had geomean FA3/Mosaic 1.092 over 5 rows and 4.23 / 4.08 TB/s at B128 /
# B64. Revised prediction: geomean ~1.07 host / ~1.11 span; H = 128 rows unchanged.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
shard=$1; tag=${shard/\//of}
timeout 545 python3 -m parity bench --grid mosaic --shard "$shard" --trace \
  --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-s10-trace-shard$tag.json" \
  > "$L/bench_shard$tag.log" 2>&1; echo "shard $shard rc=$?" >> "$L/bench_shard$tag.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -h "rc=" "$L"/bench_shard*.log; grep -h "check FAIL\|ERROR" "$L"/bench_shard*.log | head -5
cut -c1-150 "$L"/bench_shard*.log | tail -75
rm -rf "$L"
