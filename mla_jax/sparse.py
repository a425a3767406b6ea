"""`mla_jax.sparse_mla_decode`: the sparse decode (DeepSeek-V3.2's top-k attention, `mla_spec.sparse`), one entry
point for its implementations.

impl:
  "xla"                jnp reference (`mla_jax.sparse_reference`: runs anywhere, float32 compute), either cache format
  "pallas_triton"      the Pallas Triton kernel (`mla_jax.sparse_triton`): any GPU the Triton lowering takes, both cache
                       formats (the fp8_ds_mla rows decoded in registers); interpret mode (`interpret=True`) on CPU
  "pallas_mosaic_gpu"  the Hopper Mosaic GPU kernel (`mla_jax.pallas_mosaic_gpu.sparse`), both cache formats (the
                       fp8_ds_mla rows dequantized to bf16 in shared memory: `sparse_fp8`, bfloat16 q); interpret
                       mode (`interpret=True`) on CPU

`SparseMetadata` is a pytree here: indices and topk_length are leaves (T and topk are their static shapes), so a
jitted decode compiles once per (T, topk) and takes new indices without recompiling.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mla_spec import MLAConfig, SparseMetadata, dtype_name, validate_sparse_inputs
from mla_spec.config import check_config
from mla_spec.sparse import check_cache_format, check_sparse_metadata
from mla_jax import sparse_reference
from mla_jax.api import (_is_concrete, array_parts, check_device, check_interpret, check_jax_arrays, default_interpret,
                         fits_int32, split_q)

jax.tree_util.register_dataclass(SparseMetadata, data_fields=["indices", "topk_length"], meta_fields=[])

SPARSE_IMPLS = ("xla", "pallas_triton", "pallas_mosaic_gpu")


def to_jax_sparse_metadata(metadata: SparseMetadata, device=None) -> SparseMetadata:
    """The same metadata with int32 jax arrays on `device`."""
    check_sparse_metadata(metadata)

    def put(x):
        return None if x is None else jax.device_put(jnp.asarray(x, dtype=jnp.int32), device)

    return metadata.replace(indices=put(fits_int32("indices", metadata.indices)),
                            topk_length=put(fits_int32("topk_length", metadata.topk_length)))


def _as_int32(x):
    """`x` as an int32 jax array (NumPy, or a jax array of another integer dtype; traced values too)."""
    return None if x is None else jnp.asarray(x, dtype=jnp.int32)


def sparse_unsupported_reason(impl: str, config: MLAConfig, device=None, *, cache_format: str = "auto") -> str | None:
    """Why `impl` cannot run `config` with `cache_format` on `device` (None: it can). The reference runs
    everything."""
    check_config(config)
    check_device(device)
    check_cache_format(cache_format)
    if impl == "xla":
        return None
    if impl == "pallas_triton":
        from mla_jax import sparse_triton

        if (config.kv_lora_rank, config.qk_rope_head_dim) != (sparse_triton.LATENT_DIM, sparse_triton.ROPE_DIM):
            return (f"needs kv_lora_rank={sparse_triton.LATENT_DIM} and qk_rope_head_dim={sparse_triton.ROPE_DIM} "
                    f"(DeepSeek's), got kv_lora_rank={config.kv_lora_rank}, "
                    f"qk_rope_head_dim={config.qk_rope_head_dim}")
        if config.dtype not in ("bfloat16", "float16"):
            return f"dtype must be bfloat16 or float16, got dtype={config.dtype!r}"
        from mla_jax.pallas_triton import unsupported_reason

        # (the device checks of the dense kernel: a GPU, bf16 dots from sm80, fp8 conversions from sm89)
        fp8 = cache_format == "fp8_ds_mla"
        return unsupported_reason(config.replace(kv_cache_dtype="fp8_e4m3" if fp8 else "auto"), device)
    if impl == "pallas_mosaic_gpu":
        if cache_format == "fp8_ds_mla" and config.dtype != "bfloat16":
            # (the dequantized cache runs the wgmmas in bf16: exact for every power-of-two scale; f16 is not)
            return (f"cache_format='fp8_ds_mla' needs dtype='bfloat16' (the cache is dequantized to bfloat16, exact "
                    f"for every scale, and the wgmmas take q in bfloat16), got dtype={config.dtype!r}")
        from mla_jax.pallas_mosaic_gpu.config import unsupported_reason

        reason = unsupported_reason(config.replace(page_size=64), device)  # (any page size: rows by slot)
        return reason
    raise ValueError(f"unknown impl={impl!r}; expected one of {SPARSE_IMPLS}")


def sparse_mla_decode(q, kv_cache, metadata: SparseMetadata, config: MLAConfig, *, impl: str = "xla",
                      cache_format: str = "auto", interpret: bool | None = None):
    """The sparse decode. Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`.

    q: `[T, H, L+R]` or `(q_nope [T,H,L], q_pe [T,H,R])` in config.dtype; kv_cache: `[num_blocks, page_size,
    L+R]` in config.dtype (cache_format "auto") or `uint8 [num_blocks, page_size, 656]` (cache_format
    "fp8_ds_mla"); metadata: `mla_spec.SparseMetadata` of NumPy or JAX integer arrays. Validates shapes and dtypes
    always, the index values when they are concrete (not traced). interpret: (the Pallas impls) a bool, or None (interpret mode where JAX has no GPU, as
    `mla_jax.mla_decode`).
    """
    if impl not in SPARSE_IMPLS:
        raise ValueError(f"unknown impl={impl!r}; expected one of {SPARSE_IMPLS}")
    check_interpret(interpret, allow_none=True)
    if interpret is None:
        interpret = default_interpret()
    check_config(config)
    check_sparse_metadata(metadata)
    parts = array_parts(q, kv_cache)
    check_jax_arrays(indices=metadata.indices, topk_length=metadata.topk_length)
    arrays = [x for x in (metadata.indices, metadata.topk_length) if x is not None]
    validate_sparse_inputs(
        config,
        metadata,
        q_shapes=tuple(tuple(x.shape) for x in parts),
        q_dtypes=tuple(dtype_name(x.dtype) for x in parts),
        kv_cache_shape=tuple(kv_cache.shape),
        kv_cache_dtype=dtype_name(kv_cache.dtype),
        cache_format=cache_format,
        check_values=all(_is_concrete(x) for x in arrays),
    )
    md = metadata.replace(indices=_as_int32(metadata.indices), topk_length=_as_int32(metadata.topk_length))
    q_nope, q_pe = split_q(q, config)
    if impl == "pallas_triton":
        reason = sparse_unsupported_reason(impl, config, cache_format=cache_format)
        if reason is not None:
            raise NotImplementedError(f"impl='pallas_triton' cannot run this problem: {reason}")
        from mla_jax.sparse_triton import sparse_decode as triton_sparse_decode

        q_full = q if not isinstance(q, tuple) else jnp.concatenate([q_nope, q_pe.astype(q_nope.dtype)], axis=-1)
        return triton_sparse_decode(q_full, kv_cache, md.indices, md.topk_length,
                                    softmax_scale=config.softmax_scale, interpret=interpret)
    if impl == "pallas_mosaic_gpu":
        reason = sparse_unsupported_reason(impl, config, cache_format=cache_format)
        if reason is not None:
            raise NotImplementedError(f"impl='pallas_mosaic_gpu' cannot run this problem: {reason}")
        from mla_jax.pallas_mosaic_gpu.sparse import sparse_decode

        q_full = q if not isinstance(q, tuple) else jnp.concatenate([q_nope, q_pe.astype(q_nope.dtype)], axis=-1)
        return sparse_decode(q_full, kv_cache, md, config, cache_format=cache_format, interpret=interpret)
    return sparse_reference.sparse_mla_decode_jit(q_nope, q_pe, kv_cache, md, config, cache_format)
