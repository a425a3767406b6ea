"""The split-KV combine: merges per-split partial outputs through their log-sum-exp.

Both Pallas kernels split the KV of a request into `S` ranges (flash-decoding) and write, per
split, the output normalized over its range and the range's lse:
o_part [S, T, H, L] float32, lse_part [S, T, H] float32 (-inf for a split that saw no KV).
The merged result is

    m = max_s lse_s,  w_s = exp(lse_s - m),  out = sum_s w_s o_s / sum_s w_s,  lse = m + log(sum_s w_s)

with empty splits (lse -inf) weighing 0 and a row with every split empty giving out 0, lse -inf; a NaN lse (a
non-finite q entry of that head) gives that row out NaN, lse NaN, never a plausible-looking 0.

`combine_ref` is that formula in jnp (XLA makes three kernels of it on the GPU: ~8.6 us at
H=16, B=8, S=1024 on the H200, by ncu); `combine` is one Pallas Triton kernel
that reads each partial once. A program takes one token, a block of heads and 64 of the L
columns, with every split at once: a [S_pad, block_h, 64] tile (S_pad = S rounded up to a power
of two, block_h as many heads as keep the tile at 8192 float32 values).

`col_order` (optional, an int [L] permutation): the merged output's columns gathered, out[..., j] = merged[...,
col_order[j]], in the same kernel (the kernel reads partial column col_order[j] for output column j). The Mosaic
GPU kernel's fp8 path that loads V^T into registers writes its partials' columns permuted; they are put back here,
in the merge, rather than by a separate gather.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from mla_jax.schedule import slot_ranges

BLOCK_L = 64  # output columns per program
TILE_ELEMS = 8192  # S_pad * block_h * BLOCK_L: 64 float32 registers a thread at 4 warps
NARROW_SLOT_TILE = 4  # combine_slots: a token's last slots (all of a token of 1-4) merged 4 a load: 116 registers
WIDE_SLOT_TILE = 8  # combine_slots: 8 of a token's slots a load while 8 remain: 128 registers (16: 140)
SLOT_BLOCK_H = 8  # combine_slots: heads a program


def combine_ref(o_part, lse_part, dtype, col_order=None):
    """The jnp combine: o_part [S, T, H, L], lse_part [S, T, H] -> out [T, H, L] in dtype, lse [T, H] (col_order:
    out's columns gathered by it)."""
    lse_max = jnp.max(lse_part, axis=0)
    lse_max_safe = jnp.where(jnp.isfinite(lse_max), lse_max, 0.0)
    w = jnp.exp(lse_part - lse_max_safe[None])  # [S, T, H]; 0 for empty splits
    w_sum = jnp.sum(w, axis=0)
    out = jnp.sum(jnp.where(w[..., None] > 0, w[..., None] * o_part, 0.0), axis=0)
    out = out / jnp.where(w_sum > 0, w_sum, 1.0)[..., None]
    out = jnp.where(jnp.isnan(w_sum)[..., None], jnp.nan, out)  # a NaN split: NaN, not 0
    if col_order is not None:
        out = out[..., col_order]
    return out.astype(dtype), lse_max_safe + jnp.log(w_sum)


def _next_pow2(x: int) -> int:
    """The least power of two >= x (1 for x <= 1)."""
    return 1 << max(0, int(x) - 1).bit_length()


def _combine_kernel(*refs, num_splits, num_heads, s_pad, block_h, gather):
    if gather:
        lse_ref, o_ref, order_ref, out_ref, lse_out_ref = refs
    else:
        (lse_ref, o_ref, out_ref, lse_out_ref), order_ref = refs, None
    t = pl.program_id(0)
    h = pl.program_id(1) * block_h + lax.broadcasted_iota(jnp.int32, (block_h,), 0)
    c = pl.program_id(2) * BLOCK_L + lax.broadcasted_iota(jnp.int32, (BLOCK_L,), 0)
    src = plgpu_triton.load(order_ref.at[c]) if gather else c  # the partials' columns this program reads
    s = lax.broadcasted_iota(jnp.int32, (s_pad,), 0)
    h_ok = h < num_heads
    ok = (s[:, None] < num_splits) & h_ok[None, :]  # [s_pad, block_h]
    lse = plgpu_triton.load(lse_ref.at[s[:, None], t, h[None, :]], mask=ok, other=-jnp.inf)
    m = jnp.max(lse, axis=0)
    m = jnp.where(m > -jnp.inf, m, 0.0)  # every split empty: weights 0, lse -inf below
    w = jnp.exp(lse - m[None, :])  # 0 where lse = -inf (an empty split, a masked slot)
    o = plgpu_triton.load(
        o_ref.at[s[:, None, None], t, h[None, :, None], src[None, None, :]], mask=ok[:, :, None], other=0.0
    )  # [s_pad, block_h, BLOCK_L]
    num = jnp.sum(jnp.where(w[:, :, None] > 0, w[:, :, None] * o, 0.0), axis=0)
    den = jnp.sum(w, axis=0)
    out = num / jnp.where(den > 0, den, 1.0)[:, None]
    out = jnp.where((den != den)[:, None], jnp.nan, out)  # a NaN split (den NaN): NaN, not 0
    plgpu_triton.store(out_ref.at[t, h[:, None], c[None, :]], out.astype(out_ref.dtype), mask=h_ok[:, None])

    @pl.when(pl.program_id(2) == 0)
    def _():
        plgpu_triton.store(lse_out_ref.at[t, h], m + jnp.log(den), mask=h_ok)


@functools.partial(jax.jit, static_argnames=("dtype", "interpret"))
def combine(o_part, lse_part, dtype, interpret: bool = False, col_order=None):
    """One Pallas Triton kernel computing combine_ref (same shapes and result to rounding; col_order an int [L]
    permutation of the output's columns, gathered in the kernel).
    Falls back to combine_ref where L is not a multiple of 64 or a split count is too large
    for one tile (S > 8192 / 64)."""
    dtype = jnp.dtype(dtype)
    num_splits, num_tokens, num_heads, lora = o_part.shape
    if col_order is not None and jnp.shape(col_order) != (lora,):
        raise ValueError(f"col_order must have shape ({lora},) (a permutation of the output's columns), got "
                         f"{jnp.shape(col_order)}")
    s_pad = _next_pow2(num_splits)
    if lora % BLOCK_L or s_pad * BLOCK_L > TILE_ELEMS:
        return combine_ref(o_part, lse_part, dtype, col_order)
    block_h = min(_next_pow2(num_heads), TILE_ELEMS // (s_pad * BLOCK_L))
    gather = col_order is not None
    kernel = functools.partial(_combine_kernel, num_splits=num_splits, num_heads=num_heads, s_pad=s_pad,
                               block_h=block_h, gather=gather)
    return pl.pallas_call(
        kernel,
        grid=(num_tokens, math.ceil(num_heads / block_h), lora // BLOCK_L),
        out_shape=(
            jax.ShapeDtypeStruct((num_tokens, num_heads, lora), dtype),
            jax.ShapeDtypeStruct((num_tokens, num_heads), jnp.float32),
        ),
        compiler_params=plgpu_triton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="mla_combine_splits",
    )(lse_part.astype(jnp.float32), o_part.astype(jnp.float32),
      *([jnp.asarray(col_order, jnp.int32)] if gather else []))


def _token_slots(token_slots, split_offsets, query_start_loc, num_tokens: int):
    """The combine's rows per token (schedule.slot_ranges): `token_slots` when given (built once a batch with the
    schedule), else computed here from split_offsets and query_start_loc."""
    if token_slots is None:
        return slot_ranges(split_offsets, query_start_loc, num_tokens)
    if tuple(jnp.shape(token_slots)) != (num_tokens, 3):
        raise ValueError(f"token_slots must have shape ({num_tokens}, 3) (one row per token), got "
                         f"token_slots.shape={tuple(jnp.shape(token_slots))}")
    return jnp.asarray(token_slots, jnp.int32)


def combine_slots_ref(o_part, lse_part, split_offsets, query_start_loc, dtype, *, num_tokens=None, out=None,
                      lse=None, col_order=None, token_slots=None):
    """combine_slots in jnp, with the same arguments and result: schedule.combine_slots (the reference walk's merge)
    is this, and it runs where no Pallas Triton kernel can (Mosaic GPU interpret mode). It gathers every slot for
    every token ([S, T, H, L]): small problems."""
    keep_single = out is not None
    num_tokens = out.shape[0] if keep_single else num_tokens
    rows = _token_slots(token_slots, split_offsets, query_start_loc, num_tokens)
    first, count, i = rows[:, 0], rows[:, 1], rows[:, 2]
    s = jnp.arange(o_part.shape[0], dtype=jnp.int32)[:, None]
    mine = (s >= first[None]) & (s < (first + count)[None])  # [S, T]
    lse_t = jnp.where(mine[..., None], lse_part[:, i].astype(jnp.float32), -jnp.inf)
    o_t = jnp.where(mine[..., None, None], o_part[:, i].astype(jnp.float32), 0.0)
    merged, merged_lse = combine_ref(o_t, lse_t, dtype, col_order)
    if keep_single:
        single = (count == 1)
        merged = jnp.where(single[:, None, None], out.astype(dtype), merged)
        merged_lse = jnp.where(single[:, None], lse.astype(jnp.float32), merged_lse)
    return merged, merged_lse


def slot_tiles(num_slots: int, gather: bool = False) -> tuple[int, int]:
    """combine_slots's (wide, narrow) slots a load. A token merges its slots `wide` at a time while that many remain,
    then the rest `narrow` at a time: at most WIDE_SLOT_TILE and NARROW_SLOT_TILE, the next power of two of the slot
    count where that is smaller; with the column gather (its indexed loads take 72 registers at 4 slots, 168 with
    a wide loop of 8) one loop of 4.

    Why two: a token of 1-4 slots, most of a batch's, wants one 4-slot load, as many programs a SM as the registers
    allow (4 at 4 warps and at most 128 registers a thread); masked down to 2 of 16 a wide load, at 143 registers,
    cost a uniform batch of two slots a request 8% (H = 64, B = 64, 2048 tokens, an H100). A token of many slots
    (B = 1 split in 16, a long request's dozens) wants few serial loads: 4 loads of 4 made the combine of H = 16,
    B = 1 4.2 us, one of 16 2.0 us (an H100). The loads are registers-sized (sm_90, Triton 3.6, 4 warps): 116
    registers at 4 slots, 128 with a wide loop of 8, 140 with one of 16."""
    narrow = min(NARROW_SLOT_TILE, _next_pow2(num_slots))
    return (narrow if gather else min(WIDE_SLOT_TILE, _next_pow2(num_slots))), narrow


def _combine_slots_kernel(*refs, num_heads, block_h, wide, narrow, gather, keep_single):
    rows_ref, lse_ref, o_ref, *rest = refs
    order_ref = rest.pop(0) if gather else None
    if keep_single:  # (the aliased out and lse inputs: never read here)
        rest = rest[2:]
    out_ref, lse_out_ref = rest
    t = pl.program_id(0)
    h = pl.program_id(1) * block_h + lax.broadcasted_iota(jnp.int32, (block_h,), 0)
    col_block = pl.program_id(2)
    c = col_block * BLOCK_L + lax.broadcasted_iota(jnp.int32, (BLOCK_L,), 0)
    src = plgpu_triton.load(order_ref.at[c]) if gather else c
    first, count, i = (plgpu_triton.load(rows_ref.at[t, jnp.int32(j)]) for j in range(3))
    end = first + count
    h_ok = h < num_heads

    def merge():
        def merge_from(start, tile, num_loads, carry):  # slots [start, start + num_loads x tile), a tile a load
            u = lax.broadcasted_iota(jnp.int32, (tile,), 0)

            def body(k, carry):  # slots [s0, s0 + tile) as one load, merged online into (m, num, den)
                m, num, den = carry
                s = start + k * tile + u
                ok = (s < end)[:, None] & h_ok[None, :]  # [tile, block_h]
                lse = plgpu_triton.load(lse_ref.at[s[:, None], i, h[None, :]], mask=ok, other=-jnp.inf)
                o = plgpu_triton.load(o_ref.at[s[:, None, None], i, h[None, :, None], src[None, None, :]],
                                      mask=ok[:, :, None], other=0.0)  # [tile, block_h, BLOCK_L]
                m_new = jnp.maximum(m, jnp.max(lse, axis=0))  # (NaN stays NaN: max with NaN)
                m_safe = jnp.where(m_new > -jnp.inf, m_new, 0.0)  # (every slot so far empty, or NaN: 0)
                scale = jnp.exp(m - m_safe)  # 0 while m is -inf
                w = jnp.exp(lse - m_safe[None, :])  # 0 where lse = -inf (an empty slot, a masked one)
                num = num * scale[:, None] + jnp.sum(jnp.where(w[:, :, None] > 0, w[:, :, None] * o, 0.0), axis=0)
                return m_new, num, den * scale + jnp.sum(w, axis=0)

            return lax.fori_loop(0, num_loads, body, carry)

        carry = (jnp.full((block_h,), -jnp.inf, jnp.float32), jnp.zeros((block_h, BLOCK_L), jnp.float32),
                 jnp.zeros((block_h,), jnp.float32))
        start = first
        if wide > narrow:  # whole wide loads while `wide` slots remain
            carry = merge_from(start, wide, count // wide, carry)
            start = first + count // wide * wide
        m, num, den = merge_from(start, narrow, (end - start + narrow - 1) // narrow, carry)
        m = jnp.where(m > -jnp.inf, m, 0.0)
        out = num / jnp.where(den > 0, den, 1.0)[:, None]
        out = jnp.where((den != den)[:, None], jnp.nan, out)  # a NaN slot (den NaN): NaN, not 0
        plgpu_triton.store(out_ref.at[t, h[:, None], c[None, :]], out.astype(out_ref.dtype), mask=h_ok[:, None])

        @pl.when(col_block == 0)
        def _():
            plgpu_triton.store(lse_out_ref.at[t, h], m + jnp.log(den), mask=h_ok)

    if keep_single:  # a request of one slot: its rows were written by the decode kernel
        pl.when(count != 1)(merge)
    else:
        merge()


@functools.partial(jax.jit, static_argnames=("dtype", "num_tokens", "interpret"))
def combine_slots(o_part, lse_part, split_offsets, query_start_loc, dtype, *, num_tokens=None, out=None, lse=None,
                  col_order=None, token_slots=None, interpret: bool = False):
    """The ragged combine of a work schedule (mla_jax.schedule): token t, the i-th of request r, merges
    o_part[s, i] and lse_part[s, i] over r's slots s in [split_offsets[r], split_offsets[r + 1]) by LSE, the
    formula of combine_ref, slots in order. One Pallas Triton kernel: a program takes one token, a block of heads
    and 64 columns, and merges the token's slots online, a tile a load (`slot_tiles`: 8 at a time while 8 remain,
    then 4; the running max rescales the sums, one pass over the partials, a tile's loads in flight together);
    slots of other requests are never read (they may hold anything).

    o_part [S, Q, H, L] and lse_part [S, Q, H] float32 (Q: the bucket's max q_len). Returns out [T, H, L] in
    `dtype` and lse [T, H] float32. A token of a request with no slots (seq_len 0) gets out 0, lse -inf, as does a
    row past query_start_loc[-1].

    `out` and `lse` (optional, [T, H, L] in dtype and [T, H]): the decode kernel's final rows of the requests with
    exactly one slot, which it wrote directly; the result aliases them and keeps those rows (the kernel never reads
    them); then `num_tokens` is out's. Without them, `num_tokens` is required. col_order as in combine.

    `token_slots` (optional, int32 [T, 3]): each token's (first slot, slot count, index inside its request), the
    schedule's `token_slots` when it was built ahead (with_schedule); without it the call computes them from
    split_offsets and query_start_loc (a few small XLA kernels before the combine's)."""
    dtype = jnp.dtype(dtype)
    keep_single = out is not None
    if keep_single != (lse is not None):
        raise ValueError("combine_slots takes out and lse together (the rows of single-slot requests), or neither")
    if keep_single:
        num_tokens = out.shape[0]
    elif num_tokens is None:
        raise ValueError("combine_slots needs num_tokens when out is not given")
    _, _, num_heads, lora = o_part.shape
    if lora % BLOCK_L:
        raise ValueError(f"combine_slots needs L a multiple of {BLOCK_L}, got L={lora}")
    if col_order is not None and jnp.shape(col_order) != (lora,):
        raise ValueError(f"col_order must have shape ({lora},), got {jnp.shape(col_order)}")
    block_h = min(_next_pow2(num_heads), SLOT_BLOCK_H)
    gather = col_order is not None
    wide, narrow = slot_tiles(o_part.shape[0], gather)
    rows = _token_slots(token_slots, split_offsets, query_start_loc, num_tokens)
    args = [rows, lse_part.astype(jnp.float32), o_part.astype(jnp.float32)]
    if gather:
        args.append(jnp.asarray(col_order, jnp.int32))
    aliases = {}
    if keep_single:
        aliases = {len(args): 0, len(args) + 1: 1}
        args += [out.astype(dtype), lse.astype(jnp.float32)]
    kernel = functools.partial(_combine_slots_kernel, num_heads=num_heads, block_h=block_h, wide=wide, narrow=narrow,
                               gather=gather, keep_single=keep_single)
    return pl.pallas_call(
        kernel,
        grid=(num_tokens, math.ceil(num_heads / block_h), lora // BLOCK_L),
        out_shape=(jax.ShapeDtypeStruct((num_tokens, num_heads, lora), dtype),
                   jax.ShapeDtypeStruct((num_tokens, num_heads), jnp.float32)),
        input_output_aliases=aliases,
        compiler_params=plgpu_triton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="mla_combine_slots",
    )(*args)
