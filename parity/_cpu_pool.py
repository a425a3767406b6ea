"""XLA:CPU's thread pool, made wide enough for Mosaic GPU's interpreter before JAX creates its CPU client.

Mosaic GPU's interpreter (interpret mode: pallas_mosaic_gpu on a machine without a GPU) runs a CTA's warpgroups on
Python threads, each executing its own XLA:CPU computation, and a warpgroup that waits at a barrier blocks inside a host
callback on a thread of the CPU client's pool. XLA sizes that pool by the NPROC environment variable, else by the CPUs
the process may use. With one usable CPU (or NPROC=1) the interpreted kernel hangs: the waiting warpgroup holds the
pool's only thread, and the warpgroup it waits for is never scheduled. With two it hangs about one `python -m parity`
run in 74. With NPROC=8 on one CPU it does not hang.

The library leaves the environment alone; the processes that run the interpreter widen the pool themselves, before
their first JAX computation: `python -m parity` (its `main`) and the tests (tests/conftest.py).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import MutableMapping

INTERPRET_MIN_THREADS = 8  # the pool's threads asked for where fewer CPUs are usable


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (no sched_getaffinity: not Linux)
        return os.cpu_count() or 1


def cpu_client_made() -> bool:
    """Whether JAX has made its backends already, with the CPU its default (where the Pallas kernels run interpreted).
    Asks a private API of JAX 0.11 (False where it is gone)."""
    try:
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized():
            return False
    except (ImportError, AttributeError):
        return False
    import jax

    return jax.default_backend() == "cpu"


def widen_cpu_pool(environ: MutableMapping[str, str] = os.environ, cpus: int | None = None) -> str | None:
    """Sets NPROC to INTERPRET_MIN_THREADS where it is unset and fewer CPUs are usable; returns the value set, or None
    where it set nothing (NPROC already set, by the user or earlier; or enough CPUs). XLA reads NPROC when JAX makes its
    CPU client (at the first computation): where that happened already, it warns instead of hanging later."""
    if "NPROC" in environ:
        return None
    cpus = usable_cpus() if cpus is None else cpus
    if cpus >= INTERPRET_MIN_THREADS:
        return None
    environ["NPROC"] = str(INTERPRET_MIN_THREADS)
    if cpu_client_made():
        warnings.warn(f"JAX made its CPU client before XLA:CPU's pool was widened, with a thread pool sized by the "
                      f"{cpus} usable CPU(s): Mosaic GPU's interpreter (pallas_mosaic_gpu in interpret mode) may hang "
                      f"there, a warpgroup's barrier wait holding a pool thread that another warpgroup needs. Widen it "
                      f"before any JAX computation, or set NPROC={INTERPRET_MIN_THREADS} before starting Python.",
                      RuntimeWarning, stacklevel=2)
    return environ["NPROC"]
