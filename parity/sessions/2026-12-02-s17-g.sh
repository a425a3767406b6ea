#!/usr/bin/env bash
# Session 17, call G (nvidia-h200; carry [".fa3"]). Call F (call E's machine, warm): step_flashmla_1p 1.782 / 1.824 us,
# _ring 1.821 / 1.812 (the ring costs <= 0.04 us there), stream_pairs_x2 8.3 TB/s of intake; the kernel 141.6 us at
# H128 B64 S4096 q1 = 2.21 us a step: ~0.4 us a step over the ring probe, which lacks the block table, the masks, the
# tile's prologue and epilogue, and real data: the probes' operands are small integers (-1, 0, 1), the kernel's
# normal values. The tensor cores' power, and so the clock under a power or current limit, depends on the operands'
# bits. New: wgmma_probe --random (normal q and K, rounded to bf16; the step probes' check holds: CPU-tested).
# The same probes on integers and on normal values in one call, the SM clock and power sampled every 100 ms, and the
# kernel's step.
# Predictions: random 1p / ring 1.9-2.2 us (if the data's power is the kernel's gap, ~2.2: the kernel's own); clock
# below 1980 MHz during the random probes if so.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 100 \
  > "$OUT/smi.csv" 2>&1 &
SMI=$!
for v in integers random; do
  flag=$([ $v = random ] && echo --random || true)
  echo "=== $v $(date +%T.%N)" >> "$L/probe.log"
  timeout 120 python3 -m parity.wgmma_probe $flag --probes step_flashmla_1p,step_flashmla_1p_ring,step_flashmla_1p \
    --json "$OUT/wgmma-probe-$v.json" >> "$L/probe.log" 2>&1; echo "rc=$? $(date +%T.%N)" >> "$L/probe.log"
done
echo "=== kernel $(date +%T.%N)" >> "$L/probe.log"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields part_wait=True --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1 --json "$OUT/sweep-part-wait-4.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
kill $SMI
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | grep -E "===|step_|rc="
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -4
rm -rf "$L"
