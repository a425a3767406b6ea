#!/usr/bin/env bash
# For the next session's second call (nvidia-h200; carry [".fa3"]), written in session 29 (no device) from session
# 28's first call: run it only if the first call's qk_fp8 tests passed. Copy to parity/sessions/<date>-s<n>-b.sh,
# commit, never edit after. About 8 minutes.
# 1) every kernel of one call at H16 B64 S4096 q_len 2 (ncu), the heuristic and qk_fp8;
# 2) parity.sweep --fields qk_fp8=True against the heuristic at the 16-row H16 B128 S16384, the 32-row H16 B64 S4096
#    q2 (both kv_halves) and the compute-bound H128 B64 S16384 (the plain scores' fused conversion).
# Predictions: ncu lists four kernels for the heuristic (no wrapped_gather), the qk_fp8 kernel's fusion before it
# (q's parts) about as long as the f16 conversion's; qk_fp8 1.15-1.35x faster at H16 B128 S16384 (heuristic ~365 us;
# each step's conversions about halved where the warps' issue binds), 1.05-1.2x at H16 B64 S4096 q2 (~90 us),
# 1.15-1.3x at H128 B64 S16384 (session 27: 743.5 us, 2.88 us a step against bf16's ~2.2: warpgroup 0's conversion of
# 5 chunks before and between its scores' wgmmas, and its wait for warpgroup 1's half, leave its chain). If the first
# call's error check failed for one accumulator only, add a run with
# `--set qk_fp8=True --fields qk_fp8_one_acc=False --shapes H128_B64_S16384`.
# Then (the third call) the other rows; and if qk_fp8 wins, the heuristic takes it and
# `python -m parity bench --grid fp8 --check --reps 3 --no-ceilings --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8`
# (and --grid fp8_tails, never run).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for set in "" "--set qk_fp8=True"; do
  timeout 60 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
    python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape H16_B64_S4096_q2 $set > "$L/list${set// /_}.txt" 2>&1
  echo "== ncu ${set:-heuristic}"; grep -E "^\s+\S+ \(|gpu__time_duration" "$L/list${set// /_}.txt" | paste - - | awk '{print substr($1,1,60), $NF}'
done
timeout 330 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields qk_fp8=True --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B128_S16384,H16_B64_S4096_q2,H128_B64_S16384 --json "$OUT/sweep-fp8-qk_fp8.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"; grep -v Warn "$L/sweep.log" | grep -E " us |rc=" | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
