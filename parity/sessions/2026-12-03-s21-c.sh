#!/usr/bin/env bash
# Session 21, call C (nvidia-h200; carry [".fa3"]). Call B: qk_registers ran 1.11-1.12x faster than kv_halves
# (H16 B128 S16384 460.5 against 517.6 us, B32 128.5 against 142.0) but wrong: NaN from request 2 on in both
# compiled scenarios. Its PTX writes the next chunk into the same registers while the wgmma that reads them may still
# run (a wgmma reads its left operand's registers while it runs; undefined by the PTX ISA), and every f16 store from
# the WGMMA layout keeps a dead ldmatrix of its destination (Pallas's swap loads the old value). Now: two chunks an
# iteration with wgmma_wait(1) after each chunk's wgmma (the one before it done: its registers free), and the V copy
# stored by FragmentedArray.store_tiled (no read).
# 1) ptxas and the PTX's ldmatrix / wait counts; 2) the compiled qk_registers tests (incl. bitwise kv_halves);
# 3) the sweep on two rows; 4) the region profile at H16 B128 S4096.
# Predictions: the tests pass; 1.10-1.20x faster than kv_halves (the waits cost a little of call B's 1.12x, the dead
# reads' removal gives some back).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$OUT/dump" timeout 60 python3 -c "
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
grep -h "Used\|spill\|Performance" "$OUT"/dump/*.ptxas 2>/dev/null | sort | uniq -c | head -6
for x in ldmatrix stmatrix wgmma.wait_group ld.shared.b16 ld.shared.b32; do
  echo "$x: $(cat "$OUT"/dump/*.ptx 2>/dev/null | grep -c "$x")"; done
tail -1 "$L/kernel.log"
tar czf "$OUT/dump.tgz" -C "$OUT" dump && rm -rf "$OUT/dump"
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_fp8.py -k qk_registers \
  > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -6
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields qk_registers --rounds 3 --reps 3 \
  --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 \
  --json "$OUT/sweep-fp8-qk-registers.json" > "$L/sweep-fp8.log" 2>&1; echo "rc=$?" >> "$L/sweep-fp8.log"
cut -c1-150 "$L/sweep-fp8.log" | grep -v "^  \|Warn" | tail -6
timeout 90 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 56 --set qk_registers=True \
  --json "$OUT/regions-fp8-qk-registers.json" > "$L/regions.log" 2>&1; echo "rc=$?" >> "$L/regions.log"
grep -v Warn "$L/regions.log" | tail -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
