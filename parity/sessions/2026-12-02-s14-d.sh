#!/usr/bin/env bash
# Session 14, call D (nvidia-h200; carry [".fa3"]). Never edit after running.
# MosaicConfig(kv_multicast=True), new this session (CPU: lowers for CUDA; interpret bitwise equal to the default
# grid, the interpreter's cluster barriers included, but its TMAs ignore the multicast): a request's two head tiles
# run as one 2-CTA cluster, each CTA loading half of every KV step and multicasting it to both; a slot is refilled
# once both CTAs released it (cluster barrier). The heuristic now picks heads_fastest at H = 128 (call A: 1.06-1.11x).
# 1) the compiled grid-variant tests (heads_fastest, kv_multicast, both; pages 16 / 64 / 128). Prediction: pass; a
#    wrong multicast split shows as a mismatch (half of each step's rows missing), a wrong barrier count as a hang.
# 2) parity.sweep --fields kv_multicast=True, 3 rounds, 2 s idle before each timing, on call A's 5 rows.
#    Prediction: with the KV read once, H128 B64 S16384 q1 from 563 us (heads_fastest) toward the compute bound
#    (session 4's best 494 us): ~500-530 us, 1.06-1.12x; B128 rows alike; B8 S16384 (split, one wave) ~1.05x.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs tests/test_pallas_mosaic_gpu.py \
  -k "TestGPU and grid_variant" > "$L/pytest.log" 2>&1; echo "pytest rc=$?" >> "$L/pytest.log"
timeout 330 python3 -m parity.sweep --impl pallas_mosaic_gpu --fields kv_multicast=True --rounds 3 --reps 3 \
  --cooldown 2 --shapes H128_B128_S16384_q1,H128_B64_S16384_q2,H128_B128_S4096_q2,H128_B64_S16384_q1,H128_B8_S16384_q1 \
  --json "$OUT/sweep-kv-multicast.json" > "$L/sweep.log" 2>&1; echo "rc=$?" >> "$L/sweep.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -E "passed|failed|^FAILED|^ERROR|rc=|Error" "$L/pytest.log" | tail -8
cut -c1-150 "$L/sweep.log" | grep -v "^  \|Warn" | tail -16
rm -rf "$L"
