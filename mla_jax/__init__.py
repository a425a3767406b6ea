"""mla_jax: paged MLA decode in JAX; Pallas GPU kernels beside a jnp reference.

    out, lse = mla_jax.mla_decode(q, kv_cache, metadata, config, impl="pallas_triton")
"""

from mla_jax.api import IMPLS, default_interpret, mla_decode, select_impl, split_q, to_jax_metadata, unsupported_reason

__all__ = [
    "IMPLS",
    "default_interpret",
    "mla_decode",
    "select_impl",
    "split_q",
    "to_jax_metadata",
    "unsupported_reason",
]
