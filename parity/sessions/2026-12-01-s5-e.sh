#!/usr/bin/env bash
# Session 5, call E (nvidia-h200, one GPU): the bench's new method (the slope between launches of N and 2N calls;
# each row also keeps t(N)/N, the old method, as seconds_launch). Call D's timeline showed the JAX loop's
# launches carrying 0.1-0.7 ms outside the kernels' device span (H16 B32 S16384: 176.8 us/call host, 152.6 us
# span; FA3 154.4 / 154.5). The headline shapes with FA3, FlashMLA and Mosaic, then a quarter of issue #5's
# grid (shard 0/4), both with --check.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 150 python3 -m parity bench --grid headline --impls torch.fa3,torch.flashmla,jax.pallas_mosaic_gpu --check --reps 5 \
  --json "$OUT/h200-bench-headline-v8.json" > "$L/headline.log" 2>&1; echo "headline rc=$?" >> "$L/headline.log"
timeout 170 python3 -m parity bench --grid mosaic --shard 0/4 --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 \
  --no-ceilings --json "$OUT/h200-bench-mosaic-grid-v8-shard0of4.json" > "$L/grid.log" 2>&1; echo "grid rc=$?" >> "$L/grid.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "^H|rc=|geomean|FAIL" "$L/headline.log" | cut -c1-150; tail -6 "$L/headline.log"
grep -E "^H|rc=|FAIL" "$L/grid.log" | cut -c1-150; tail -4 "$L/grid.log"
rm -rf "$L"
