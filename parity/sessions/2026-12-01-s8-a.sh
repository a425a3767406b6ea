#!/usr/bin/env bash
# Session 8, call a (nvidia-h200): the first-call plan written at the end of session 7, run as is.
# (Session 5's plan that stood here, the whole grid with --trace, ran as 2026-12-01-s7-a.sh.)
# 1. The fp8 dequantization's 4-values-a-thread layout (MosaicConfig(dequant_layout="wgmma_8bit"), CPU-checked:
#    interpret mode, CUDA lowering): its compiled tests, then an A/B against the default layout on the fp8 grid's
#    shapes in three interleaved rounds. Prediction (parity/NOTES_pallas_mosaic_gpu.md, session 7): the
#    dequantization ~1.5 -> ~1.0 us a step, fp8 from ~0.75x to ~0.85-0.9x of bf16 at H = 16.
# 2. The region profiles (python -m parity.regions, new in session 7, CPU-tested on a synthetic trace) of the
#    seesaw (why it is 1.23-1.38x slower: each warpgroup's kv_wait) and of p_in_kv at H = 128, and of the fp8 path
#    with both dequant layouts at H = 16.
# 3. If the candidate is faster everywhere: the fp8 grid again with it (bench --grid fp8), before making it the default.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "mosaic_gpu_fp8_compiled" \
  > "$L/pytest_fp8.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_fp8.log"
timeout 300 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields dequant_layout=wgmma_8bit --rounds 3 \
  --reps 3 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B64_S4096_q2,H128_B64_S16384_q1,H16_B1_S1024_q1 \
  --json "$OUT/sweep-fp8-dequant-layout.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
timeout 120 python3 -m parity.regions --shapes H128_B32_S4096_q2,H128_B64_S16384_q1 --set schedule=seesaw \
  --json "$OUT/regions-seesaw.json" > "$L/regions.log" 2>&1; echo "regions seesaw rc=$?" >> "$L/regions.log"
timeout 80 python3 -m parity.regions --shapes H128_B32_S4096_q2 --set p_in_kv=True \
  --json "$OUT/regions-p-in-kv.json" >> "$L/regions.log" 2>&1; echo "regions p_in_kv rc=$?" >> "$L/regions.log"
for lay in wgmma wgmma_8bit; do
  timeout 80 python3 -m parity.regions --fp8 --shapes H16_B128_S4096_q1 --set dequant_layout=$lay --space 1024 \
    --json "$OUT/regions-fp8-$lay.json" >> "$L/regions.log" 2>&1; echo "regions fp8 $lay rc=$?" >> "$L/regions.log"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_fp8.log" | tail -5
cut -c1-160 "$L/sweep.log" | tail -18
cat "$L/regions.log" | grep -v Warning | cut -c1-160 | tail -60
rm -rf "$L"
