#!/usr/bin/env bash
# Session 22 call A (nvidia-h200; carry [".fa3"]), copied from next-session-first-call.sh written at the end of
# session 21; committed before running, never edited after. About 7-8 minutes.
# Session 21 made qk_registers (with kv_halves) the fp8 heuristic's pick at 16 rows: H16 B128 S16384 427.5 us (FA3
# bf16 618.0), a step 1.67 us a warpgroup pair against the bytes' 1.14. Its region profile (H16 B128 S4096): a
# warpgroup's own step ~4.5 us, conversion + scores' issue 2.8, TMA wait of its one slot 0.5-0.8, P @ V 0.9-1.2.
# Two opt-ins built at the end of session 21, interpret / race / lowering tested, never compiled on a GPU:
#   upcast_loads: the fp8 chunks loaded 4 bytes a thread (WGMMA_UPCAST_2X, relaid by a shuffle) instead of 2;
#   part_refill: each warpgroup's slot in two parts ([0, 256), [256, 576)), part 0 refilled before part 1 is awaited.
# 1) their compiled tests (test_fp8.py: the MOSAIC_FP8_CASES with them, bitwise qk_registers for upcast_loads);
# 2) the sweep: heuristic (qk_registers) against each, 3 rounds, on three rows; then both together on two rows;
# 3) part_refill's region profile; 4) the two Mosaic tests session 21's call E did not reach.
# Predictions: the tests pass; upcast_loads 1.00-1.06x faster (half the conversion's load instructions); part_refill
# 1.05-1.15x faster at B128 / B32 S16384 (its kv_wait 0.5-0.8 us -> < 0.2 of a ~3.3 us own step), about equal at B8
# S4096; both together the product.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "upcast_loads or part_refill or qk_registers" > "$L/tests.log" 2>&1; echo "rc=$?" >> "$L/tests.log"
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/tests.log" | tail -8
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields upcast_loads=True,part_refill=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1 \
  --json "$OUT/sweep-fp8-opt-ins.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -10
timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --set upcast_loads=True --fields part_refill=True \
  --rounds 3 --reps 3 --cooldown 1 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 \
  --json "$OUT/sweep-fp8-both.json" > "$L/sweep-both.log" 2>&1; echo "rc=$?" >> "$L/sweep-both.log"
cut -c1-150 "$L/sweep-both.log" | grep -v "^  \|Warn" | tail -6
timeout 80 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --space 56 --set part_refill=True \
  --json "$OUT/regions-fp8-part-refill.json" > "$L/regions.log" 2>&1; echo "rc=$?" >> "$L/regions.log"
grep -v Warn "$L/regions.log" | tail -12
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
  "tests/test_pallas_mosaic_gpu.py::TestGPU::test_deterministic[split_ring]" \
  "tests/test_pallas_mosaic_gpu.py::TestGPU::test_deterministic[part_wait]" > "$L/mosaic.log" 2>&1
echo "rc=$?" >> "$L/mosaic.log"; grep -E "passed|failed|rc=" "$L/mosaic.log" | tail -3
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
