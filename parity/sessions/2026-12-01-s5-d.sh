#!/usr/bin/env bash
# Session 5, call D (nvidia-h200, one GPU). Call C's timeline: traced, the Mosaic loop at H128 B64 S16384 ran
# 523.6 us/call of device span (FA3 516.5), while every untraced launch of it in call B took 593-640 us/call
# (FA3 513-536): tracing made the JAX loop ~11% faster, not FA3. Suspect: XLA's command buffers (CUDA graphs
# of the loop's thunks), which XLA may leave out while profiling. The same shapes, the heuristic's pick,
# (1) bench timing and (2) the timeline (host time now the median of 3 warm launches), each with XLA's
# default flags and with command buffers off (--xla_gpu_enable_command_buffer=).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT/logs"; L="$OUT/logs"
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
S=H128_B64_S16384_q1,H16_B32_S16384_q1,H128_B8_S16384_q1,H16_B1_S1024_q1,H128_B1_S1024_q1
for tag in default nocb; do
  if [ $tag = default ]; then F=""; else F="--xla_gpu_enable_command_buffer="; fi
  XLA_FLAGS="$F" timeout 110 python3 -m parity.timeline --shapes $S --json "$OUT/h200-timeline-$tag.json" \
    > "$L/timeline_$tag.log" 2>&1; echo "timeline $tag rc=$?" >> "$L/timeline_$tag.log"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
for tag in default nocb; do echo "== $tag"; grep -E "^H|rc=" "$L/timeline_$tag.log" | cut -c1-140; done
rm -rf "$L"
