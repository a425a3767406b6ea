#!/usr/bin/env bash
# Session 5, call B (nvidia-h200: only the one-GPU machine was lent, so everything runs in turn).
# 1. MosaicConfig(pdl=True) (griddepcontrol.wait + launch_dependents at the kernel's start; CPU-checked:
#    lowering) under XLA_FLAGS=--xla_gpu_enable_pdl=true: its compiled tests, then its A/B in interleaved
#    rounds (parity.sweep --rounds 3) on small shapes, where launches matter; then the same A/B without
#    the flag on two shapes (does the Mosaic runtime launch with PDL regardless?).
# 2. Where the Mosaic spread comes from (2026-12-01-s5-b-spread.py).
# 3. transposed_scores' A/B again, in interleaved rounds (call A's single pass was inside the spread).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
XLA_FLAGS=--xla_gpu_enable_pdl=true timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
  tests/test_pallas_mosaic_gpu.py -k "pdl" > "$L/pytest_pdl.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_pdl.log"
XLA_FLAGS=--xla_gpu_enable_pdl=true timeout 120 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 5 --rounds 3 \
  --fields pdl --shapes H16_B1_S1024_q1,H128_B1_S1024_q1,H128_B8_S1024_q2,H16_B32_S1024_q1 \
  --json "$OUT/h200-sweep-mosaic-pdl.json" > "$L/sweep_pdl.log" 2>&1; echo "rc=$?" >> "$L/sweep_pdl.log"
timeout 60 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 5 --rounds 3 \
  --fields pdl --shapes H16_B1_S1024_q1,H128_B1_S1024_q1 \
  --json "$OUT/h200-sweep-mosaic-pdl-noflag.json" > "$L/sweep_pdl_noflag.log" 2>&1; echo "rc=$?" >> "$L/sweep_pdl_noflag.log"
timeout 100 python3 parity/sessions/2026-12-01-s5-b-spread.py H16_B32_S1024_q1,H128_B64_S16384_q1 \
  > "$L/spread.log" 2>&1; echo "spread rc=$?" >> "$L/spread.log"
timeout 150 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 5 --rounds 3 --fields transposed_scores \
  --shapes H16_B32_S16384_q1,H16_B8_S4096_q1,H16_B32_S4096_q1,H16_B128_S16384_q1 \
  --json "$OUT/h200-sweep-mosaic-tscores-rounds.json" > "$L/sweep_tscores.log" 2>&1; echo "rc=$?" >> "$L/sweep_tscores.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|rc=" "$L/pytest_pdl.log" | tail -4
grep -E "^H|rc=" "$L/sweep_pdl.log" "$L/sweep_pdl_noflag.log" "$L/sweep_tscores.log" | sed 's/^[^:]*logs\///'
cut -c1-90 "$L/spread.log" | tail -25
rm -rf "$L"
