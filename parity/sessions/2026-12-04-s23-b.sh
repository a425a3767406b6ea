#!/usr/bin/env bash
# Session 23, call B (nvidia-h200; carry [".fa3"]). Call A: all but 3 of the 69 compiled fp8 tests passed in its
# 400 s (the 3 not reached: bitwise tests run in sessions 21-22), none failed; pv_in_flight's ptxas: C7514, "wgmma
# serialized ... non wgmma instructions reading accumulator registers" (177 registers, no spills); the heuristic
# 411.6 us at H16 B128 S16384 fp8.
# New: MosaicConfig(qk_permuted=True) (opt-in): kv_halves's fp8 chunks loaded by ldmatrix in the WGMMA_8BIT layout
# (2 ldmatrix.x4 a 64 x 64 chunk instead of 16 ld.shared.b16, half the wavefronts), converted, V's copy stored in that
# layout (st.shared.v2.b32), and the same registers handed to the scores' wgmma as WGMMA-layout registers, columns
# permuted within 16 (q permuted to match in the wrapper).
# 1) ptxas + PTX op counts of the heuristic and of qk_permuted at H16 B128 S16384; 2) the compiled qk_permuted tests
# and the heuristic's H = 16 picks; 3) sweep heuristic against qk_permuted on three rows; 4) region profile of
# qk_permuted at H16 B128 S4096.
# Predictions: <= 210 registers, no spills; tests pass; qk_permuted 1.02-1.08x faster (B128 S16384 411 -> 380-403 us);
# its dequant region 2.85 -> 2.5-2.8 us.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 80 python3 -c "
import dataclasses
from mla_jax import pallas_mosaic_gpu as mg
from parity import bench
inp = bench.make_inputs(bench.Shape(16, 128, 16384))
md = inp.metadata
config = inp.config.replace(kv_cache_dtype='fp8_e4m3')
tuning = mg.heuristic_config(config, md.num_decode_tokens, md.max_blocks, num_reqs=md.num_reqs,
                             max_query_len=md.max_query_len)
for t in (tuning, dataclasses.replace(tuning, qk_permuted=True)):
    print(t)
    run, _ = bench._jax_kernel('pallas_mosaic_gpu', t, fp8=True)(inp)
    run()" > "$L/kernel.log" 2>&1; echo "rc=$?" >> "$L/kernel.log"
grep -h "Used\|spill\|C7514" "$OUT"/dump/*.ptxas 2>/dev/null | cut -c1-160 | sort | uniq -c | head -6
for f in "$OUT"/dump/*.ptx; do echo "$(basename $f): ldmatrix $(grep -c ldmatrix $f) ld.shared.b16 $(grep -c 'ld.shared.b16' $f) ld.shared.b32 $(grep -c 'ld.shared.b32' $f) stmatrix $(grep -c stmatrix $f) st.shared.v2 $(grep -c 'st.shared.v2' $f) cvt.e4m3 $(grep -c 'e4m3x2' $f) bar.sync $(grep -c 'bar.sync' $f)"; done
tail -1 "$L/kernel.log"
rm -f "$OUT"/dump/*.mlir-passes.log; tar czf "$OUT/dump.tgz" -C "$OUT" dump && rm -rf "$OUT/dump"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "qk_permuted or (compiled and (decode_mixed_lengths-bfloat16 or heads_128_spec-bfloat16))" > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -8
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields qk_permuted=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1 \
  --json "$OUT/sweep-fp8-qk-permuted.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -8
timeout 80 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 56 --set qk_permuted=True \
  --json "$OUT/regions-fp8-qk-permuted.json" > "$L/regions.log" 2>&1; echo "rc=$?" >> "$L/regions.log"
grep -v Warn "$L/regions.log" | tail -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
