#!/usr/bin/env bash
# Session 14, call E (nvidia-h200; carry [".fa3"]). Never edit after running.
# Issue #5's compute-bound rows (H = 128, B >= 32, S >= 4096, q_len 1 and 2, and B128 S8192 q2: 13 rows) on the
# heuristic that now picks heads_fastest (call A 1.06-1.11x; call D: kv_multicast no faster, within 2%), with
# session 10's grid command (--trace --check, FA3 beside). Prediction: 1.06-1.10x faster than session 7's grid rows,
# FA3/Mosaic ~0.93-1.0; best TFLOP/s ~570-580 (under the 600 target).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
S=""
for q in 1 2; do for b in 32 64 128; do for s in 4096 16384; do S="$S,H128_B${b}_S${s}_q${q}"; done; done; done
S="$S,H128_B128_S8192_q2"
timeout ${BENCH_S:-420} python3 -m parity bench --grid mosaic --shapes "${S#,}" --trace \
  --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-s14-h128.json" \
  > "$L/bench.log" 2>&1; echo "bench rc=$?" >> "$L/bench.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -h "check FAIL\|ERROR" "$L/bench.log" | head -5
cut -c1-150 "$L/bench.log" | grep -v "^  \|Warning\|warn" | tail -34
rm -rf "$L"
