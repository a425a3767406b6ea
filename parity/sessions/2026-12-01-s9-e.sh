#!/usr/bin/env bash
# Session 9, call E (nvidia-h200, the last ~6 minutes): s9-d's q_len 2 grid stopped at its 170 s limit after
# 10 of 15 shapes, before the large B x S rows. Its S = 16384 column (--shard 2/3: B 1, 8, 32, 64, 128).
# Prediction as in s9-d: B64/B128 S16384 ~3.85-3.95 TB/s, FA3/Mosaic ~0.97-1.0.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 170 python3 -m parity bench --grid mosaic_h16_q2 --shard 2/3 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu --json "$OUT/bench-h16-q2-s16384.json" > "$OUT/bench-q2.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench-q2.log"
grep -v "Warning\|warn" "$OUT/bench-q2.log" | cut -c1-170 | tail -16
