#!/usr/bin/env bash
# For the next session's first call (nvidia-h200; carry [".fa3"]), written in session 28, which had no device. Copy to
# parity/sessions/<date>-s<n>-a.sh and commit before running; never edit it after. About 8 minutes.
# Uncompiled code waiting for the GPU:
# - session 27: with split-KV the pv_registers output's columns are put back in order by the combine kernel's gather
#   (mla_jax.combine col_order) instead of a gather of their own (ncu in session 27: 4.0 us cold at H16 B64 S4096 q2).
# - session 28: MosaicConfig(qk_fp8=True), the scores on the e4m3 tensor cores (K straight from the fp8 slot, q in 2
#   e4m3 parts for bf16, 3 for f16), so each fp8 value is converted once (V^T's) where the default converts K too.
#   Checked on the CPU: interpret cases (7, NaN tails, a 1-part mutant fails them), lowering for CUDA (3 cases).
# - session 29 (no device either): qk_fp8 on the plain scores too (64-row tiles: H = 128, H = 16 at q_len 2 where
#   kv_halves does not run), a wgmma a part of q into one accumulator; its 5 cases are in the compiled list below (the
#   fp16 one falls back: 3 parts do not fit); timed in the second call.
# 0) compiled tests: the combine's (col_order), the pv_registers / zero_tail ones, and qk_fp8's (7 cases in the
#    compiled list: where qk_fp8 does not fit compiled, f16 q without pv_registers, it does not run); split_q_e4m3's
#    tests with JAX on the GPU (its conversion of inf and NaN there);
# 1) every kernel of one call at H16 B64 S4096 q_len 2 (ncu), heuristic and qk_fp8;
# 2) the sweep of qk_fp8=True against the heuristic at the 16-row H16 B128 S16384 and the 32-row H16 B64 S4096 q2.
# Predictions: the tests pass (ptxas may spill more at 32 rows: q's descriptors hoisted); ncu lists four kernels for
# the heuristic (no wrapped_gather), the qk_fp8 kernel's fusion before it (q's parts) about as long as the f16
# conversion's; qk_fp8 1.15-1.35x faster at H16 B128 S16384 (heuristic ~365 us; each step's conversions about halved
# where the warps' issue binds), 1.05-1.2x at H16 B64 S4096 q2 (~90 us).
# Then (the next call): the sweep at H16_B32_S16384,H16_B8_S4096,H32_B64_S4095_q1; at H16_B1_S1024 (16 splits of one
# step, the one-chain path) `--set kv_halves=True,qk_registers=True,sums_at_end=True,qk_fp8=True` (one step's latency
# without K's conversion; kv_halves alone was 1.03x slower there, session 20); and if qk_fp8 wins,
# `python -m parity bench --grid fp8 --check --reps 3 --no-ceilings --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8`
# with the heuristic taking it (and --grid fp8_tails, never run).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_combine.py tests/test_fp8.py \
  -k "compiled_kernel_matches or (compiled and (pv_registers or zero_tail or qk_fp8)) or pv_registers_is_bitwise or zero_tail_is_bitwise" \
  > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|Mismatch|rc=" "$L/tests.log" | cut -c1-200 | tail -6
# (split_q_e4m3 on the GPU: XLA's f32 -> e4m3 conversion there, inf and NaN; not gpu-marked tests)
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_fp8.py -k split_q_e4m3 2>&1 | tail -1
for set in "" "--set qk_fp8=True"; do
  timeout 60 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
    python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape H16_B64_S4096_q2 $set > "$L/list${set// /_}.txt" 2>&1
  echo "== ncu ${set:-heuristic}"; grep -E "^\s+\S+ \(|gpu__time_duration" "$L/list${set// /_}.txt" | paste - - | awk '{print substr($1,1,60), $NF}'
done
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields qk_fp8=True --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B128_S16384,H16_B64_S4096_q2 --json "$OUT/sweep-fp8-qk_fp8.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"; grep -v Warn "$L/sweep.log" | grep -E " us |rc=" | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
