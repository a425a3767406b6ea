"""The definition of the operation: paged MLA decode in float64 NumPy.

For request r with q_len = query_start_loc[r+1] - query_start_loc[r] and
seq_len = seq_lens[r], query token i sits at position seq_len - q_len + i and
attends to KV positions <= it (bottom-right causal). KV position p lives at
kv_cache[block_table[r, p // page_size], p % page_size] = [kv_c (L) | k_pe (R)].
scores = softmax_scale * (q_nope . kv_c + q_pe . k_pe); out = softmax(scores) @ kv_c;
lse = log(sum(exp(scores))) (natural log), [T, H].

Padding (metadata.padded): requests with q_len 0 and seq_len 0, and the token rows past
query_start_loc[-1], give out 0 and lse -inf (whatever q holds there).

FP8 KV cache (config.kv_cache_dtype="fp8_e4m3"): the cache holds float8_e4m3fn values (any
float array of such values is accepted here) and the rows above are `cache value * k_scale`
(vLLM's per-tensor `k_scale` of the MLA latent cache).

q and kv_cache may have any real float dtype (float16/32/64, bfloat16, float8_*); integer, bool,
complex or object arrays are refused (ValueError naming the dtype) rather than cast.

`sparse_mla_decode` defines the sparse decode (DeepSeek-V3.2's top-k attention, `mla_spec.sparse`): the same
scores, softmax and output, over the slots `metadata.indices` names for each token instead of a causal range.
"""

from __future__ import annotations

import numpy as np

from mla_spec.config import MLAConfig, check_config
from mla_spec.inputs import (
    check_config_and_metadata,
    check_q_pair,
    expected_kv_cache_dtype,
    validate_inputs,
    validate_k_scale,
)
from mla_spec.fp8_sparse import dequantize_sparse_fp8
from mla_spec.metadata import DecodeMetadata
from mla_spec.sparse import SparseMetadata, check_sparse_metadata, validate_sparse_inputs


def _is_real_float(dtype: np.dtype) -> bool:
    """NumPy's floats, or ml_dtypes' (bfloat16, float8_*: kind "V" to NumPy); not complex, int, bool, object."""
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.name.startswith(("bfloat", "float")))


def _float_array(name: str, x) -> np.ndarray:
    """`x` as a NumPy array of a real float dtype; ValueError naming `name` otherwise."""
    if x is None or isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be an array, got {name}={type(x).__name__}")
    try:
        arr = np.asarray(x)
    except ValueError as e:  # a ragged nested list
        raise ValueError(f"{name} must be an array, got a {type(x).__name__} NumPy cannot make one array of: {e}") from e
    if not _is_real_float(arr.dtype):
        raise ValueError(f"{name} must have a float dtype, got {name}.dtype={arr.dtype}")
    return arr


def _q_parts(q) -> tuple:
    """q's parts as float arrays: `(q,)` packed or `(q_nope, q_pe)` (ValueError naming a part that is not)."""
    check_q_pair(q)
    if isinstance(q, tuple):
        return _float_array("q_nope", q[0]), _float_array("q_pe", q[1])
    return (_float_array("q", q),)


def _split_float64(parts, L: int):
    """(q_nope, q_pe) in float64 from `_q_parts`' parts (a packed q split at L)."""
    q_nope, q_pe = parts if len(parts) == 2 else (parts[0][..., :L], parts[0][..., L:])
    return q_nope.astype(np.float64), q_pe.astype(np.float64)


def _softmax(s):
    """(P, lse) of scores s [..., keys]: P normalized over the last axis, lse its natural-log sum (keys at -inf
    are masked; a row with at least one key)."""
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    return p / denom, (m + np.log(denom))[..., 0]


