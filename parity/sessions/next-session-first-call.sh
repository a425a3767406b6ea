#!/usr/bin/env bash
# For the next session's first call (nvidia-h200). Written at the end of session 9 (its plan ran as
# 2026-12-01-s9-a.sh). Copy it to parity/sessions/<date>-s10-a.sh before running; never edit it after.
# Then next-session-second-call.sh, twice (the whole issue #5 grid, one half a call).
# 1. Compiled fp8 tests: the default is now MosaicConfig(fused_group=4) (warpgroup 0 converts its V half in one
#    group behind one fence inside the scores), compiled in session 9 only at H128 fp16 (s9-f); here every fp8
#    case, fused_group 1 and 2 the explicit ones.
# 2. fused_group 1 / 2 against the default 4, three interleaved rounds on four shapes (s9-f timed two shapes in
#    two rounds: 4 was 1.13x faster than 1 at H16 B128 S16384, 1.08x at H128 B64 S16384). Prediction: 4 the
#    fastest or tied with 2 everywhere, 1.05-1.13x over 1 on the large shapes, ~1.0 at H16 B64 S4096 q2.
# 3. The fp8 grid with the new default (s9-d's command). Prediction: fp8 / bf16 Mosaic 0.780 -> ~0.83-0.86,
#    FA3 / fp8 Mosaic 0.806 -> ~0.85-0.9.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_fp8.log"
timeout 170 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields fused_group --rounds 3 --reps 3 \
  --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B64_S4096_q2,H128_B64_S16384_q1 \
  --json "$OUT/sweep-fp8-fused-group.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
timeout 300 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_fp8.log" | tail -4
cut -c1-120 "$L/sweep.log" | grep -v Warning | tail -20
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-170 | tail -12
rm -rf "$L"
