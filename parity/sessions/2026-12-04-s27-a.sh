#!/usr/bin/env bash
# Session 27, call A (nvidia-h200; carry [".fa3"]), from next-session-first-call.sh (session 26). About 6-8 minutes.
# Adds: the compiled kv_halves / pv_copy tests, to check review commit 1fe99e1 (pv_from_copy; no behaviour change meant).
# Session 26: kv_halves at 32 rows (pv_registers, pv_wait 1; the heuristic's pick where a split has >= 32 steps) was
# 1.20x faster than the one-chain path at H32 B64 S4096 q1 (107.0 -> 89.1 us) but 1.06x at H16 B64 S4096 q2 (107.6 ->
# 101.7), the same tiles (64 CTAs x 2 splits of 32 steps): why is not known.
# 0) the compiled test of kv_halves at 32 rows with four tokens a tile (H = 8 at q_len 4; added after session 26's
# device time: interpret mode and the lowering only); 1) the region profile of both (the heuristic); 2) the same at
# H16 B128 S16384 q2 (256 steps a split, 1.58x).
# Predictions: the tests pass; the per-step regions (dequant, pv, kv_wait) alike at the two B64 shapes; the q2 row's difference in
# its masked last step or the tile's tail (the merge, O^T's transpose), ~10 us of its 102.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_fp8.py -k "compiled and (heads_8_q4 or kv_halves or pv_copy or pv_registers)" \
  > "$L/tests.log" 2>&1
echo "rc=$?" >> "$L/tests.log"; grep -E "passed|failed|^FAILED|^ERROR|Mismatch|rc=" "$L/tests.log" | cut -c1-200 | tail -4
for s in H16_B64_S4096_q2 H32_B64_S4096_q1 H16_B128_S16384_q2; do
  timeout 90 python3 -m parity.regions --fp8 --shapes $s --space 56 --json "$OUT/regions-$s.json" \
    > "$L/regions-$s.log" 2>&1; echo "rc=$?" >> "$L/regions-$s.log"
  grep -v "Warn" "$L/regions-$s.log" | cut -c1-150 | tail -14
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
