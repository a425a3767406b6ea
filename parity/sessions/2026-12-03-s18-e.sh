#!/usr/bin/env bash
# Session 18 call E (nvidia-h200, warm; carry [".fa3"]): the GPU tests of the FA3 path, the combine, batch-invariant
# mode and the fp8 cache, in the device time left. The command as given to the device (written here after the
# call). It printed 94 passed, 248 deselected in 314.31 s.
bash .fa3/unpack.sh /tmp/fa3 >/dev/null && export PYTHONPATH=/tmp/fa3:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 && timeout 320 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_fa3.py tests/test_combine.py tests/test_batch_invariant.py tests/test_fp8.py > $OUT/pytest-rest.log 2>&1; echo rc=$?; grep -E "passed|failed|^FAILED|^ERROR" $OUT/pytest-rest.log | tail -8; tail -c 300 $OUT/pytest-rest.log
