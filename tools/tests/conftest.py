"""The tools' tests: the process prepared before JAX starts, as for tests/ (the TMA probe runs in Mosaic GPU's
interpreter, which hangs with fewer than ~3 XLA:CPU pool threads: parity/_cpu_pool.py)."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from parity._cpu_pool import widen_cpu_pool  # noqa: E402

widen_cpu_pool()
