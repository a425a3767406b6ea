#!/usr/bin/env bash
# Session 18 call D (nvidia-h200, the machine still warm from call C; carry [".fa3"]): call C's `python -m parity`
# ran past its 130 s. This is the command as it was given to the device (written into this file after the call):
# the main job with a longer limit. It printed 142 passed, 0 failed, 12 skipped, 4 known limitations in 157.2 s.
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 && timeout 420 python3 -m parity --json $OUT/parity-main.json > $OUT/parity-main.log 2>&1; echo rc=$?; grep -v Warn $OUT/parity-main.log | tail -25 | cut -c1-200
