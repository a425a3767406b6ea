#!/usr/bin/env bash
# Session 42, call d (kind nvidia-h200 without needs_h200, carry [".fa3"]; ~473 s of budget left): the template's part 1
# (parity/sessions/next-session-first-call.sh as of c5fad92: the probe, then the heuristic against pair_ring=False at
# the two 16-row rows) only if the card is an H200: three H100 runs this session (s42-a, -b, -c) already answered the
# H100's question, so on an H100 this exits at once. Predictions as the template's (H200: fp8_pair 4.4-4.7 TB/s against
# fp8_64's 3.5-3.6; 1.05-1.25x). Never edited after its first run.
set -uo pipefail
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
case "$GPU" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0;; esac
bash parity/sessions/next-session-first-call.sh 1
