#!/usr/bin/env bash
# Session 30, call D (nvidia-h200; carry [".fa3"]), ~4 minutes. NOT RUN: two tries got no machine (~90 s of the device
# time each, which left too little for a cold start); the next session's first call (next-session-first-call.sh) runs
# the whole fp8 grid instead. Written as: the heuristic now takes load_ahead with pv_registers (call C: 1.10-1.13x, bitwise); its lowered kernels are the ones
# call C compiled and tested (parity.kernel_hash against HEAD's with load_ahead=True: the same modules). The two
# memory-bound 16-row rows of the fp8 grid side by side: FA3 (bf16), bf16 Mosaic, fp8 Mosaic, each checked against FA3.
# Predictions: fp8 H16 B128 S16384 335-350 us against bf16 ~560 (1.6-1.7x), B32 S16384 95-100 against ~150-155
# (1.5-1.6x), H16 B64 S4096 q2 76-80 against ~89 (1.1-1.2x); the check passes (the fp8 gap to FA3's bf16 as before).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m parity bench --grid fp8 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1 --check \
  --reps 3 --no-ceilings --impls torch.fa3,jax.pallas_mosaic_gpu,jax.pallas_mosaic_gpu.fp8 \
  --json "$OUT/bench-fp8-memory-rows.json" > "$L/bench.log" 2>&1
echo "bench rc=$?"; grep -v Warn "$L/bench.log" | tail -25 | cut -c1-160
# then, if time is left: load_ahead without pv_registers (the scores' chunks only, beside V's f16 copies), bitwise
timeout 80 python3 -m pytest -q -x -m gpu tests/test_fp8.py -k "load_ahead_is_bitwise" > "$L/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$L/tests.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
