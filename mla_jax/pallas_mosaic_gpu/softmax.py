"""Masks and softmax pieces: the causal / length mask of the scores, the zeroing of V's rows past the KV length (NaN
in unread slots must not reach P @ V), cross-warp column reductions, and the wgmma accumulation helpers."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.pallas_mosaic_gpu.config import MASK_VALUE


def accumulate_wgmma(acc, issue, under=None, *, interpret: bool = False):
    """acc + the wgmmas `issue(acc_ref)` makes (acc: an fp32 WGMMA-layout value). under: (x, f) to also return
    f(), computed after the wgmmas' issue and before the wait for them (x: a value of f()'s type, the state's
    placeholder), as (acc, f())."""
    if interpret:
        # The interpreter has no rule for run_state over an accumulator (nor for storing into one): compute into a
        # fresh accumulator and add it. Same math, one more fp32 add per element.
        def fresh(acc_ref):
            issue(acc_ref)
            return acc_ref[...]

        acc = acc + pl.run_scoped(fresh, plgpu.ACC(acc.shape, jnp.float32))
        return acc if under is None else (acc, under[1]())
    if under is None:
        return pl.run_state(issue)(plgpu.ACC.init(acc))  # accumulates in the tensor core

    def issue_and(refs):
        acc_ref, x_ref = refs
        issue(acc_ref)
        x_ref[...] = under[1]()  # between the wgmmas' issue and run_state's wait for them

    return pl.run_state(issue_and)((plgpu.ACC.init(acc), under[0]))


def zero_v_tail(kc, slot, kv_start, kv_len, col0: int, ncols: int):
    """If the step in `slot` (its first position kv_start) runs past kv_len, zeroes its rows from
    kv_len on, columns [col0, col0 + ncols) (64 at a time): their cache slots may hold NaN, and
    P = 0 times NaN is NaN."""
    block_kv, dtype = kc.plan.block_kv, kc.plan.dtype
    kv_smem = kc.kv_smem
    @pl.when(kv_start + block_kv > kv_len)
    def _zero_tail():
        n_valid = kv_len - kv_start
        rows = plgpu.broadcasted_iota(jnp.int32, (block_kv, 64), 0, layout=plgpu.Layout.WGMMA)
        for c in range(ncols // 64):
            ref = kv_smem.at[slot, :, pl.ds(col0 + c * 64, 64)]
            ref[...] = jnp.where(rows < n_valid, ref[...], jnp.zeros((), dtype))


def mask_scores(kc, s, first_key, first_pos, kv_len, scale, row_ax: int = 0, key_ax: int = 1):
    """Scores s * scale, and MASK_VALUE where a row may not see the key: row i holds token i // hp
    of the tile, at position first_pos + i // hp, and key j (along key_ax) is at first_key + j;
    kv_pos <= first_pos + i // hp  <=>  (kv_pos - first_pos) * hp <= i, and kv_pos < kv_len."""
    hp = kc.plan.hp
    row = plgpu.broadcasted_iota(jnp.int32, s.shape, row_ax, layout=plgpu.Layout.WGMMA)
    kv_pos = plgpu.broadcasted_iota(jnp.int32, s.shape, key_ax, layout=plgpu.Layout.WGMMA) + first_key
    visible = ((kv_pos - first_pos) * hp <= row) & (kv_pos < kv_len)
    return jnp.where(visible, s * scale, MASK_VALUE)


def store_tiled(kc, ref, x, layout, transforms, transpose: bool = False):
    """ref[...] = x (transpose: ref.T[...] = x; ref 2-D, tiled and swizzled by `transforms`) without Pallas's
    swap, whose lowering first loads the old value (for the WGMMA layout an ldmatrix that stays in the
    kernel, its result unused: 8 KiB of shared-memory reads a 64 x 64 f16 chunk) between two warpgroup
    barriers."""
    interpret = kc.plan.interpret
    if interpret:  # (the interpreter has no rule for inline Mosaic GPU)
        (ref.transpose((1, 0)) if transpose else ref)[...] = x
        return
    swizzle = next(t.swizzle for t in transforms if isinstance(t, plgpu.SwizzleTransform))

    @plgpu.inline_mgpu(arg_types=(layout, plgpu.RefType(transforms)))
    def store(ctx, fa, r):
        del ctx
        if transpose:  # (the tiled ref [rows / 8, cols / 64, 8, 64]: its tiles and their rows swapped, as
            # Pallas's transpose of a tiled ref)
            r = mgpu.memref_transpose(r, (1, 0, 3, 2))
        fa.store_tiled(r, swizzle=swizzle)

    store(x, ref)


def col_reduce(kc, x, op: str, w: int):
    """(kv_halves) x [64, n] fp32 (WGMMA layout) reduced down its columns ("max" or "add") -> [n] (the column
    layout), across the warpgroup's 4 warps through warpgroup w's own scratch red_smem[w]: Pallas's reductions
    use one scratch (reduction_scratch_bytes) for every warpgroup, which two running at once would share."""
    interpret = kc.plan.interpret
    red_smem = kc.red_smem
    if interpret:  # (the interpreter has no rule for inline Mosaic GPU; its reductions need no scratch)
        return x.max(axis=0) if op == "max" else x.sum(axis=0)

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()),
                       return_type=plgpu.ShapeDtypeStruct((x.shape[1],), jnp.float32,
                                                          layout=plgpu.Layout.WGMMA.reduce(0)))
    def reduce(ctx, fa, scratch):
        del ctx
        return fa.reduce(op, 0, scratch=scratch)

    return reduce(x, red_smem.at[w])
