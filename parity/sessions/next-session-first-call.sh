#!/usr/bin/env bash
# For the next session's first call (nvidia-h200; carry [".fa3"]), written at the end of session 19. Copy to
# parity/sessions/<date>-s20-a.sh and commit before running; never edit it after. About 6 minutes.
# Session 19 timed MosaicConfig(late_row_sums=True) 1.03-1.07x slower at H = 128 although the probes say the row sums
# cost nothing (1.791 us a step with them, 1.797 without). The guess: the sums keep p's values live across P's store
# and the P @ V issue, in a loop ptxas already holds at 255 registers, so it spills inside the unmasked loop.
# 1) ptxas and SASS of the kernel at H128 B64 S4096, the heuristic and late_row_sums (Mosaic GPU's dumps; read here
#    with `python -m parity.mosaic_sass`); 2) the compiled Mosaic tests not yet run on today's code (143-217).
# Predictions: the heuristic 255 registers with its 68-76 bytes of spills (session 17), late_row_sums more spill bytes
# (or local loads inside the unmasked loop); every test passes or skips with its reason.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs" "$OUT/dump-heuristic" "$OUT/dump-late"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
for v in heuristic late; do
  MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$OUT/dump-$v" timeout 100 python3 -c "
import dataclasses
from mla_jax import pallas_mosaic_gpu as mg
from parity import bench
inp = bench.make_inputs(bench.Shape(128, 64, 4096))
md = inp.metadata
tuning = mg.heuristic_config(inp.config, md.num_decode_tokens, md.max_blocks, num_reqs=md.num_reqs,
                             max_query_len=md.max_query_len)
if '$v' == 'late':
    tuning = dataclasses.replace(tuning, late_row_sums=True)
print(tuning)
run, _ = bench._jax_kernel('pallas_mosaic_gpu', tuning)(inp)
run()" > "$L/kernel-$v.log" 2>&1; echo "rc=$?" >> "$L/kernel-$v.log"
done
for v in heuristic late; do echo "== $v"; grep -h "Used\|spill" "$L/kernel-$v.log" "$OUT"/dump-$v/* 2>/dev/null | sort | uniq -c | head -6; done
tar czf "$OUT/dumps.tgz" -C "$OUT" dump-heuristic dump-late && rm -rf "$OUT/dump-heuristic" "$OUT/dump-late"
python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/test_pallas_mosaic_gpu.py 2>/dev/null \
  | grep "::" | sed -n "143,\$p" > "$L/ids.txt"
echo "$(wc -l < "$L/ids.txt") tests, $(head -1 "$L/ids.txt") .. $(tail -1 "$L/ids.txt")"
timeout 330 xargs -d '\n' -a "$L/ids.txt" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
  > "$L/pytest-mosaic.log" 2>&1; echo "rc=$?" >> "$L/pytest-mosaic.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|skipped|^FAILED|^ERROR|rc=" "$L/pytest-mosaic.log" | tail -10
rm -rf "$L"
