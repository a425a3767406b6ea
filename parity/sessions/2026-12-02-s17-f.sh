#!/usr/bin/env bash
# Session 17, call F (nvidia-h200; carry [".fa3"]). Call E: the SMs took in 9.2 TB/s of TMA bytes in CTA pairs (8.7
# from L2, 4.51 from HBM alone): the intake is no ceiling at the ring's ~4.8. And step_flashmla_1p_ring ran 1.793 us,
# exactly step_flashmla_1p's 1.793, where call D had 2.046 against 1.732: on call E's machine the ring cost nothing.
# Calls C and D also had the kernel slow (144 us at H128 B64 S4096 q1 against session 16's 131.5). One machine's
# picture, twice over (order effects): the memoryless and ring steps, the kernel's step, the clocks.
# Predictions: ring - 1p 0.00-0.05 us on a machine like E's, ~0.3 on one like D's; the kernel 131-145 us.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,pci.bus_id --format=csv \
  > "$L/smi.log" 2>&1
timeout 150 python3 -m parity.wgmma_probe \
  --probes step_flashmla_1p,step_flashmla_1p_ring,stream_pairs_x2,step_flashmla_1p_ring,step_flashmla_1p \
  --json "$OUT/wgmma-probe-ring-2.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields part_wait=True --rounds 3 --reps 3 --cooldown 2 \
  --shapes H128_B64_S4096_q1 --json "$OUT/sweep-part-wait-3.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv >> "$L/smi.log" 2>&1
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$L/smi.log"
grep -v Warn "$L/probe.log" | tail -7
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -5
rm -rf "$L"
