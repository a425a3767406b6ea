#!/usr/bin/env bash
# Session 13, call C (nvidia-h200). 1) parity/sessions/2026-12-02-s13-probe-fa3-order.py (see its docstring) on
# H16 B128 S16384 q1. 2) Issue #5's grid rows that session 12's defaults changed (H = 16: q_len 1, and q_len 2 at
# S = 1024 / 4096; session 12's call E timed the S = 16384 q_len 2 column), with session 10's grid command
# (--trace --check, FA3 beside). The H = 128 rows' kernel is unchanged since that grid. Prediction: the q_len 1 rows
# 1.03-1.05x faster than session 7's grid (transposed_pv), q_len 2 S <= 4096 rows equal to 1.08x.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 140 python3 parity/sessions/2026-12-02-s13-probe-fa3-order.py > "$L/probe.log" 2>&1; echo "probe rc=$?" >> "$L/probe.log"
S=""
for b in 1 8 32 64 128; do for s in 1024 4096 16384; do S="$S,H16_B${b}_S${s}_q1"; done; done
for b in 1 8 32 64 128; do for s in 1024 4096; do S="$S,H16_B${b}_S${s}_q2"; done; done
timeout ${BENCH_S:-400} python3 -m parity bench --grid mosaic --shapes "${S#,}" --trace \
  --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-s13-h16.json" \
  > "$L/bench.log" 2>&1; echo "bench rc=$?" >> "$L/bench.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warning "$L/probe.log" | tail -4
grep -h "check FAIL\|ERROR" "$L/bench.log" | head -5
cut -c1-150 "$L/bench.log" | grep -v "^  \|Warning\|warn" | tail -60
rm -rf "$L"
