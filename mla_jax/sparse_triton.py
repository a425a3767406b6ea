"""Sparse MLA decode (DeepSeek-V3.2 DSA top-k) as a Pallas kernel with the Triton lowering.

Each query token t attends the cache rows its indexer picked, not a causal range:

    rows    = kv_cache.reshape(-1, 576)                  (slot = block * page_size + offset)
    used    = {j < topk_length[t] : indices[t, j] >= 0}
    s[h, j] = softmax_scale * q[t, h] . rows[indices[t, j]]                    (576 columns)
    out[t, h] = sum_{j in used} softmax_j(s[h]) rows[indices[t, j], :512]   lse[t, h] = logsumexp_j s[h, j]

A slot named twice in a row counts twice (as in a block table of one-token pages). A token with no used entry
gets out 0 and lse -inf. out is in q's dtype, lse float32 (natural log).

Work layout: grid (token, head block, split). A program takes one token's q rows for `block_h` heads (M = block_h
rows of the dots; heads past num_heads are padding, read as 0 and never stored) and walks its share of the token's
topk entries, `block_k` indices a step:

    load the step's indices -> valid = in range of [lo, min(hi, topk_length[t])) and 0 <= idx < num_slots
    gather the valid rows (the load itself is masked: an unused slot is never read, so NaN there cannot
        reach p @ v, where 0 * NaN would be NaN)
    s = scale * (q_nope @ kv_c.T + q_pe @ k_pe.T)  [M, block_k] float32, -inf where not valid
    online softmax in log2 units (exp2), acc += p @ kv_c

The loop bound is dynamic: a token with topk_length below topk runs only the steps its length reaches. All M
rows share each gathered row (the point of MLA decode: one row read serves every head of the block). The 512
latent and 64 rope columns are loaded and multiplied apart, since the Triton lowering only takes power-of-two
array sizes.

Splits (num_splits > 1): the topk entries are cut into num_splits ranges of whole block_k steps, each program
writes its range's partial (out normalized over the range, float32, and its lse; -inf for a range without a used
entry) and mla_jax.combine merges the partials by LSE. It serves small batches, where T x head blocks programs
leave most SMs idle (one token of 128 heads: 2 programs for 132 SMs on the H200).

Indices and topk_length are traced: new values reuse the compiled call; the tuning and softmax_scale are static.
An index outside [0, num_slots) is skipped like -1 (the values are not validated here: a bad traced value gives a
wrong answer, never an out-of-bounds read); topk_length is clamped to [0, topk].

The fp8 cache ("656-byte" rows, FlashMLA's DeepSeek-V3.2 layout, uint8 [num_blocks, page_size, 656]): bytes
[0, 512) the latent as float8_e4m3fn, [512, 528) four little-endian float32 scales (scale i for latent values
[128 i, 128 i + 128)), [528, 656) the 64 rope values as little-endian bfloat16. The kernel takes the uint8 cache
as it is (a reshape to [num_slots, 656], which XLA makes a bitcast) and decodes the rows it gathers in registers:
the latent in four tiles of 128 bytes, each bitcast to float8_e4m3fn, converted to float32 and multiplied by its
tile's scale; the 16 scale bytes in one load, assembled into four float32 (shifts, ors, a bitcast); the rope's
128 bytes in one load, paired into bfloat16 bit patterns. The dequantized tiles are rounded to q's dtype for the
dots: exact for FlashMLA's power-of-two scales with a bfloat16 q (an e4m3 value times a power of two is a
bfloat16 value), and with an fp16 q wherever the product is in fp16's normal range; the rope's bfloat16 values
round to fp16 the same way.

No copy of the cache: a view of the buffer in another dtype would be a bitcast_convert_type, and in front of a
kernel (a custom call) XLA writes it out as a new array of the whole cache, every call. Between element widths
(float32 scales, bfloat16 rope) XLA's BitcastDtypesExpander, a pass of the CPU and GPU pipelines, turns it into
shifts and ors; on XLA:CPU even the same-width uint8 -> float8_e4m3fn view is such a fusion, and only the reshape
is a bitcast (tests/test_sparse_triton.py::test_only_the_reshape_view_is_free). So the kernel reads the bytes.
JAX's Triton lowering computes a gather's offsets in int32 for arrays of at most 2**32 bytes, which overflows
for a 1-byte array past 2**31 bytes: a compiled call refuses a uint8 cache of 2**31 to 2**32 bytes
(NotImplementedError; larger caches get 64-bit offsets).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from mla_jax import combine
from mla_jax.pallas_triton import (
    _LN2, _LOG2E, _NEG_BIG, FP8_GPU_MAX_ROWS, MAX_ROWS, NUM_SMS_H200, _cdiv, _is_pow2, _next_pow2,
)
from mla_spec.fp8_sparse import BYTES_PER_TOKEN, NUM_TILES, ROPE_OFFSET, SCALES_OFFSET, TILE_SIZE

LATENT_DIM = 512
"""Latent (nope-absorbed) columns of q and of a cache row: DeepSeek's kv_lora_rank."""
ROPE_DIM = 64
"""Rope columns of q and of a cache row."""
HEAD_DIM = LATENT_DIM + ROPE_DIM

