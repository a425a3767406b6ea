#!/usr/bin/env bash
# Session 12, call D (nvidia-h200), on the new defaults: the heuristic picks transposed scores + transposed_pv at 16
# and 32 rows (H = 16 at q_len 1 and 2), and MosaicConfig.overlap_wait is True (calls A-C).
# 1. Compiled: the heuristic's scenarios (bf16), the fp8 heuristic cases, the long-sequence fp8 test, the overlap
#    bitwise test (now overlap_wait=False and True both against the unfused path).
# 2. The fp8 grid, one run with FA3, every output checked (as session 11's call C). Prediction: fp8 / bf16 Mosaic
#    0.789 -> ~0.85 (the fp8 H = 16 rows 1.15-1.2x faster: tpv 1.13x x overlap_wait 1.05x; the bf16 H = 16 rows
#    1.03-1.1x faster too, which pulls the ratio back); FA3 / fp8 Mosaic 0.847 -> ~0.93; H16 B128 S16384 fp8
#    673.8 -> ~570-590 us.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
K='(test_scenario and heuristic and bfloat16) or (fp8_compiled and (decode_mixed_lengths-bfloat16] or heads_128_spec or spec_decode_page_16-bfloat16] or decode_q2_page_32-bfloat16-transposed_scores-transposed_pv)) or long_sequences or overlap_dequant_is_bitwise'
timeout 180 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py tests/test_fp8.py \
  -k "$K" > "$L/pytest.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest.log"
timeout 330 python3 -m parity bench --grid fp8 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 --json "$OUT/bench-fp8.json" > "$L/bench-fp8.log" 2>&1
echo "bench rc=$?" >> "$L/bench-fp8.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest.log" | tail -8
grep -v "Warning\|warn" "$L/bench-fp8.log" | cut -c1-150 | tail -28
rm -rf "$L"