def mla_decode(q, kv_cache: np.ndarray, metadata: DecodeMetadata, config: MLAConfig, *, k_scale=1.0):
    """Returns `(out [T, H, L] float64, lse [T, H] float64)`.

    k_scale: the fp8 cache's scale (finite, > 0, a normal float32); must be 1.0 with kv_cache_dtype="auto"."""
    check_config_and_metadata(config, metadata)
    parts = _q_parts(q)
    shapes = tuple(x.shape for x in parts)
    kv_cache = _float_array("kv_cache", kv_cache)
    # The float64 reference accepts inputs of any float dtype (bf16 or fp8 rounding is
    # done by the caller), so dtypes are checked against themselves only.
    validate_inputs(
        config,
        metadata,
        q_shapes=shapes,
        q_dtypes=(config.dtype,) * len(shapes),
        kv_cache_shape=kv_cache.shape,
        kv_cache_dtype=expected_kv_cache_dtype(config),
    )
    k_scale = validate_k_scale(k_scale, config)
    L = config.kv_lora_rank
    q_nope, q_pe = _split_float64(parts, L)
    T, H = q_nope.shape[:2]
    out = np.zeros((T, H, L), np.float64)
    lse = np.full((T, H), -np.inf, np.float64)  # (rows of no request: padding)
    qsl = np.asarray(metadata.query_start_loc, np.int64)
    seq_lens = np.asarray(metadata.seq_lens, np.int64)
    bt = np.asarray(metadata.block_table, np.int64)
    P = config.page_size
    for r in range(seq_lens.shape[0]):
        start, end, seq_len = int(qsl[r]), int(qsl[r + 1]), int(seq_lens[r])
        q_len = end - start
        if q_len == 0:  # a padding request
            continue
        pos = np.arange(seq_len)
        rows = kv_cache[bt[r, pos // P], pos % P].astype(np.float64)  # [S, L+R], only valid slots
        if config.is_fp8_kv_cache:
            rows = rows * k_scale
        kv_c, k_pe = rows[:, :L], rows[:, L:]
        s = np.einsum("thl,sl->ths", q_nope[start:end], kv_c) + np.einsum("thr,sr->ths", q_pe[start:end], k_pe)
        s *= config.softmax_scale
        q_pos = seq_len - q_len + np.arange(q_len)
        s = np.where(pos[None, None, :] <= q_pos[:, None, None], s, -np.inf)
        p, lse[start:end] = _softmax(s)
        out[start:end] = np.einsum("ths,sl->thl", p, kv_c)
    return out, lse


def sparse_mla_decode(q, kv_cache: np.ndarray, metadata: SparseMetadata, config: MLAConfig, *,
                      cache_format: str = "auto"):
    """Returns `(out [T, H, L] float64, lse [T, H] float64)` of the sparse decode.

    Token t attends to the used entries of `metadata.indices[t]` (the leftmost `topk_length[t]`, or all), each
    entry that is not -1 one key, a slot named twice counted twice: key j is the cache row at global slot
    `indices[t, j]` (`kv_cache[slot // page_size, slot % page_size]`). No causal mask. A token with no key gets
    out 0 and lse -inf. No other slot is read: NaN there never shows.

    kv_cache: `[num_blocks, page_size, 576]` of any real float dtype (cache_format "auto"), or the
    `uint8 [num_blocks, page_size, 656]` fp8 layout (cache_format "fp8_ds_mla", dequantized by
    `mla_spec.fp8_sparse.dequantize_sparse_fp8`)."""
    check_config(config)
    check_sparse_metadata(metadata)
    parts = _q_parts(q)
    shapes = tuple(x.shape for x in parts)
    if cache_format == "fp8_ds_mla":
        kv_cache = np.asarray(kv_cache)
        kv_dtype = kv_cache.dtype.name
    else:
        kv_cache = _float_array("kv_cache", kv_cache)
        kv_dtype = config.dtype  # (any float dtype: the caller rounds, as in mla_decode)
    validate_sparse_inputs(config, metadata, q_shapes=shapes, q_dtypes=(config.dtype,) * len(shapes),
                           kv_cache_shape=kv_cache.shape, kv_cache_dtype=kv_dtype, cache_format=cache_format)
    L = config.kv_lora_rank
    q_nope, q_pe = _split_float64(parts, L)
    T, H = q_nope.shape[:2]
    indices = np.asarray(metadata.indices, np.int64)
    topk = indices.shape[1]
    used = np.ones(indices.shape, bool)
    if metadata.topk_length is not None:
        used = np.arange(topk)[None, :] < np.asarray(metadata.topk_length, np.int64)[:, None]
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    out = np.zeros((T, H, L), np.float64)
    lse = np.full((T, H), -np.inf, np.float64)
    for t in range(T):
        slots = indices[t][used[t] & (indices[t] != -1)]
        if slots.size == 0:
            continue
        rows = flat[slots]
        rows = (dequantize_sparse_fp8(rows) if cache_format == "fp8_ds_mla" else rows).astype(np.float64)
        kv_c, k_pe = rows[:, :L], rows[:, L:]
        s = (q_nope[t] @ kv_c.T + q_pe[t] @ k_pe.T) * config.softmax_scale  # [H, keys]
        p, lse[t] = _softmax(s)
        out[t] = p @ kv_c
    return out, lse
