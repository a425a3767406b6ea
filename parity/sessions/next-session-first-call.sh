#!/usr/bin/env bash
# For the next session's first call (nvidia-h200; no FA3). Written at the end of session 17. Copy it to
# parity/sessions/<date>-s18-a.sh before running; never edit it after.
# Session 17: the kernel (H128 B64 S4096 q1) runs its loop ~0.25-0.3 us a step slower than the ring probe's same
# chain (parity.wgmma_probe step_flashmla_1p_ring, 1.77-1.85 us), and ptxas puts it at 255 registers with 68 bytes
# of spill stores against the probe's 194 and none. Which of the kernel's static features hold the registers?
# ptxas of the kernel on several configurations (compile and one call each, no timing): the heuristic at H = 128
# (q_len 1 and 2), with num_splits 2 (the split partials' epilogue), page 16 (4 TMAs a step), p_in_kv, and at
# H = 16. Prediction: all at 255 with spills (the loop's carry and the masked / unmasked copies, not one feature).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MOSAIC_GPU_DUMP_PTXAS=1
run() {  # name heads batch seq q_len page overrides
  mkdir -p "$OUT/dump-$1"
  MOSAIC_GPU_DUMP_TO="$OUT/dump-$1" timeout 60 python3 -c "
from parity import bench, sweep
from parity.bench import Shape
inp = bench.make_inputs(Shape($2, $3, $4, $5, page_size=$6))
run, _ = bench._jax_kernel('pallas_mosaic_gpu', overrides=sweep.parse_overrides('$7') or None)(inp)
run()" > "$OUT/$1.log" 2>&1
  echo "$1: $(grep -h 'Used' "$OUT"/dump-$1/*.ptxas | sort -u | tr '\n' ' ') $(grep -h 'spill stores' "$OUT"/dump-$1/*.ptxas | sort -u | head -1)"
}
run h128_q1 128 64 4096 1 64 ""
run h128_q2 128 64 4096 2 64 ""
run h128_splits2 128 64 4096 1 64 "num_splits=2"
run h128_p_in_kv 128 64 4096 1 64 "p_in_kv=True"
run h128_page16 128 64 4096 1 16 ""
run h16_q1 16 64 4096 1 64 ""
tar czf "$OUT/dumps.tgz" -C "$OUT" $(cd "$OUT" && ls -d dump-*) && rm -rf "$OUT"/dump-*
