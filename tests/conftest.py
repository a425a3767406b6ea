"""Shared test setup: the process prepared before JAX starts, and the `gpu` marker skips cleanly, with its reason,
where no GPU is."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX may share one GPU

# With no NVIDIA device (CI), XLA:CPU compiles at LLVM -O0. Each interpret-mode kernel is a large XLA:CPU program
# run once or twice, so compiling dominates: -O0 takes 16% off the Mosaic GPU interpret and property tests (78 ->
# 65 s on 2 workers). On a GPU machine nothing is set, since the flag also lowers XLA:GPU's own LLVM optimisation.
if not os.path.exists("/dev/nvidiactl") and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

from parity._cpu_pool import widen_cpu_pool  # noqa: E402

# Before JAX makes its CPU client: Mosaic GPU's interpreter hangs with fewer than ~3 pool threads (parity/_cpu_pool.py).
widen_cpu_pool()

import pytest  # noqa: E402


def _gpu_reason() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return None
    except ImportError:
        pass
    try:
        import jax

        if jax.default_backend() == "gpu":
            return None
    except ImportError:
        pass
    return "no CUDA GPU visible to torch or JAX"


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
    """After each test module, drop JAX's caches of traced and compiled functions. Every XLA:CPU executable (the
    interpret-mode kernels compile thousands) keeps its own memory mappings; over the whole suite they pass Linux's
    vm.max_map_count (65530) unless released, and an mmap fails inside XLA's compiler: a segmentation fault near the
    suite's end (test_fp8.py alone leaves ~27,000 mappings)."""
    yield
    try:
        import jax
    except ImportError:
        return
    jax.clear_caches()
    import gc

    gc.collect()


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
