#!/usr/bin/env bash
# Session 28 call A (nvidia-h200; carry [".fa3"]), written at the end of session 27 as next-session-first-call.sh.
# About 6 minutes.
# Session 27 (after its device time): with split-KV the pv_registers output's columns are put back in order by the
# combine kernel's gather (mla_jax.combine col_order) instead of a gather of their own (ncu in session 27: 4.0 us,
# cold caches, at H16 B64 S4096 q_len 2). Checked on the CPU only (the combine in interpret mode, the lowering).
# 0) the compiled combine tests (with col_order) and the compiled pv_registers / zero_tail tests (split-KV cases
# through the new combine; bitwise against qk_permuted, which takes no gather); 1) every kernel of one call at H16 B64
# S4096 q_len 2 (ncu); 2) the sweep of the heuristic at the two 32-row B64 rows (session 27 call E with zero_tail:
# 92.6 us, FA3/impl 1.01 at H16 B64 S4096 q2; 93.2, 0.96 at H32 B64 S4095 q1).
# Predictions: the tests pass; ncu lists four kernels (no wrapped_gather), the combine within 0.5 us of 5.15;
# the sweep 1-3 us faster (H16 B64 S4096 q2 ~90-91.5 us, FA3/impl 1.02-1.04).
# Then (the next call): `python -m parity bench --grid fp8` and `--grid fp8_tails` (new, never run: every request's
# last step masked) with --check --reps 3 --no-ceilings --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_combine.py tests/test_fp8.py \
  -k "compiled_kernel_matches or (compiled and (pv_registers or zero_tail)) or pv_registers_is_bitwise or zero_tail_is_bitwise" \
  > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|Mismatch|rc=" "$L/tests.log" | cut -c1-200 | tail -4
timeout 50 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
  python3 -m parity.profile --impl jax.pallas_mosaic_gpu.fp8 --shape H16_B64_S4096_q2 > "$L/list_fp8_H16_B64_S4096_q2.txt" 2>&1
grep -E "^\s+\S+ \(|gpu__time_duration" "$L/list_fp8_H16_B64_S4096_q2.txt" | paste - - | awk '{print substr($1,1,60), $NF}'
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields none --rounds 3 --reps 3 --cooldown 1 \
  --shapes H16_B64_S4096_q2,H32_B64_S4095_q1 --json "$OUT/sweep-fp8-combine-gather.json" > "$L/sweep.log" 2>&1
echo "rc=$?" >> "$L/sweep.log"; grep -v Warn "$L/sweep.log" | grep -E " us |rc=" | cut -c1-110
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
