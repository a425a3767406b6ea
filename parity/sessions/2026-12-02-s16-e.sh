#!/usr/bin/env bash
# Session 16, call E (nvidia-h200; carry [".fa3"]). Written after call D: memoryless steps (us) step_flashmla 1.863,
# step_deferred 1.726, step_three_wg 1.856 against the kernel's 2.08 a step (H128 B64 S4096 q1, 133.1 us, same call;
# the SM clock 1890-1980 MHz in the timed samples, 1980 in the probes'); their result check failed on the GPU (it
# passed interpreted): rtol 1e-3 on row sums of P @ V that cancel, where the GPU's exp2.approx may move an element
# of P one bf16 ulp. The check now allows one ulp an element (expected_step) and prints the error where it fails.
# 1) the step probes again, and step_flashmla_1p (one P buffer: the kernel's default). Predictions: all exact now;
#    step_flashmla_1p 1.86-1.95 (warpgroup 1's half of step i - 1 is done long before P of step i is written).
# 2) parity.sweep --fields p_in_kv=True on three H = 128 rows on today's defaults (heads_fastest): 0.98-1.03x.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m parity.wgmma_probe --probes step_flashmla,step_flashmla_1p,step_deferred,step_three_wg \
  --json "$OUT/wgmma-probe-steps-2.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
timeout 240 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields p_in_kv=True --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1,H128_B64_S16384_q1,H128_B128_S4096_q2 --json "$OUT/sweep-p-in-kv-s16.json" \
  > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -9
grep -v Warn "$L/probe.log" | tail -8
rm -rf "$L"
