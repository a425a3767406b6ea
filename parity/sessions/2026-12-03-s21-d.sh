#!/usr/bin/env bash
# Session 21, call D (nvidia-h200; carry [".fa3"]). Call C: qk_registers correct (its 4 compiled tests, bitwise
# kv_halves) and 1.20x faster than kv_halves alone at H16 B128 S16384 (513.1 -> 426.7 us), 1.17x at B32 S16384
# (140.9 -> 120.3). The heuristic now picks qk_registers wherever it picks kv_halves.
# 1) issue #7's fp8 grid on today's defaults (as session 20's call B); 2) compiled tests of the heuristic's picks and
# of kv_halves. Predictions: fp8 / bf16 Mosaic ~0.9 over the 7 rows (0.836 in session 20), H16 B128 S16384 fp8
# ~430 us (2.8 TB/s of fp8 bytes), FA3 / fp8 > 1.25 there; every test passes.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-150 | tail -24
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "(fp8_compiled and (decode_mixed_lengths-bfloat16] or heads_8_q2-bfloat16] or spec_decode_page_16-bfloat16] or heads_128_spec-bfloat16])) or kv_halves_nan" \
  > "$L/pytest.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest.log" | tail -8
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
