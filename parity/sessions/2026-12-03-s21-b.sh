#!/usr/bin/env bash
# Session 21, call B (nvidia-h200; carry [".fa3"]). Call A's region profile of kv_halves (H16 B128 S4096 fp8): a
# warpgroup's step ~5.1-5.6 us, of which dequant 2.8-3.1 us, qk 1.0-1.4, pv 0.9-1.1, kv_wait 0.1-0.3. Counted in
# shared memory's wavefronts (128 bytes a cycle), a pair of steps (one a warpgroup) moves ~4700: the TMAs' fp8 (576),
# the conversion's reads (576) and f16 writes (1024), the scores' reads of V's copy and q (1280), P @ V's (1280); at
# ~1.8 GHz ~2.6 us of the ~4.1 us a pair takes at B128 S16384. New: MosaicConfig(qk_registers=True) hands each
# converted chunk to its scores' wgmma from registers (no read of V's copy: -1024 wavefronts a pair).
# 1) ptxas of qk_registers at H16 B128 S16384 (registers, spills, wgmma serialization); 2) the sweep, heuristic
# (kv_halves) against qk_registers=True on three rows; 3) the compiled tests of qk_registers (incl. bitwise
# kv_halves); 4) its region profile at H16 B128 S4096.
# Predictions: <= 230 registers, no spills; 1.10-1.25x faster at B128 / B32 S16384 (the scores' smem reads gone,
# dequant's wait on the other warpgroup's wgmma reads shorter); bitwise kv_halves; its dequant region (now with
# the scores' issue) ~2.5-3 us, qk (the wait) < 0.3 us.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 60 python3 -c "
import dataclasses
from mla_jax import pallas_mosaic_gpu as mg
from parity import bench
inp = bench.make_inputs(bench.Shape(16, 128, 16384))
md = inp.metadata
config = inp.config.replace(kv_cache_dtype='fp8_e4m3')
tuning = mg.heuristic_config(config, md.num_decode_tokens, md.max_blocks, num_reqs=md.num_reqs,
                             max_query_len=md.max_query_len)
tuning = dataclasses.replace(tuning, qk_registers=True)
print(tuning)
run, _ = bench._jax_kernel('pallas_mosaic_gpu', tuning, fp8=True)(inp)
run()" > "$L/kernel.log" 2>&1; echo "rc=$?" >> "$L/kernel.log"
grep -h "Used\|spill\|wgmma\|Performance" "$L/kernel.log" "$OUT"/dump/* 2>/dev/null | cut -c1-200 | sort | uniq -c | head -8
tail -1 "$L/kernel.log"
tar czf "$OUT/dump.tgz" -C "$OUT" dump && rm -rf "$OUT/dump"
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields qk_registers --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1 \
  --json "$OUT/sweep-fp8-qk-registers.json" > "$L/sweep-fp8.log" 2>&1; echo "rc=$?" >> "$L/sweep-fp8.log"
cut -c1-150 "$L/sweep-fp8.log" | grep -v "^  \|Warn" | tail -8
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_fp8.py -k qk_registers \
  > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -6
timeout 90 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 56 --set qk_registers=True \
  --json "$OUT/regions-fp8-qk-registers.json" > "$L/regions.log" 2>&1; echo "rc=$?" >> "$L/regions.log"
grep -v Warn "$L/regions.log" | tail -14
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
