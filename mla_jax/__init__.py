"""mla_jax: paged MLA decode in JAX; Pallas GPU kernels beside a jnp reference, the cache write
(`mla_jax.kv_cache`: vLLM's `concat_and_cache_mla`, one scatter into the donated cache), and the sparse decode
(DeepSeek-V3.2's top-k attention, `mla_jax.sparse`: the jnp reference, the Triton kernel and the Hopper kernel).

    kv_cache = mla_jax.write_kv(kv_cache, kv_c, k_pe, slot_mapping, config)
    out, lse = mla_jax.mla_decode(q, kv_cache, metadata, config, impl="pallas_triton")
    out, lse = mla_jax.sparse_mla_decode(q, kv_cache, sparse_metadata, config, cache_format="fp8_ds_mla")
"""

# Pallas imports its fuser lazily, inside the first kernel's trace, and the fuser registers a config flag that is
# part of jax.jit's trace context: the first jitted decode of a process would then miss the cache on its next call
# and compile twice. Importing it here keeps the context fixed, so a loop compiles exactly once per bucket.
import jax.experimental.pallas.fuser  # noqa: F401,E402

from mla_jax.api import IMPLS, default_interpret, mla_decode, select_impl, split_q, to_jax_metadata, unsupported_reason
from mla_jax.dcp import dcp_mla_decode, merge_partials
from mla_jax.kv_cache import quantize_fp8, write_kv
from mla_jax.sparse import SPARSE_IMPLS, sparse_mla_decode, sparse_unsupported_reason, to_jax_sparse_metadata

__all__ = [
    "IMPLS",
    "SPARSE_IMPLS",
    "dcp_mla_decode",
    "default_interpret",
    "merge_partials",
    "mla_decode",
    "quantize_fp8",
    "select_impl",
    "sparse_mla_decode",
    "sparse_unsupported_reason",
    "split_q",
    "to_jax_metadata",
    "to_jax_sparse_metadata",
    "unsupported_reason",
    "write_kv",
]
