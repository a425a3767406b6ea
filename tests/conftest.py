"""Shared test setup: the `gpu` marker skips cleanly, with its reason, where no GPU is."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX may share one GPU

import mla_jax  # noqa: F401,E402  (first: its import sets NPROC before any JAX computation, mla_jax/_cpu_pool.py)

import pytest


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
    interpret-mode kernels compile thousands) keeps its own memory mappings; over the whole suite they passed Linux's
    vm.max_map_count (65530) and an mmap failed inside XLA's compiler: a segmentation fault near the suite's end
    (session 27; test_fp8.py alone leaves ~27,000 mappings)."""
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
