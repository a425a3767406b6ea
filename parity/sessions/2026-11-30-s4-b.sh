#!/usr/bin/env bash
# Session 4, call B (nvidia-h200-x2): issue #5's whole grid with the defaults after call A (v6: the restructured
# flashmla schedule + the combine kernel), half per GPU, joined by `python -m parity merge`. Then GPU 0: the split
# count around the cost model's pick on small shapes; GPU 1: a full ncu report of the Mosaic kernel and the kernel
# list of FA3 at H128 B8 S1024 q2 (kernel 22 us + combine 7.6 us in call A, FA3 29 us in all).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
LIST="ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum"
for i in 0 1; do
  ( export CUDA_VISIBLE_DEVICES=$i
    timeout 400 python3 -m parity bench --grid mosaic --shard $i/2 \
      --impls torch.fa3,jax.pallas_mosaic_gpu --check --reps 3 --json "$OUT/grid-shard$i.json" \
      > "$L/bench_shard$i.log" 2>&1; echo "shard $i rc=$?" >> "$L/bench_shard$i.log"
    if [ $i = 0 ]; then
      timeout 110 python3 -m parity.sweep --impl pallas_mosaic_gpu --reps 3 --fields num_splits \
        --shapes H128_B8_S1024_q2,H16_B8_S1024_q2,H16_B32_S1024_q1,H128_B8_S1024_q1,H128_B1_S16384_q1 \
        --json "$OUT/h200-sweep-mosaic-splits-v6.json" > "$L/sweep.log" 2>&1; echo "sweep rc=$?" >> "$L/sweep.log"
    else
      timeout 70 ncu --clock-control none --profile-from-start off --set full --kernel-name regex:mosaic \
        -o "$L/mosaic_full" python3 -m parity.profile --impl jax.pallas_mosaic_gpu --shape H128_B8_S1024_q2 \
        > "$L/ncu_full.log" 2>&1
      ncu -i "$L/mosaic_full.ncu-rep" --page details > "$L/mosaic_full_details.txt" 2>&1
      ncu -i "$L/mosaic_full.ncu-rep" --page source --csv --print-source sass > "$L/mosaic_full_sass.csv" 2>&1
      rm -f "$L/mosaic_full.ncu-rep"
      for s in H128_B8_S1024_q2 H16_B8_S1024_q2; do
        timeout 30 $LIST python3 -m parity.profile --impl torch.fa3 --shape $s > "$L/list_fa3_$s.txt" 2>&1
      done
    fi ) &
done
wait
python3 -m parity merge "$OUT/grid-shard0.json" "$OUT/grid-shard1.json" --json "$OUT/h200-bench-mosaic-grid.json" \
  --png "$OUT/h200-roofline-mosaic-grid.png" > "$L/merge.log" 2>&1
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -h "rc=" "$L"/bench_shard*.log; grep -h "check FAIL\|error\|Error" "$L"/bench_shard*.log | head -5; cat "$L/merge.log"
tail -8 "$L/sweep.log"
for f in "$L"/list_*.txt; do echo "== $(basename $f)"; grep -E "^\s+[a-zA-Z_].*\(|gpu__time_duration" "$f" | paste - - | awk '{print $1, $(NF)}' | head -12; done
grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput" "$L/mosaic_full_details.txt" | head -8
rm -rf "$L"
