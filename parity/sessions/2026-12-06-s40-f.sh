#!/usr/bin/env bash
# Session 40, call f (nvidia-h200 with needs_h200, carry [".fa3"]): s40-e (no start) cut to the probe alone, for the
# ~370 s of budget left (a start is ~160 s): the fp8 ring's box rows on the H200's HBM. Predictions (s40-a's header):
# fp8_64 3.5-3.6 TB/s, fp8_pair 4.4-4.7 (as bf16_128), fp8_flat as fp8_pair.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 80 python3 -m parity.tma_probe --probes fp8_64_x4,fp8_pair_x4,fp8_pair_x2,fp8_flat_x4,bf16_128_x2 \
  --json "$OUT/tma-probe-pair.json" > "$L/tma.log" 2>&1
echo "tma_probe rc=$?"; grep -v Warn "$L/tma.log" | tail -6
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
