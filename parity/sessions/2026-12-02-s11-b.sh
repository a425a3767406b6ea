#!/usr/bin/env bash
# Session 11, call B (nvidia-h200). Call A: overlap_dequant (warpgroup 0 converting the rope and V's first half
# of step k + 1 under its P @ V, 5 chunks, then 2 more after p_free) only 1.06x faster than the fused default at
# H16 B128/B32 S16384 (prediction 1.4-1.7x); fp8_convert="mixed" 1.01-1.03x slower than cvt. Reading: warpgroup 0's
# conversion (7 chunks a step) is its own issue/latency bound, not the SM's conversion pipe, while warpgroup 1
# waits for P. Now rebalanced: under its P @ V each warpgroup converts part of step k + 1's first V half
# (warpgroup 0 also the rope: 3 chunks, warpgroup 1 2 chunks), then 2 chunks each of the second half after p_free.
# 1. Compiled: the overlap cases, overlap == fused_dequant=False bitwise, bits == mixed == cvt bitwise.
# 2. Sweep, 3 interleaved rounds: heuristic vs overlap_dequant=True, four H = 16 q_len 1 shapes. Prediction:
#    1.15-1.35x at H16 B128 S16384 (2.98 us a step -> 2.2-2.6).
# 3. convert_probe with cvt_wg0 / mixed_wg0 (one warpgroup converting all 9 chunks): if a warpgroup alone takes
#    ~2x as long as two together, the conversion is bound per warpgroup (the reading above).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py \
  -k "(compiled and overlap) or overlap_dequant_is_bitwise or convert_bits_is_bitwise" > "$L/pytest.log" 2>&1
echo "pytest rc=$?" >> "$L/pytest.log"
timeout 200 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields overlap_dequant=True \
  --rounds 3 --reps 3 --shapes H16_B128_S16384_q1,H16_B32_S16384_q1,H16_B8_S4096_q1,H16_B1_S1024_q1 \
  --json "$OUT/sweep-fp8-overlap-b.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
timeout 110 python3 -m parity.convert_probe --methods cvt,copy,cvt_wg0,mixed_wg0 --reps 5 \
  --json "$OUT/convert-probe-wg0.json" > "$L/probe.log" 2>&1; echo "probe rc=$?" >> "$L/probe.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=" "$L/pytest.log" | tail -8
grep -v "Warning\|warn" "$L/probe.log" | tail -7
cut -c1-130 "$L/sweep.log" | grep -v Warning | tail -14
rm -rf "$L"
