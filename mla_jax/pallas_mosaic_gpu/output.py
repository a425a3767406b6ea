"""The output stage: each warpgroup's normalized [64, 256] half (transposed P @ V: O^T transposed back by two wgmmas
with an identity) through a swizzled shared-memory stage, one TMA a token: the final output and lse, or a
piece's fp32 partials to its slot for mla_jax.combine.combine_slots."""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.pallas_mosaic_gpu.config import BLOCK_H, INFO_SINGLE, INFO_SLOT, V_HALF
from mla_jax.pallas_mosaic_gpu.fp8 import k_scale


def transpose_out(kc, half: int, o_t, l_tot):
    """(transposed_pv) o_t [256, n] fp32 (WGMMA layout) -> its transpose padded to [64, 256] (rows past n 0):
    o_t as two bf16 parts (hi, and lo = the rest: ~16 bits), each multiplied by an identity [64, n] (their
    transposed view the wgmma's right operand; Mosaic GPU stores no WGMMA-layout array transposed).
    A row whose sum l_tot [n] is NaN (a non-finite q entry of that head: its scores, P and output NaN) is
    zeroed before the identity (0 x NaN would spread it to every row) and set to NaN after it, from the
    row sums in x_smem: the other rows stay right, as without transposed_pv."""
    sums_row = kc.plan.sums_row
    e_smem, t_smem, x_smem = kc.e_smem, kc.t_smem, kc.x_smem
    n = o_t.shape[1]
    nan_col = lax.broadcast_in_dim(jnp.where(l_tot == l_tot, 0.0, 1.0), o_t.shape, [1])
    o_t = jnp.where(nan_col > 0.5, 0.0, o_t)
    hi = o_t.astype(jnp.bfloat16)
    t_smem[half, 0] = hi
    t_smem[half, 1] = (o_t - hi.astype(jnp.float32)).astype(jnp.bfloat16)
    r = plgpu.broadcasted_iota(jnp.int32, (BLOCK_H, n), 0, layout=plgpu.Layout.WGMMA)
    c = plgpu.broadcasted_iota(jnp.int32, (BLOCK_H, n), 1, layout=plgpu.Layout.WGMMA)
    e_smem[half] = jnp.where(r == c, 1.0, 0.0).astype(jnp.bfloat16)
    plgpu.commit_smem()  # visible to the wgmmas

    def back(acc_ref):
        for j in range(2):
            plgpu.wgmma(acc_ref, e_smem.at[half], t_smem.at[half, j].transpose((1, 0)))
        return acc_ref[...]

    out = pl.run_scoped(back, plgpu.ACC((BLOCK_H, V_HALF), jnp.float32))
    # the row sums in the row layout (rows past n are never written out)
    l_rows = plgpu.load(x_smem.at[sums_row], layout=plgpu.Layout.WGMMA.reduce(1))
    nan_row = lax.broadcast_in_dim(jnp.where(l_rows == l_rows, 0.0, 1.0), out.shape, [0])
    return jnp.where(nan_row > 0.5, jnp.nan, out)


def finish(kc, half, acc, l_tot, lse, first_tok, ntok):
    """Writes the output columns [256 half, 256 half + 256) normalized by l_tot (half None: none)
    and the lse (None: not this warpgroup) for the tile's tokens: the final out / lse, or with
    slot_out the piece's fp32 partials to its slot (direct_single: the final ones where the piece is
    its request's only one). Every warpgroup is past its last read of q and of the KV ring (the
    stage aliases them)."""
    fp8, hp, slot_out, tpt = kc.plan.fp8, kc.plan.hp, kc.plan.slot_out, kc.plan.tpt
    transposed_pv, x_smem = kc.plan.transposed_pv, kc.x_smem
    out = None
    if half is not None:
        inv = 1.0 / jnp.maximum(l_tot, 1e-30)
        if fp8:  # V was read unscaled
            inv = inv * k_scale(kc)
        if transposed_pv:  # O^T [256, rows in use] -> O [64, 256]
            out = transpose_out(kc, half, acc * lax.broadcast_in_dim(inv, acc.shape, [1]), l_tot)
        else:
            out = acc * lax.broadcast_in_dim(inv, acc.shape, [0])
    if lse is not None:
        if lse.shape[0] == BLOCK_H:
            x_smem[0] = lse
        else:  # transposed scores: the rows in use
            x_smem.at[0, pl.ds(0, lse.shape[0])][...] = lse
    if not slot_out:
        write_rows(kc, half, out, lse is not None, kc.stage, kc.out_ref, kc.lse_ref, first_tok, ntok)
        return
    slot = kc.info_smem[INFO_SLOT]
    to_slot = functools.partial(write_rows, kc, half, out, lse is not None, kc.stage, kc.o_part_ref.at[slot],
                                kc.l_part_ref.at[slot], kc.lt * tpt, ntok)
    if not kc.plan.direct_single:
        to_slot()
        return
    single = kc.info_smem[INFO_SINGLE] != 0
    pl.when(single)(functools.partial(write_rows, kc, half, out, lse is not None, kc.stage_out, kc.out_ref,
                                      kc.lse_ref, first_tok, ntok))
    pl.when(jnp.logical_not(single))(to_slot)


def write_rows(kc, half, out, has_lse, stage, o_dst, l_dst, row, ntok):
    """out (None: none) through `stage` (in its dtype) into o_dst [rows, heads, 512] and (has_lse) the lse in
    x_smem's row 0 into l_dst [rows, heads], the tile's tokens at rows row, row + 1, ..."""
    hb, hp, tpt, x_smem = kc.hb, kc.plan.hp, kc.plan.tpt, kc.x_smem
    if out is not None:
        stage[half] = out.astype(stage.dtype)
    plgpu.commit_smem()
    v_cols = pl.ds((half or 0) * V_HALF, V_HALF)
    if tpt == 1:  # (one token: its hp heads, the tile's first rows; hp < 64 only in the sparse kernel)
        whole = hp == BLOCK_H
        if out is not None:
            plgpu.copy_smem_to_gmem(stage.at[half] if whole else stage.at[half, pl.ds(0, hp)],
                                    o_dst.at[row, pl.ds(hb * hp, hp), v_cols])
        if has_lse:
            plgpu.copy_smem_to_gmem(x_smem.at[0] if whole else x_smem.at[0, pl.ds(0, hp)],
                                    l_dst.at[row, pl.ds(hb * hp, hp)])
    else:
        for j in range(tpt):  # the tile's tokens, straight into out [T, H, 512] and lse [T, H]

            @pl.when(j < ntok)
            def _():
                if out is not None:
                    plgpu.copy_smem_to_gmem(stage.at[half, pl.ds(j * hp, hp)], o_dst.at[row + j, :, v_cols])
                if has_lse:
                    plgpu.copy_smem_to_gmem(x_smem.at[0, pl.ds(j * hp, hp)], l_dst.at[row + j])
    plgpu.wait_smem_to_gmem(0)
