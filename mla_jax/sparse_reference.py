"""jnp reference for the sparse decode (`mla_spec.sparse`): the "reference" impl of `mla_jax.sparse_mla_decode`.

`jax.jit`-compatible (every shape static: T, topk, the cache's): each token's `topk` rows are gathered at once
(`[T, topk, 576]` float32, a reference, not a fast path), entries that are -1 or past `topk_length` read slot 0 and
are zeroed and masked out, so NaN in a slot no used entry names never shows. Float32 compute.

An fp8_ds_mla cache (`uint8 [num_blocks, page_size, 656]`) is dequantized after the gather by
`dequantize_sparse_fp8`, the `mla_spec.fp8_sparse` layout in jnp (bitcasts: float8_e4m3fn values, little-endian
float32 scales and bfloat16 rope values, as XLA reads bytes on the CPU and the GPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from mla_spec import MLAConfig, SparseMetadata
from mla_spec.fp8_sparse import NOPE_DIM, NUM_TILES, ROPE_DIM, ROPE_OFFSET, SCALES_OFFSET, TILE_SIZE


def dequantize_sparse_fp8(cache):
    """`uint8 [..., 656]` rows of the fp8_ds_mla layout -> float32 `[..., 576]` (`fp8 value * tile scale`, then the
    bfloat16 rope values), as `mla_spec.fp8_sparse.dequantize_sparse_fp8`."""
    lead = cache.shape[:-1]
    nope = lax.bitcast_convert_type(cache[..., :SCALES_OFFSET], jnp.float8_e4m3fn).astype(jnp.float32)
    scales = lax.bitcast_convert_type(cache[..., SCALES_OFFSET:ROPE_OFFSET].reshape(*lead, NUM_TILES, 4), jnp.float32)
    rope = lax.bitcast_convert_type(cache[..., ROPE_OFFSET:].reshape(*lead, ROPE_DIM, 2), jnp.bfloat16)
    nope = (nope.reshape(*lead, NUM_TILES, TILE_SIZE) * scales[..., None]).reshape(*lead, NOPE_DIM)
    return jnp.concatenate([nope, rope.astype(jnp.float32)], axis=-1)


def used_entries(metadata: SparseMetadata):
    """bool `[T, topk]`: the entries a token attends to (not -1, and left of its topk_length)."""
    indices = metadata.indices
    used = indices != -1
    if metadata.topk_length is not None:
        used &= jnp.arange(indices.shape[1], dtype=jnp.int32)[None, :] < metadata.topk_length[:, None]
    return used


def sparse_mla_decode(q_nope, q_pe, kv_cache, metadata: SparseMetadata, config: MLAConfig,
                      cache_format: str = "auto"):
    """Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`; the inputs are validated by the caller
    (`mla_jax.sparse_mla_decode`)."""
    L = config.kv_lora_rank
    used = used_entries(metadata)
    slots = jnp.where(used, metadata.indices, 0)
    rows = kv_cache.reshape(-1, kv_cache.shape[-1])[slots]  # [T, topk, W]
    rows = dequantize_sparse_fp8(rows) if cache_format == "fp8_ds_mla" else rows.astype(jnp.float32)
    rows = jnp.where(used[..., None], rows, 0.0)  # NaN in slot 0 stays out
    kv_c, k_pe = rows[..., :L], rows[..., L:]
    s = jnp.einsum("thl,tkl->thk", q_nope.astype(jnp.float32), kv_c, precision="highest")
    s += jnp.einsum("thr,tkr->thk", q_pe.astype(jnp.float32), k_pe, precision="highest")
    s = jnp.where(used[:, None, :], s * config.softmax_scale, -jnp.inf)
    any_used = used.any(axis=-1)[:, None]  # [T, 1]
    m = jnp.where(any_used, jnp.max(s, axis=-1), 0.0)  # (a NaN score stays NaN: it must show)
    p = jnp.exp(s - m[..., None])
    denom = jnp.sum(p, axis=-1)
    out = jnp.einsum("thk,tkl->thl", p / denom[..., None], kv_c, precision="highest")
    out = jnp.where(any_used[..., None], out, 0.0)
    lse = jnp.where(any_used, m + jnp.log(denom), -jnp.inf)
    return out.astype(q_nope.dtype), lse


sparse_mla_decode_jit = jax.jit(sparse_mla_decode, static_argnames=("config", "cache_format"))
