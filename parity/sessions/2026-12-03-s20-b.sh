#!/usr/bin/env bash
# Session 20, call B (nvidia-h200; carry [".fa3"]), after call A timed kv_halves (the fp8 heuristic's pick at 16 rows
# since this session): issue #7's fp8 grid on today's defaults, FA3 (bf16), the bf16 Mosaic kernel and the fp8 Mosaic
# kernel side by side, checked; then the compiled fp8 tests of the heuristic's picks (kv_halves at 16 rows).
# Predictions: the H = 16 q_len 1 rows (B128 S16384, B32 S16384, B1 S1024) move by call A's sweep ratios, the others
# (q_len 2, H = 128: kv_halves does not run there) as in session 11/12's grid; checks within the fp8 gap.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-150 | tail -24
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "fp8_compiled and (decode_mixed_lengths-bfloat16] or heads_8_q2-bfloat16] or spec_decode_page_16-bfloat16] or heads_128_spec-bfloat16])" \
  > "$L/pytest.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest.log" | tail -8
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
