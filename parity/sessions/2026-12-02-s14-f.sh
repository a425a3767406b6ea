#!/usr/bin/env bash
# Session 14, call F (nvidia-h200; carry [".fa3"]). Never edit after running.
# The rest of issue #5's H = 128 rows (B 1 and 8 at every S, S 1024 at B 32-128; q_len 1 and 2: 18 rows) on the
# heuristic with heads_fastest, as call E (--trace --check, FA3 beside): with call E and session 13's H = 16 rows,
# the whole grid on the current defaults. Prediction: the B >= 8 rows 1.03-1.10x faster than session 7's grid rows;
# the B1 rows (one head-tile pair, split-KV) unchanged within 3%.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
S=""
for q in 1 2; do
  for b in 1 8; do for s in 1024 4096 16384; do S="$S,H128_B${b}_S${s}_q${q}"; done; done
  for b in 32 64 128; do S="$S,H128_B${b}_S1024_q${q}"; done
done
timeout ${BENCH_S:-330} python3 -m parity bench --grid mosaic --shapes "${S#,}" --trace \
  --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-s14-h128-rest.json" \
  > "$L/bench.log" 2>&1; echo "bench rc=$?" >> "$L/bench.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -h "check FAIL\|ERROR" "$L/bench.log" | head -5
cut -c1-150 "$L/bench.log" | grep -v "^  \|Warning\|warn" | tail -42
rm -rf "$L"
