#!/usr/bin/env bash
# Session 17, call H (nvidia-h200; no FA3). Call G: normal operands change nothing (step_flashmla_1p 1.72-1.86 us on
# integers and normal values alike, the ring 1.85 / 1.91; the SM clock 1965-1980 MHz throughout); the kernel 142.5 us
# (2.23 us a step). The kernel's loop is ~0.3 us a step slower than the ring probe, which has the same chain. ptxas
# on both (registers, spills; the kernel was at 255 registers with 24-56 bytes of spills in earlier sessions) and
# their SASS, to compare the loops offline.
# Prediction: the kernel at 255 registers with spills, the probe well under (no spills).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/dump-probe" "$OUT/dump-kernel"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1
MOSAIC_GPU_DUMP_TO="$OUT/dump-probe" timeout 100 python3 -m parity.wgmma_probe --probes step_flashmla_1p_ring \
  --iters 200,400 > "$OUT/probe.log" 2>&1; echo "rc=$?" >> "$OUT/probe.log"
MOSAIC_GPU_DUMP_TO="$OUT/dump-kernel" timeout 100 python3 -c "
from parity import bench
run, _ = bench.RUNNERS['jax.pallas_mosaic_gpu'](bench.make_inputs(bench.Shape(128, 64, 4096)))
run()" > "$OUT/kernel.log" 2>&1; echo "rc=$?" >> "$OUT/kernel.log"
for d in probe kernel; do echo "== $d"; grep -h "Used\|spill" "$OUT/$d.log" "$OUT"/dump-$d/* 2>/dev/null | sort | uniq -c | head -6; done
ls "$OUT"/dump-probe "$OUT"/dump-kernel | head -20
tar czf "$OUT/dumps.tgz" -C "$OUT" dump-probe dump-kernel && rm -rf "$OUT/dump-probe" "$OUT/dump-kernel"
