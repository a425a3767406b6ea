"""parity: cross-checks and benchmarks of paged MLA decode across the torch and JAX stacks (`python -m parity`)."""

from mla_jax._cpu_pool import widen_cpu_pool

widen_cpu_pool()  # (before the harness's first JAX computation: Mosaic GPU's interpreter needs XLA:CPU pool threads)