MIN_STEPS_PER_SPLIT = 4
"""The heuristic's least block_k steps in one split: each split writes an M x 512 float32 partial that the merge
reads back, which a range of fewer steps would not pay for."""

_Q_DTYPES = ("bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class SparseTritonConfig:
    """Tuning of the sparse Pallas Triton kernel (static under jit).

    block_h: query heads per program, the M rows of the dots (power of two >= 16, Triton's dot; heads past
        num_heads are masked).
    block_k: topk entries gathered per step (power of two >= 16, Triton's dot).
    num_splits: ranges the topk entries are cut into, a program each (>= 1); more than one writes float32
        partials that mla_jax.combine merges by LSE.
    num_warps, num_stages: Triton compiler parameters.
    """

    block_h: int = 16
    block_k: int = 64
    num_splits: int = 1
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_h", "block_k"):
            value = getattr(self, name)
            if not _is_pow2(value) or value < 16:
                raise ValueError(f"{name} must be a power of two >= 16 (Triton's dot), got {name}={value!r}")
        for name in ("num_splits", "num_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")
        num_warps = self.num_warps
        if isinstance(num_warps, bool) or num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got num_warps={num_warps!r}")


def _is_fp8_layout(dtype) -> bool:
    return jnp.dtype(dtype) == jnp.uint8


def sparse_heuristic(num_heads: int, topk: int, num_tokens: int, dtype, *,
                     num_sms: int = NUM_SMS_H200) -> SparseTritonConfig:
    """Picks a SparseTritonConfig from the problem shape; `dtype` is the cache's (uint8: the fp8 656-byte layout).

    The tile values are the dense kernel's (mla_jax.pallas_triton.heuristic_config, swept on the H200) for the same
    M, as a starting point: a sparse step gathers block_k rows of 1152 bytes (656 in fp8) one by one, as the dense
    kernel does with pages of one row. They are not measured for the sparse kernel.

    - block_h: all heads up to 64 (num_heads rounded up to a power of two, at least 16); up to 32 with the fp8
      cache (the dense kernel's fp8 tiles of 64 rows x 64 exceed the H200's shared memory).
    - block_k: 128 at M = 16, else 64 (the dense kernel's block_kv); no more than topk rounded up to a power of
      two (at least 16), so a short topk loads no all-masked rows.
    - num_warps / num_stages: M = 16: 4 / 2; M = 32: 4 / 3; M = 64: 8 / 2; 8 warps with the fp8 cache (the
      dequantized tile and the accumulator spill at 4 in the dense kernel).
    - num_splits: programs up to one an SM: num_sms // (num_tokens x head blocks), at most topk's steps /
      MIN_STEPS_PER_SPLIT, at least 1.
    """
    fp8 = _is_fp8_layout(dtype)
    max_rows = FP8_GPU_MAX_ROWS if fp8 else MAX_ROWS
    block_h = min(max(_next_pow2(num_heads), 16), max_rows)
    block_k = min(128 if block_h <= 16 else 64, max(16, _next_pow2(topk)))
    num_warps = 4 if block_h <= 32 and not fp8 else 8
    num_stages = 3 if block_h == 32 else 2
    programs = max(1, num_tokens) * _cdiv(num_heads, block_h)
    max_splits = max(1, _cdiv(topk, block_k) // MIN_STEPS_PER_SPLIT)
    num_splits = max(1, min(num_sms // programs, max_splits))
    return SparseTritonConfig(block_h=block_h, block_k=block_k, num_splits=num_splits, num_warps=num_warps,
                              num_stages=num_stages)


def _load_rows_bf16(kv_ref, row, valid, kv_dtype):
    """The gathered rows of a bf16/fp16 cache [num_slots, 576]: ((kv_c [block_k, 512],), k_pe [block_k, 64]).
    Rows not valid are not read (0)."""
    del kv_dtype
    col_l = lax.broadcasted_iota(jnp.int32, (1, LATENT_DIM), 1)
    col_r = lax.broadcasted_iota(jnp.int32, (1, ROPE_DIM), 1)
    kv_c = plgpu_triton.load(kv_ref.at[row[:, None], col_l], mask=valid[:, None], other=0)
    k_pe = plgpu_triton.load(kv_ref.at[row[:, None], LATENT_DIM + col_r], mask=valid[:, None], other=0)
    return (kv_c,), k_pe


def _load_bytes(kv_ref, row, valid, col):
    """Bytes `col` (int32, broadcast against row[:, None]) of the gathered uint8 rows, as int32 (0-255); rows not
    valid are not read (0)."""
    return plgpu_triton.load(kv_ref.at[row[:, None], col], mask=valid[:, None], other=0).astype(jnp.int32)


def _split_last(x, parts: int):
    """x [..., n] -> `parts` arrays [..., n // parts], part b holding columns b, b + parts, b + 2 parts, ... (a
    reshape and lax.split, which the Triton lowering takes for a power-of-two `parts`)."""
    *lead, n = x.shape
    return [y.reshape(*lead, n // parts) for y in lax.split(x.reshape(*lead, n // parts, parts), (1,) * parts,
                                                            axis=len(lead) + 1)]


def _load_rows_fp8(kv_ref, row, valid, kv_dtype):
    """The gathered rows of the fp8 656-byte cache [num_slots, 656] uint8, dequantized in registers to kv_dtype:
    (4 kv_c tiles [block_k, 128], k_pe [block_k, 64]). Rows not valid are not read (every byte 0: value 0)."""
    # The 4 float32 scales from their 16 little-endian bytes: byte b of every scale, shifted into place.
    scale_bytes = _load_bytes(kv_ref, row, valid, SCALES_OFFSET + lax.broadcasted_iota(jnp.int32, (1, 16), 1))
    scale_bits = functools.reduce(lax.bitwise_or, [lax.shift_left(byte, jnp.int32(8 * b))
                                                   for b, byte in enumerate(_split_last(scale_bytes, 4))])
    scales = _split_last(lax.bitcast_convert_type(scale_bits, jnp.float32), NUM_TILES)  # 4 x [block_k, 1]
    col_t = lax.broadcasted_iota(jnp.int32, (1, TILE_SIZE), 1)
    tiles = []
    for i, scale in enumerate(scales):
        fp8 = plgpu_triton.load(kv_ref.at[row[:, None], TILE_SIZE * i + col_t], mask=valid[:, None], other=0)
        values = lax.bitcast_convert_type(fp8, jnp.float8_e4m3fn).astype(jnp.float32)
        tiles.append((values * scale).astype(kv_dtype))
    # Rope: 128 bytes, paired (low, high) into bfloat16 bit patterns, widened to float32 bits (<< 16).
    rope_bytes = _load_bytes(kv_ref, row, valid,
                             ROPE_OFFSET + lax.broadcasted_iota(jnp.int32, (1, 2 * ROPE_DIM), 1))
    low, high = _split_last(rope_bytes, 2)
    rope_bits = lax.shift_left(low, jnp.int32(16)) | lax.shift_left(high, jnp.int32(24))
    k_pe = lax.bitcast_convert_type(rope_bits, jnp.float32).astype(kv_dtype)
    return tuple(tiles), k_pe


def _sparse_kernel(*refs, has_length: bool, fp8: bool, num_heads: int, topk: int, num_slots: int,
                   softmax_scale: float, split_len: int, tuning: SparseTritonConfig, partial: bool):
    if has_length:
        q_ref, kv_ref, idx_ref, len_ref, o_ref, lse_ref = refs
    else:
        (q_ref, kv_ref, idx_ref, o_ref, lse_ref), len_ref = refs, None
    # q_ref [T, H, 576]; kv_ref [num_slots, 576] (q's dtype) or [num_slots, 656] uint8; idx_ref [T * topk] int32;
    # len_ref [T] int32; o_ref [T, H, 512] (q's dtype) or, with `partial`, [num_splits, T, H, 512] float32;
    # lse_ref [T, H] or [num_splits, T, H] float32.
    block_h, block_k = tuning.block_h, tuning.block_k
    t = pl.program_id(0)
    head = pl.program_id(1) * block_h + lax.broadcasted_iota(jnp.int32, (block_h,), 0)
    split = pl.program_id(2)
    row_ok = head < num_heads
    kv_dtype = q_ref.dtype
    tile = TILE_SIZE if fp8 else LATENT_DIM
    num_tiles = LATENT_DIM // tile
    col_tile = lax.broadcasted_iota(jnp.int32, (1, tile), 1)
    col_r = lax.broadcasted_iota(jnp.int32, (1, ROPE_DIM), 1)
    # q rows of the head block; padding heads read as 0.
    q_tiles = [plgpu_triton.load(q_ref.at[t, head[:, None], tile * i + col_tile], mask=row_ok[:, None], other=0)
               for i in range(num_tiles)]
    q_pe = plgpu_triton.load(q_ref.at[t, head[:, None], LATENT_DIM + col_r], mask=row_ok[:, None], other=0)
    load_rows = _load_rows_fp8 if fp8 else _load_rows_bf16
    qk_scale = softmax_scale * _LOG2E  # scores in log2 units: exp2 instead of exp

    length = topk if len_ref is None else jnp.clip(len_ref[t], 0, topk)
    lo = split * split_len
    hi = jnp.minimum(lo + split_len, length)
    num_steps = lax.div(jnp.maximum(hi - lo, 0) + (block_k - 1), block_k)
    k_iota = lax.broadcasted_iota(jnp.int32, (block_k,), 0)

    def step(i, carry):
        accs, m_i, l_i = carry
        j = lo + i * block_k + k_iota
        in_range = j < hi
        idx = plgpu_triton.load(idx_ref.at[t * topk + j], mask=in_range, other=-1)
        valid = in_range & (idx >= 0) & (idx < num_slots)
        row = jnp.where(valid, idx, 0)
        kv_tiles, k_pe = load_rows(kv_ref, row, valid, kv_dtype)
        s = plgpu_triton.dot(q_pe, k_pe, trans_b=True)
        for q_t, kv_t in zip(q_tiles, kv_tiles):
            s += plgpu_triton.dot(q_t, kv_t, trans_b=True)
        s = jnp.where(valid[None, :], s * qk_scale, -jnp.inf)  # [M, block_k] float32, log2 units
        m_new = jnp.maximum(m_i, jnp.max(s, axis=1))  # finite: m_i starts at _NEG_BIG
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.exp2(s - m_new[:, None])  # 0 where not valid
        l_new = l_i * alpha + jnp.sum(p, axis=1)
        p = p.astype(kv_dtype)
        accs = tuple(acc * alpha[:, None] + plgpu_triton.dot(p, kv_t) for acc, kv_t in zip(accs, kv_tiles))
        return accs, m_new, l_new

    carry = (tuple(jnp.zeros((block_h, tile), jnp.float32) for _ in range(num_tiles)),
             jnp.full((block_h,), _NEG_BIG, jnp.float32), jnp.zeros((block_h,), jnp.float32))
    accs, m_i, l_i = lax.fori_loop(0, num_steps, step, carry)
    # A row without a used entry (l = 0): out 0, lse -inf (zero weight in the merge). A NaN a used row holds stays.
    empty = l_i == 0
    inv_l = jnp.where(empty, 0.0, 1.0 / jnp.where(empty, 1.0, l_i))
    lse = jnp.where(empty, -jnp.inf, (m_i + jnp.log2(jnp.where(empty, 1.0, l_i))) * _LN2)
    where = (split, t) if partial else (t,)  # the split's partial, or the final row
    for i, acc in enumerate(accs):
        plgpu_triton.store(o_ref.at[(*where, head[:, None], tile * i + col_tile)],
                           (acc * inv_l[:, None]).astype(o_ref.dtype), mask=row_ok[:, None])
    plgpu_triton.store(lse_ref.at[(*where, head)], lse, mask=row_ok)


def _dtype_name(x) -> str:
    return jnp.dtype(x.dtype).name


def _check_inputs(q, kv_cache, indices, topk_length, softmax_scale) -> None:
    """ValueError (NotImplementedError for a head dim other than 576) naming the offending value."""
    for name, x in (("q", q), ("kv_cache", kv_cache), ("indices", indices)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(f"{name} must be an array, got {name}={x!r}")
    if q.ndim != 3:
        raise ValueError(f"q must be [T, H, {HEAD_DIM}] (rank 3), got q.shape={q.shape}")
    if q.shape[2] != HEAD_DIM:
        raise NotImplementedError(
            f"the sparse Triton kernel takes DeepSeek's head dim {HEAD_DIM} ({LATENT_DIM} latent + {ROPE_DIM} rope), "
            f"got q.shape={q.shape}")
    if _dtype_name(q) not in _Q_DTYPES:
        raise ValueError(f"q's dtype must be one of {_Q_DTYPES}, got q.dtype={_dtype_name(q)}")
    if kv_cache.ndim != 3:
        raise ValueError(f"kv_cache must be [num_blocks, page_size, {HEAD_DIM}] or uint8 [num_blocks, page_size, "
                         f"{BYTES_PER_TOKEN}] (rank 3), got kv_cache.shape={kv_cache.shape}")
    if _is_fp8_layout(kv_cache.dtype):
        if kv_cache.shape[2] != BYTES_PER_TOKEN:
            raise ValueError(f"the fp8 cache (uint8) must be [num_blocks, page_size, {BYTES_PER_TOKEN}] "
                             f"({BYTES_PER_TOKEN} bytes a token), got kv_cache.shape={kv_cache.shape}")
    else:
        if _dtype_name(kv_cache) != _dtype_name(q):
            raise ValueError(f"kv_cache's dtype must be q's ({_dtype_name(q)}) or uint8 (the fp8 {BYTES_PER_TOKEN}-byte "
                             f"layout), got kv_cache.dtype={_dtype_name(kv_cache)}")
        if kv_cache.shape[2] != HEAD_DIM:
            raise NotImplementedError(f"the sparse Triton kernel takes cache rows of {HEAD_DIM} values, got "
                                      f"kv_cache.shape={kv_cache.shape}")
    if kv_cache.shape[0] < 1 or kv_cache.shape[1] < 1:
        raise ValueError(f"kv_cache needs num_blocks >= 1 and page_size >= 1, got kv_cache.shape={kv_cache.shape}")
    if indices.ndim != 2 or indices.shape[0] != q.shape[0] or indices.shape[1] < 1:
        raise ValueError(f"indices must be [T, topk] with T = q.shape[0] = {q.shape[0]} and topk >= 1, got "
                         f"indices.shape={indices.shape}")
    if _dtype_name(indices) != "int32":
        raise ValueError(f"indices must be int32, got indices.dtype={_dtype_name(indices)}")
    if topk_length is not None:
        if not hasattr(topk_length, "shape") or not hasattr(topk_length, "dtype"):
            raise ValueError(f"topk_length must be an int32 array [T] or None, got topk_length={topk_length!r}")
        if topk_length.shape != (q.shape[0],):
            raise ValueError(f"topk_length must be [T] = ({q.shape[0]},), got topk_length.shape={topk_length.shape}")
        if _dtype_name(topk_length) != "int32":
            raise ValueError(f"topk_length must be int32, got topk_length.dtype={_dtype_name(topk_length)}")
    if (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real)
            or not math.isfinite(softmax_scale) or softmax_scale <= 0):
        raise ValueError(f"softmax_scale must be a finite float > 0 (static), got softmax_scale={softmax_scale!r}")


_INT32_OFFSET_BYTES = (2**31, 2**32)
"""Sizes (bytes) of a uint8 cache whose int32 gather offsets overflow: JAX's Triton lowering takes int32 offsets
up to 2**32 bytes (jax/_src/pallas/triton/lowering.py, _compute_offsets_from_indices), and a 1-byte array's
element offsets pass 2**31 - 1 above 2**31 bytes."""


def sparse_decode(q, kv_cache, indices, topk_length=None, *, softmax_scale: float, interpret: bool = False,
                  tuning: SparseTritonConfig | None = None):
    """Sparse MLA decode (DeepSeek-V3.2 DSA top-k) with the Pallas Triton kernel.

    q [T, H, 576] (bfloat16 or float16: 512 latent then 64 rope columns); kv_cache [num_blocks, page_size, 576] in
    q's dtype, or uint8 [num_blocks, page_size, 656] (the fp8 layout, module docstring); indices [T, topk] int32
    global slots (block * page_size + offset), -1 for an entry to skip; topk_length [T] int32 or None: token t uses
    its first topk_length[t] entries. softmax_scale: a float (static). Returns (out [T, H, 512] in q's dtype,
    lse [T, H] float32, natural log). tuning None: sparse_heuristic's pick. Works under jax.jit with indices and
    topk_length traced (new values reuse the compiled call).
    """
    from mla_jax.api import check_interpret

    check_interpret(interpret)
    _check_inputs(q, kv_cache, indices, topk_length, softmax_scale)
    T, H, _ = q.shape
    topk = indices.shape[1]
    if tuning is None:
        tuning = sparse_heuristic(H, topk, T, kv_cache.dtype)
    elif not isinstance(tuning, SparseTritonConfig):
        raise ValueError(f"tuning must be a SparseTritonConfig or None, got tuning={tuning!r}")
    fp8 = _is_fp8_layout(kv_cache.dtype)
    nbytes = kv_cache.size * jnp.dtype(kv_cache.dtype).itemsize
    if fp8 and not interpret and _INT32_OFFSET_BYTES[0] < nbytes <= _INT32_OFFSET_BYTES[1]:
        raise NotImplementedError(
            f"a uint8 cache of {nbytes} bytes (between 2**31 and 2**32) gets int32 gather offsets from JAX's Triton "
            f"lowering, which overflow past 2**31 bytes; kv_cache.shape={kv_cache.shape}")
    if T == 0:
        return jnp.zeros((0, H, LATENT_DIM), q.dtype), jnp.zeros((0, H), jnp.float32)
    return _sparse_decode(q, kv_cache, indices, topk_length, softmax_scale=float(softmax_scale), tuning=tuning,
                          interpret=interpret)


@functools.partial(jax.jit, static_argnames=("softmax_scale", "tuning", "interpret"))
def _sparse_decode(q, kv_cache, indices, topk_length, *, softmax_scale, tuning, interpret):
    T, H, _ = q.shape
    topk = indices.shape[1]
    fp8 = _is_fp8_layout(kv_cache.dtype)
    num_slots = kv_cache.shape[0] * kv_cache.shape[1]
    rows = kv_cache.reshape(num_slots, kv_cache.shape[2])  # a bitcast: the same buffer
    S = tuning.num_splits
    split_len = _cdiv(_cdiv(topk, tuning.block_k), S) * tuning.block_k
    partial = S > 1
    kernel = functools.partial(
        _sparse_kernel, has_length=topk_length is not None, fp8=fp8, num_heads=H, topk=topk, num_slots=num_slots,
        softmax_scale=softmax_scale, split_len=split_len, tuning=tuning, partial=partial)
    if partial:
        out_shape = (jax.ShapeDtypeStruct((S, T, H, LATENT_DIM), jnp.float32),
                     jax.ShapeDtypeStruct((S, T, H), jnp.float32))
    else:
        out_shape = (jax.ShapeDtypeStruct((T, H, LATENT_DIM), q.dtype), jax.ShapeDtypeStruct((T, H), jnp.float32))
    args = [q, rows, indices.reshape(-1)] + ([] if topk_length is None else [topk_length])
    # No BlockSpecs: every ref is the whole array; the kernel computes its own (gathered) addresses.
    out, lse = pl.pallas_call(
        kernel,
        grid=(T, _cdiv(H, tuning.block_h), S),
        out_shape=out_shape,
        compiler_params=plgpu_triton.CompilerParams(num_warps=tuning.num_warps, num_stages=tuning.num_stages),
        interpret=interpret,
        name="mla_sparse_decode",
    )(*args)
    if partial:
        return combine.combine(out, lse, q.dtype, interpret=interpret)
    return out, lse


__all__ = ["SparseTritonConfig", "sparse_decode", "sparse_heuristic"]
