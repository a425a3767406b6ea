"""jnp reference for paged MLA decode (the "xla" implementation).

`jax.jit`-compatible: every shape is static (T, H, the block table's width), the
per-token request id and position are computed on device from the metadata.
Computes in float32; the gathered KV is dense `[R, max_blocks * page_size, 576]`,
so this is a reference, not a fast path.

FP8 KV cache (kv_cache_dtype="fp8_e4m3"): rows are dequantized as `fp8 value * k_scale`
in float32; `k_scale` is a traced float32 scalar (a new scale does not recompile).

Batch-invariant mode (config.batch_invariant): the dense path reduces over the padded
KV axis (max_blocks * page_size), whose length depends on the longest request of the
batch, and XLA's reductions over it are not bitwise stable when that length changes
(seen on the CPU: a request alone and inside a batch with a wider block table differ
in the last bits). So under batch_invariant each query token runs on its own
(`lax.map`) through fixed-size KV chunks of `BATCH_INVARIANT_KV_CHUNK` positions with
an online softmax, stopping at the last chunk the token attends to: every op has a
shape that depends on neither the batch nor the block table's width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from mla_jax.schedule import searchsorted
from mla_spec import DecodeMetadata, MLAConfig

BATCH_INVARIANT_KV_CHUNK = 128
"""KV positions per step of the batch-invariant path."""


def token_positions(metadata: DecodeMetadata, num_tokens: int):
    """(request id [T], position of the token in its sequence [T]) for each query token."""
    qsl = metadata.query_start_loc
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    req = searchsorted(qsl[1:], t, side="right").astype(jnp.int32)
    q_len = qsl[req + 1] - qsl[req]
    pos = metadata.seq_lens[req] - q_len + (t - qsl[req])
    return req, pos


def _dequantize(rows, config: MLAConfig, k_scale):
    """float32 rows of the cache: `fp8 value * k_scale` for an fp8 cache."""
    rows = rows.astype(jnp.float32)
    if config.is_fp8_kv_cache:
        rows = rows * k_scale
    return rows


def mla_decode(q_nope, q_pe, kv_cache, metadata: DecodeMetadata, config: MLAConfig, k_scale=1.0):
    """Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`.

    k_scale: the fp8 cache's scale (a float32 scalar, validated by mla_jax.api); unused otherwise."""
    k_scale = jnp.asarray(k_scale, jnp.float32)
    if config.batch_invariant:
        out, lse = _mla_decode_batch_invariant(q_nope, q_pe, kv_cache, metadata, config, k_scale)
    else:
        out, lse = _mla_decode_dense(q_nope, q_pe, kv_cache, metadata, config, k_scale)
    return mask_padding(out, lse, metadata) if metadata.padded else (out, lse)


def mask_padding(out, lse, metadata: DecodeMetadata):
    """out 0 and lse -inf on the token rows past query_start_loc[-1] (a padded bucket's rows)."""
    live = jnp.arange(out.shape[0], dtype=jnp.int32) < metadata.query_start_loc[-1]
    return (jnp.where(live[:, None, None], out, jnp.zeros((), out.dtype)),
            jnp.where(live[:, None], lse, -jnp.inf))


def _mla_decode_dense(q_nope, q_pe, kv_cache, metadata: DecodeMetadata, config: MLAConfig, k_scale):
    L, P = config.kv_lora_rank, config.page_size
    T = q_nope.shape[0]
    num_blocks = kv_cache.shape[0]
    bt = jnp.clip(metadata.block_table, 0, num_blocks - 1)  # padding entries are never used
    R, max_blocks = bt.shape
    kv = _dequantize(kv_cache[bt].reshape(R, max_blocks * P, kv_cache.shape[-1]), config, k_scale)
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


def _mla_decode_batch_invariant(q_nope, q_pe, kv_cache, metadata: DecodeMetadata, config: MLAConfig, k_scale):
    """One token at a time, fixed-size KV chunks, online softmax (see the module docstring)."""
    L, P, C = config.kv_lora_rank, config.page_size, BATCH_INVARIANT_KV_CHUNK
    T, H = q_nope.shape[:2]
    num_blocks = kv_cache.shape[0]
    max_blocks = metadata.block_table.shape[1]
    req, pos = token_positions(metadata, T)
    pos = jnp.where(jnp.arange(T) < metadata.query_start_loc[-1], pos, -1)  # padding rows: no KV step
    chunk_iota = jnp.arange(C, dtype=jnp.int32)

    def one_token(args):
        qn, qp, r, p_tok = args  # [H, L] f32, [H, R] f32, request id, position
        bt_row = metadata.block_table[r]

        def step(c, carry):
            acc, m, l = carry
            kv_pos = c * C + chunk_iota
            visible = kv_pos <= p_tok  # < seq_len too: the token's position is inside its sequence
            # Block-table padding past the last page is clamped, then zeroed with the other invisible rows.
            page = jnp.clip(bt_row[jnp.minimum(kv_pos // P, max_blocks - 1)], 0, num_blocks - 1)
            rows = _dequantize(kv_cache[page, kv_pos % P], config, k_scale)  # [C, L+R]
            rows = jnp.where(visible[:, None], rows, 0.0)  # NaN in unused slots must not reach p @ kv_c
            kv_c, k_pe = rows[:, :L], rows[:, L:]
            s = jnp.dot(qn, kv_c.T, precision="highest") + jnp.dot(qp, k_pe.T, precision="highest")
            s = jnp.where(visible[None, :], s * config.softmax_scale, -jnp.inf)  # [H, C]
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))  # finite: chunk 0 always holds position 0
            alpha = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new[:, None])
            l = l * alpha + jnp.sum(p, axis=-1)
            acc = acc * alpha[:, None] + jnp.dot(p, kv_c, precision="highest")
            return acc, m_new, l

        init = (jnp.zeros((H, L), jnp.float32), jnp.full((H,), -jnp.inf, jnp.float32), jnp.zeros((H,), jnp.float32))
        acc, m, l = lax.fori_loop(0, p_tok // C + 1, step, init)
        return acc / l[:, None], m + jnp.log(l)

    out, lse = lax.map(one_token, (q_nope.astype(jnp.float32), q_pe.astype(jnp.float32), req, pos))
    return out.astype(q_nope.dtype), lse


mla_decode_jit = jax.jit(mla_decode, static_argnames=("config",))
