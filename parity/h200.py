"""An abstract H200 to lower kernels for on any machine (no GPU): the Pallas Triton and Mosaic GPU kernels, the split
combine, for the lowering tests, `parity.triton_sass` and `parity.smem`."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def abstract_h200():
    """JAX lowers for an H200 (132 SMs) inside this context, without one: Pallas Triton's lowering asks the device."""
    import jax

    h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=h200)):
        yield


def lower_for_h200(fn, *args):
    """jax.jit(fn) traced on args and lowered for CUDA on an abstract H200 (a jax.stages.Lowered)."""
    import jax

    with abstract_h200():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
