#!/usr/bin/env bash
# Session 4, call C (nvidia-h200-x2): v7 = the output stage swizzled (call B's ncu report: 8-way bank conflicts
# on the stores of the accumulator to the unswizzled stage). GPU 0: the whole compiled Mosaic suite. GPU 1: A/B
# of v7 against v6 (the committed kernel at 2d80026, copied into a second tree), alternating v7, v6, v7, v6,
# the heuristic's pick beside FA3 on 8 shapes (`parity.sweep --fields none`).
# parity/sessions/ab/pallas_mosaic_gpu_v6.py was `git show 2d80026:mla_jax/pallas_mosaic_gpu.py` (not committed).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
rm -rf /tmp/v6 && mkdir /tmp/v6 && cp -r mla_jax mla_spec mla_torch parity /tmp/v6/ \
  && cp parity/sessions/ab/pallas_mosaic_gpu_v6.py /tmp/v6/mla_jax/pallas_mosaic_gpu.py
SHAPES=H16_B1_S1024_q1,H128_B1_S1024_q1,H128_B8_S1024_q2,H16_B8_S1024_q2,H16_B32_S1024_q1,H128_B32_S4096_q1,H16_B128_S16384_q1,H128_B64_S16384_q1
( export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/fa3:$PWD
  timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
    > "$L/pytest_mosaic_v7.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest_mosaic_v7.log" ) &
( export CUDA_VISIBLE_DEVICES=1
  for r in 1 2; do
    for v in v7 v6; do
      if [ $v = v7 ]; then P=/tmp/fa3:$PWD; else P=/tmp/fa3:/tmp/v6; fi
      PYTHONPATH=$P timeout 90 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 5 --fields none --shapes $SHAPES \
        --json "$OUT/ab-$v-$r.json" > "$L/ab-$v-$r.log" 2>&1; echo "rc=$?" >> "$L/ab-$v-$r.log"
    done
  done ) &
wait
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED" "$L/pytest_mosaic_v7.log" | tail -6
for f in "$L"/ab-*.log; do echo "== $(basename $f)"; grep -E "heuristic|rc=" "$f" | awk '{print $1, $3, $NF}'; done
rm -rf "$L"
