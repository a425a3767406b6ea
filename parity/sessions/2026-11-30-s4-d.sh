#!/usr/bin/env bash
# Session 4, call D (nvidia-h200-x2): issue #5's whole grid with v7 (the swizzled output stage), half per GPU,
# joined by `python -m parity merge`; the same command as call B.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for i in 0 1; do
  ( CUDA_VISIBLE_DEVICES=$i timeout 440 python3 -m parity bench --grid mosaic --shard $i/2 \
      --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-shard$i.json" \
      > "$L/bench_shard$i.log" 2>&1; echo "shard $i rc=$?" >> "$L/bench_shard$i.log" ) &
done
wait
python3 -m parity merge "$OUT/grid-shard0.json" "$OUT/grid-shard1.json" --json "$OUT/h200-bench-mosaic-grid.json" \
  --png "$OUT/h200-roofline-mosaic-grid.png" > "$L/merge.log" 2>&1
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -h "rc=" "$L"/bench_shard*.log; grep -h "check FAIL\|error\|Error" "$L"/bench_shard*.log | head -5; cat "$L/merge.log"
rm -rf "$L"
