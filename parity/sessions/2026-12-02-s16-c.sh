#!/usr/bin/env bash
# Session 16, call C (nvidia-h200; carry [".fa3"]). Written after call B: three warpgroups' matmuls side by side
# (qk+pv+pv) take 1.33 us a 64-key step (qk alone 0.73, pv+pv 0.665), against the kernel's ~2.1-2.2: the tensor
# cores would allow ~1.6x. schedule="three_wg" is 1.05-1.10x slower than the default now (1.30x in session 4). With
# two 72 KiB stages no schedule can run the scores of step k + 1 before the P @ V of step k is done without losing
# the load's lead; a block_kv = 32 ring of four stages could. This call measures what that would rest on:
# the 32-key matmuls (every buffer with a 64-byte swizzle: wgmma wants one swizzle for both operands, and a [64, 32]
# P needs 64 bytes), and the softmax's cost on warpgroup 0's chain (qk_sm: the scores then the kernel's online
# softmax and P's store). Predictions, us per 64 keys: qk32 0.85-0.95 (qk 0.73); qk_sm 1.05-1.25; qk32_sm 1.2-1.5;
# pv32+pv32 0.70-0.80 (pv+pv 0.665); qk32+pv32+pv32 1.45-1.60 (qk+pv+pv 1.33); qk_sm+pv+pv 1.35-1.60.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
timeout 200 python3 -m parity.wgmma_probe \
  --probes qk,qk32,qk_sm,qk32_sm,pv+pv,pv32+pv32,qk+pv+pv,qk32+pv32+pv32,qk_sm+pv+pv,qk32_sm+pv32+pv32 \
  --json "$OUT/wgmma-probe-32-keys.json" > "$L/probe.log" 2>&1; echo "rc=$?" >> "$L/probe.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
grep -v Warn "$L/probe.log" | tail -13
rm -rf "$L"
