"""Shared test setup: the `gpu` marker skips cleanly, with its reason, where no GPU is."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX may share one GPU

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


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
