#!/usr/bin/env bash
# Session 20, call C (nvidia-h200; carry [".fa3"]). Call A: kv_halves passed its 6 compiled tests but ran 1.07-1.13x
# slower than session 19's fp8 path on four H = 16 rows, and ptxas held it at 255 registers with 820 bytes of spill
# stores. Two likely causes, both fixed since: the 8 V chunks' conversion unrolled (their loads hoisted together) and
# the 17 wgmmas' descriptors hoisted out of the loop (constant addresses; the default path reads its buffer's index
# from info word 4 for that reason). Now a pl.loop over the chunks and the V copy's and P's index from word 4.
# 1) ptxas of the kernel at H16 B128 S16384 fp8; 2) its compiled tests; 3) the sweep, heuristic (kv_halves) against
# kv_halves=False, on two rows. Predictions: < 200 registers' worth of live values, no spills (or a few bytes);
# kv_halves 1.3-1.7x faster than kv_halves=False at B128 S16384 and B32 S16384 if the spills were the cost.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 60 python3 -c "
from mla_jax import pallas_mosaic_gpu as mg
from parity import bench
inp = bench.make_inputs(bench.Shape(16, 128, 16384))
md = inp.metadata
config = inp.config.replace(kv_cache_dtype='fp8_e4m3')
tuning = mg.heuristic_config(config, md.num_decode_tokens, md.max_blocks, num_reqs=md.num_reqs,
                             max_query_len=md.max_query_len)
print(tuning)
run, _ = bench._jax_kernel('pallas_mosaic_gpu', tuning, fp8=True)(inp)
run()" > "$L/kernel.log" 2>&1; echo "rc=$?" >> "$L/kernel.log"
grep -h "Used\|spill" "$L/kernel.log" "$OUT"/dump/* 2>/dev/null | sort | uniq -c | head -6; tail -1 "$L/kernel.log"
tar czf "$OUT/dump.tgz" -C "$OUT" dump && rm -rf "$OUT/dump"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields kv_halves --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 \
  --json "$OUT/sweep-fp8-kv-halves.json" > "$L/sweep-fp8.log" 2>&1; echo "rc=$?" >> "$L/sweep-fp8.log"
cut -c1-150 "$L/sweep-fp8.log" | grep -v "^  \|Warn" | tail -6
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_fp8.py -k kv_halves \
  > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -6
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
