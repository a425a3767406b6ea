#!/usr/bin/env bash
# Session 12, call E (nvidia-h200), the last of the session's device time. Call D's fp8 grid put the new default at
# H16 B64 S4096 q_len 2 (transposed scores + transposed_pv + overlap_wait) at 113.4 us against session 11's plain
# fused 108.9 (different runs; FA3 96.5 vs 93.3). Here a clean A/B at q_len 2 (parity.sweep's transposed_scores=False
# now also turns transposed_pv off: the plain path), bf16 and fp8, then the S = 16384 column of issue #5's H = 16
# q_len 2 rows by the bench (as session 9's call e). Prediction: bf16 tpv 1.02-1.08x faster than plain (call C,
# across two sweeps); fp8 tpv within 3% of plain; the bench's H16 B128 S16384 q2 3.91 -> ~4.0 TB/s.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
S=H16_B64_S4096_q2,H16_B128_S16384_q2
timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields transposed_scores=False --rounds 3 --reps 3 \
  --shapes $S --json "$OUT/sweep-q2-plain.json" > "$L/sweep-q2-plain.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep-q2-plain.log"
timeout 100 python3 -m parity.sweep --impl pallas_mosaic_gpu --fp8 --fields transposed_scores=False --rounds 3 --reps 3 \
  --shapes $S --json "$OUT/sweep-fp8-q2-plain.json" > "$L/sweep-fp8-q2-plain.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep-fp8-q2-plain.log"
timeout 110 python3 -m parity bench --grid mosaic_h16_q2 --shard 2/3 --check --reps 3 --no-ceilings \
  --impls torch.fa3,jax.pallas_mosaic_gpu --json "$OUT/bench-h16-q2-s16384.json" > "$L/bench-q2.log" 2>&1
echo "bench rc=$?" >> "$L/bench-q2.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for f in sweep-q2-plain sweep-fp8-q2-plain; do cut -c1-110 "$L/$f.log" | grep -E " us |rc=" | grep -v slower; done
grep -v "Warning\|warn" "$L/bench-q2.log" | cut -c1-150 | tail -14
rm -rf "$L"
