#!/usr/bin/env bash
# Session 13, call B (nvidia-h200). Call A's old/new pair was confounded: the old tree (.old = 3f9c7f5) had no
# mla_torch, so its sweep ran without FA3 ("no FA3"), while HEAD's ran FA3 first in the same process; old 676/670 us,
# new 696/700 (H16 B128 S16384 fp8, same tuning). The traced kernels (make_jaxpr on the CPU) differ only in
# warpgroup 0's order of two arrives (deq_ready, kv_consumed). Here, all without FA3 (no /tmp/fa3 on the path):
# .old, .head (= git archive HEAD) and .swap (the working tree: HEAD with warpgroup 0's old order: kv_consumed first),
# alternating twice, then HEAD with FA3 beside it (as call A). Prediction: if the order costs, .head ~1.03-1.04x
# slower than .old and .swap equal to .old; if it is FA3's presence, all three equal and the last
# slower. Carry [".fa3", ".old", ".head", ".swap"].
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
ROOT=$PWD S=H16_B128_S16384_q1,H16_B32_S16384_q1
sweep() {  # tree-dir tag pythonpath extra-args...
  local dir=$1 tag=$2 pp=$3; shift 3
  (cd "$dir" && PYTHONPATH=$pp timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields none \
    --reps 3 --shapes $S --json "$OUT/$tag.json" "$@" > "$L/$tag.log" 2>&1; echo "$tag rc=$?" >> "$L/$tag.log")
}
NEW="--set overlap_wait=False,transposed_pv=False"
for r in 1 2; do
  sweep "$ROOT/.old" old-$r "$ROOT/.old"
  sweep "$ROOT/.head" head-$r "$ROOT/.head" $NEW
  sweep "$ROOT/.swap" swap-$r "$ROOT/.swap" $NEW
done
sweep "$ROOT/.head" head-fa3 "/tmp/fa3:$ROOT/.head:$ROOT" $NEW   # mla_torch from the checkout, .head's packages first
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for f in old-1 head-1 swap-1 old-2 head-2 swap-2 head-fa3; do echo "== $f"; cut -c1-110 "$L/$f.log" | grep -E " us |rc=|FA3" | grep -v "^  "; done
rm -rf "$L"
