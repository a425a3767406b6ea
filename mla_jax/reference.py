"""jnp reference for paged MLA decode (the "xla" implementation).

`jax.jit`-compatible: every shape is static (T, H, the block table's width), the
per-token request id and position are computed on device from the metadata.
Computes in float32; the gathered KV is dense `[R, max_blocks * page_size, 576]`,
so this is a reference, not a fast path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mla_spec import DecodeMetadata, MLAConfig


def token_positions(metadata: DecodeMetadata, num_tokens: int):
    """(request id [T], position of the token in its sequence [T]) for each query token."""
    qsl = metadata.query_start_loc
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    req = jnp.searchsorted(qsl[1:], t, side="right").astype(jnp.int32)
    q_len = qsl[req + 1] - qsl[req]
    pos = metadata.seq_lens[req] - q_len + (t - qsl[req])
    return req, pos


def mla_decode(q_nope, q_pe, kv_cache, metadata: DecodeMetadata, config: MLAConfig):
    """Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`."""
    L, P = config.kv_lora_rank, config.page_size
    T = q_nope.shape[0]
    num_blocks = kv_cache.shape[0]
    bt = jnp.clip(metadata.block_table, 0, num_blocks - 1)  # padding entries are never used
    R, max_blocks = bt.shape
    kv = kv_cache[bt].reshape(R, max_blocks * P, kv_cache.shape[-1]).astype(jnp.float32)
    s_idx = jnp.arange(max_blocks * P, dtype=jnp.int32)
    # Zero the slots past seq_len: NaN garbage there must not reach p @ kv_c (0 * NaN = NaN).
    valid = s_idx[None, :] < metadata.seq_lens[:, None]
    kv = jnp.where(valid[..., None], kv, 0.0)
    req, pos = token_positions(metadata, T)
    kv_t = kv[req]  # [T, S, L+R]
    s = jnp.einsum("thl,tsl->ths", q_nope.astype(jnp.float32), kv_t[..., :L], precision="highest")
    s += jnp.einsum("thr,tsr->ths", q_pe.astype(jnp.float32), kv_t[..., L:], precision="highest")
    s *= config.softmax_scale
    mask = s_idx[None, None, :] <= pos[:, None, None]
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("ths,tsl->thl", p / denom, kv_t[..., :L], precision="highest")
    lse = (m + jnp.log(denom))[..., 0]
    return out.astype(q_nope.dtype), lse


mla_decode_jit = jax.jit(mla_decode, static_argnames=("config",))
