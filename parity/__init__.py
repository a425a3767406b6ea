"""parity: cross-checks and benchmarks of paged MLA decode across the torch and JAX stacks (`python -m parity`)."""

# (first: mla_jax's import sets NPROC before the harness's first JAX computation, mla_jax/_cpu_pool.py)
import mla_jax  # noqa: F401
