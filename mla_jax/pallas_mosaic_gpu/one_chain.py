"""The one-chain path (bf16 / fp16, and fp8 outside the halves path): warpgroup 0 computes a step's scores, softmax
and P (plain S = Q K^T, or transposed S^T = K Q^T where the tile uses at most 32 rows), hands P and the rescale factor
over, and does P @ V for output columns [0, 256); warpgroup 1 does P @ V for [256, 512) and issues the TMAs, so its
P @ V of step k runs under warpgroup 0's scores of step k + 1."""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.pallas_mosaic_gpu.config import BLOCK_H, FUSED_GROUP, HEAD_DIM, KV_LORA_RANK, LN2, V_HALF
from mla_jax.pallas_mosaic_gpu.layouts import Q_GROUPS
from mla_jax.pallas_mosaic_gpu.fp8 import (
    convert_chunk, convert_q, deq_chunk, deq_half, dequantize, fused_chunks, k_scale, kv_tile, overlap_convert,
    rows_below,
)
from mla_jax.pallas_mosaic_gpu.ring import drain, issue_step, load_info, load_q, tile_info
from mla_jax.pallas_mosaic_gpu.softmax import mask_scores, zero_v_tail
from mla_jax.pallas_mosaic_gpu.output import finish


def compute_wg(kc, w: int):  # w is static: all SMEM slices below are static
    producer_wg, stages = kc.plan.producer_wg, kc.plan.stages
    kv_consumed = kc.kv_consumed
    if w == producer_wg:
        load_info(kc)
    first_tok, ntok, first_pos, kv_len, last_page, begin, end = tile_info(kc)

    @pl.when(ntok > 0)
    def _():
        producer = w == producer_wg
        n = end - begin
        if producer:
            # This compute warpgroup (1) is also the producer: the
            # query tile and the first `stages` steps now, then step
            # k + stages once the P @ V warpgroups released step k's slot (kv_consumed).
            load_q(kc, first_tok)

            @pl.loop(0, jnp.minimum(n, stages))
            def _prologue(i):
                issue_step(kc, i, begin, last_page)

        def refill(k):
            """Step k + stages into step k's slot, once released (kv_consumed)."""
            i = k - begin + stages

            @pl.when(i < n)
            def _():
                plgpu.barrier_wait(kv_consumed.at[lax.rem(k - begin, jnp.int32(stages))])
                issue_step(kc, i, begin, last_page)

        compute_tile_flashmla(kc, w, first_tok, ntok, first_pos, kv_len, begin, end, refill if producer else None)
        if producer:
            drain(kc, n)


def compute_tile_flashmla(kc, w, first_tok, ntok, first_pos, kv_len, begin, end, refill):
    """FlashMLA's split of a step ("flashmla").

    Warpgroup 0 computes all the scores S = Q K^T of the 64-token step (wgmma N = 64), the online
    softmax and P, and hands P (SMEM) and the rescale factor alpha (x_smem[0]) over (`p_ready`).
    Each warpgroup then rescales its accumulator and does P @ V for its 256 output columns with P
    from SMEM: warpgroup 0 columns [0, 256) after the hand-off, warpgroup 1 [256, 512), which then
    releases P (`p_free`) and the KV slot and issues the TMAs, so its P @ V of step k runs while
    warpgroup 0 computes the scores of step k + 1. Warpgroup 0 keeps the row sums and hands them
    over after the last step (x_smem[1]), once warpgroup 1 released it: from then on no warpgroup
    reads q or the KV ring."""
    block_kv, dtype, fp8, fused_dequant = kc.plan.block_kv, kc.plan.dtype, kc.plan.fp8, kc.plan.fused_dequant
    overlap_dequant, q_bits, q_rows = kc.plan.overlap_dequant, kc.plan.q_bits, kc.plan.q_rows
    scale_log2, score_rows, stages = kc.plan.scale_log2, kc.plan.score_rows, kc.plan.stages
    sums_row, transposed_pv = kc.plan.sums_row, kc.plan.transposed_pv
    accumulate, deq_ready, kv_consumed, kv_ready = kc.accumulate, kc.deq_ready, kc.kv_consumed, kc.kv_ready
    p_smem, q_bar, q_smem, sync_a, sync_b, x_smem = kc.p_smem, kc.q_bar, kc.q_smem, kc.sync_a, kc.sync_b, kc.x_smem
    row_layout = plgpu.Layout.WGMMA.reduce(1)

    # transposed_pv: the accumulator is O^T [256 columns, rows in use], rescaled along its columns
    acc_shape = (V_HALF, score_rows) if transposed_pv else (BLOCK_H, V_HALF)
    acc_ax = 1 if transposed_pv else 0
    col_layout = plgpu.Layout.WGMMA.reduce(0)

    def zeros_acc():
        return plgpu.layout_cast(jnp.full(acc_shape, 0.0, jnp.float32), plgpu.Layout.WGMMA)

    def pv_wgmma(acc_ref, v_ref, p=None):
        """acc += P @ V (v_ref: [block_kv, 256] of V), or transposed_pv's O^T += V^T P^T a 64-column chunk
        at a time (P^T: the P buffer's rows in use, seen transposed)."""
        p = p_smem if p is None else p
        if not transposed_pv:
            plgpu.wgmma(acc_ref, p, v_ref)
            return
        p_t = p.at[pl.ds(0, score_rows)].transpose((1, 0))
        for c in range(V_HALF // 64):
            plgpu.wgmma(acc_ref.at[pl.ds(c * 64, 64)], v_ref.at[:, pl.ds(c * 64, 64)].transpose((1, 0)), p_t)

    def rescale(acc, f):
        return acc * lax.broadcast_in_dim(f, acc.shape, [acc_ax])

    def pv(acc, half, slot):
        v_cols = pl.ds(half * V_HALF, V_HALF)
        v = kv_tile(kc, slot).at[:, v_cols]
        return accumulate(acc, lambda acc_ref: pv_wgmma(acc_ref, v))

    # (overlap_dequant) the chunks of the next step each warpgroup converts: warpgroup 1 V's first half
    # while it waits for P, warpgroup 0 the rope under its own P @ V of this step, then V's second half (two
    # chunks each) once warpgroup 1's P @ V is done
    ov_early = [KV_LORA_RANK // 64] if w == 0 else [0, 1, 2, 3]
    ov_late = [4, 5] if w == 0 else [6, 7]

    def overlap_release(k, chunks, wait: bool):
        """(overlap_dequant) chunks of step k converted, fenced, this warpgroup's part of step k's copy
        done (`deq_ready`) and its ring slot released (then refilled, by the producer)."""
        overlap_convert(kc, k, begin, kv_len, chunks, wait=wait)
        plgpu.commit_smem()
        plgpu.barrier_arrive(deq_ready)
        plgpu.barrier_arrive(kv_consumed.at[lax.rem(k - begin, jnp.int32(stages))])
        if refill is not None:
            refill(k)

    def overlap_pv(acc, k, half: int, chunks):
        """(overlap_dequant) acc + P @ V of step k's V half `half` (async) and, while the wgmma runs,
        `chunks` of step k + 1 (their buffer's last readers, step k - 1's scores and P @ V, were done
        before P of step k)."""
        def issue(acc_ref):
            pv_wgmma(acc_ref, deq_half(kc, k, half))
            if chunks:
                pl.when(k + 1 < end)(lambda: overlap_convert(kc, k + 1, begin, kv_len, chunks))

        return accumulate(acc, issue)

    def load_vec(row):
        """Row `row` of x_smem (alpha, the row sums): in the row layout, or transposed_pv's column layout
        over the rows in use."""
        if transposed_pv:
            return plgpu.load(x_smem.at[row, pl.ds(0, score_rows)], layout=col_layout)
        return plgpu.load(x_smem.at[row], layout=row_layout)

    if overlap_dequant:  # the first step, each warpgroup its chunks
        pl.when(end > begin)(lambda: overlap_release(begin, ov_early + ov_late, wait=True))
    elif fp8 and not (fused_dequant and w == 0):  # the first step, dequantized (each warpgroup its columns;
        # fused_dequant: warpgroup 0 converts its columns of every step inside that step's scores)
        pl.when(end > begin)(lambda: dequantize(kc, w, begin, begin, kv_len))
    scale = scale_log2 * k_scale(kc) if fp8 else scale_log2  # scores -> log2 units

    if w == 0:
        # Transposed scores (score_rows > 0): S^T = K Q^T over the tile's rows in use (wgmma M =
        # the step's keys, N = score_rows), the softmax down the columns, P^T into the P buffer
        # seen transposed. P's rows past score_rows stay 0 (their outputs are 0), and alpha and
        # the row sums there 1; this warpgroup reads alpha and the row sums back in row layout.
        tr = bool(score_rows)
        n = score_rows or BLOCK_H
        key_ax, row_ax = (0, 1) if tr else (1, 0)
        vec_layout = plgpu.Layout.WGMMA.reduce(0) if tr else row_layout
        if tr:
            x_smem[0] = plgpu.layout_cast(jnp.full((BLOCK_H,), 1.0, jnp.float32), row_layout)
            x_smem[1] = plgpu.layout_cast(jnp.full((BLOCK_H,), 1.0, jnp.float32), row_layout)
            p_smem[...] = plgpu.layout_cast(jnp.zeros((BLOCK_H, block_kv), dtype), plgpu.Layout.WGMMA)
            p_t = p_smem.transpose((1, 0)).at[:, pl.ds(0, n)]  # [keys, n]: P^T's columns in use
        plgpu.barrier_wait(q_bar)
        if q_bits:  # (only this warpgroup reads q)
            convert_q(kc, 0, q_rows * Q_GROUPS)
        m_i = plgpu.layout_cast(jnp.full((n,), -jnp.inf, jnp.float32), vec_layout)
        l_i = plgpu.layout_cast(jnp.full((n,), 0.0, jnp.float32), vec_layout)

        def step(k, carry, masked):
            acc, m_i, l_i = carry
            slot = lax.rem(k - begin, jnp.int32(stages))
            kv_start = k * block_kv
            if not fused_dequant:
                with jax.named_scope("kv_wait"):
                    plgpu.barrier_wait(deq_ready if fp8 else kv_ready.at[slot])

            def qk_chunk(s_ref, c: int | None = None):
                """The scores' wgmma over the head dim's 64 columns [64 c, 64 c + 64) (None: all)."""
                kv_c, q_c = None if overlap_dequant else kv_tile(kc, slot), q_smem
                if c is not None:
                    q_c = q_c.at[:, pl.ds(c * 64, 64)]
                    kv_c = deq_chunk(kc, k, c) if overlap_dequant else kv_c.at[:, pl.ds(c * 64, 64)]
                if tr:
                    plgpu.wgmma(s_ref, kv_c, q_c.transpose((1, 0)))
                else:
                    plgpu.wgmma(s_ref, q_c, kv_c.transpose((1, 0)))

            def qk(s_ref):
                if overlap_dequant:  # the f16 copy in three buffers: a wgmma each chunk, in head-dim order
                    for c in range(HEAD_DIM // 64):
                        qk_chunk(s_ref, c)
                    return s_ref[...]
                if not fused_dequant:
                    qk_chunk(s_ref)
                    return s_ref[...]
                # warpgroup 0's columns of step k, a chunk at a time, each chunk's wgmma issued as soon
                # as it is stored (the tensor cores run while the next one converts); then warpgroup
                # 1's half (converted after its P @ V of step k - 1) once it says so (deq_ready)
                with jax.named_scope("deq_wait"):
                    plgpu.barrier_wait(kv_ready.at[slot])
                with jax.named_scope("dequant"):
                    keep = rows_below(kc, kv_len - kv_start) if masked else None
                    chunks = fused_chunks(kc, 0)  # the rope chunk alone, then the V half FUSED_GROUP at a time
                    groups = [chunks[:1]] + [chunks[i:i + FUSED_GROUP]
                                             for i in range(1, len(chunks), FUSED_GROUP)]
                    for group in groups:
                        for c in group:
                            convert_chunk(kc, slot, c, keep)
                        plgpu.commit_smem()  # visible to the wgmmas (async proxy)
                        for c in group:
                            qk_chunk(s_ref, c)
                plgpu.barrier_arrive(kv_consumed.at[slot])  # this warpgroup is done with the fp8 step
                plgpu.barrier_arrive(deq_ready)
                with jax.named_scope("kv_wait"):
                    plgpu.barrier_wait(deq_ready)
                for c in fused_chunks(kc, 1):
                    qk_chunk(s_ref, c)
                return s_ref[...]

            shape = (block_kv, n) if tr else (BLOCK_H, block_kv)
            with jax.named_scope("qk"):
                s = pl.run_scoped(qk, plgpu.ACC(shape, jnp.float32))
            if masked:
                s = mask_scores(kc, s, kv_start, first_pos, kv_len, scale, row_ax, key_ax)
            else:
                s = s * scale
            m_new = jnp.maximum(m_i, s.max(axis=key_ax))
            alpha = jnp.exp2(m_i - m_new)
            p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [row_ax]))

            l_i = l_i * alpha + p.sum(axis=key_ax)

            if not overlap_dequant:  # (overlap_dequant: awaited after step k - 1)
                @pl.when(k > begin)
                @jax.named_scope("p_free_wait")
                def _():
                    plgpu.barrier_wait(sync_b)  # p_free: the P @ V warpgroups are done with step k - 1

            if tr:
                p_t[...] = p.astype(dtype)
                x_smem.at[0, pl.ds(0, n)][...] = alpha
            else:
                p_smem[...] = p.astype(dtype)
                x_smem[0] = alpha
            if masked and not fp8:  # (fp8: dequantize zeroed them)
                # The step past kv_len: zero V's invalid rows (all 512 columns) before any
                # P @ V reads them (their slots may hold NaN; 0 * NaN = NaN). The scores of
                # this step, the only reader of K, are done.
                zero_v_tail(kc, slot, kv_start, kv_len, 0, KV_LORA_RANK)

            plgpu.commit_smem()  # (a warpgroup barrier too: alpha may be read back below)
            plgpu.barrier_arrive(sync_a)  # p_ready
            # its own P @ V half; P from SMEM here too (the interpreter's wgmma takes SMEM left operands only)
            acc = rescale(acc, load_vec(0) if tr and not transposed_pv else alpha)
            if overlap_dequant:
                with jax.named_scope("pv"):
                    acc = overlap_pv(acc, k, 0, ov_early)

                @pl.when(k + 1 < end)
                def _second_half():
                    with jax.named_scope("p_free_wait"):
                        plgpu.barrier_wait(sync_b)  # p_free: warpgroup 1 is done with step k
                    overlap_release(k + 1, ov_late, wait=False)  # (awaited under the P @ V)
            else:
                with jax.named_scope("pv"):
                    acc = pv(acc, 0, slot)
            if not fp8:  # (fp8: the slot is released where it is converted)
                plgpu.barrier_arrive(kv_consumed.at[slot])
            return acc, m_new, l_i

        acc = zeros_acc()
        mid = jnp.clip(lax.div(first_pos + 1, jnp.int32(block_kv)), begin, end)
        carry = lax.fori_loop(begin, mid, functools.partial(step, masked=False), (acc, m_i, l_i))
        acc, m_i, l_i = lax.fori_loop(mid, end, functools.partial(step, masked=True), carry)

        # Hand the row sums over once the P @ V warpgroups are done with the last alpha (warpgroup 1's last
        # p_free).
        @pl.when(end > begin)
        def _():
            plgpu.barrier_wait(sync_b)

        if tr:
            x_smem.at[sums_row, pl.ds(0, n)][...] = l_i
        else:
            x_smem[sums_row] = l_i
        plgpu.commit_smem()
        plgpu.barrier_arrive(sync_a)
        lse = (m_i + jnp.log(l_i) * (1.0 / LN2)) * LN2  # [n]
        l_rows = load_vec(sums_row) if tr and not transposed_pv else l_i
        finish(kc, 0, acc, l_rows, lse, first_tok, ntok)
    else:
        half = 1

        def step(k, acc):
            slot = lax.rem(k - begin, jnp.int32(stages))
            if overlap_dequant:
                # step k's copy is whole: warpgroup 0 is past its P @ V of step k - 1, so V's first half of
                # step k + 1 (that P @ V's buffer) converts while P of step k is computed
                with jax.named_scope("kv_wait"):
                    plgpu.barrier_wait(deq_ready)
                pl.when(k + 1 < end)(lambda: overlap_convert(kc, k + 1, begin, kv_len, ov_early))
            with jax.named_scope("p_ready_wait"):
                plgpu.barrier_wait(sync_a)  # p_ready
            acc = rescale(acc, load_vec(0))
            with jax.named_scope("pv"):
                if overlap_dequant:  # (the first half converted above)
                    acc = overlap_pv(acc, k, 1, [])
                else:
                    acc = pv(acc, half, slot)
            plgpu.barrier_arrive(sync_b)  # p_free
            if overlap_dequant:  # V's second half of step k + 1 (warpgroup 0 converts the other two chunks)
                pl.when(k + 1 < end)(lambda: overlap_release(k + 1, ov_late, wait=False))  # (awaited before)
                return acc
            if not fp8:
                plgpu.barrier_arrive(kv_consumed.at[slot])
            if refill is not None:  # (fp8: the slot was released when step k was dequantized)
                refill(k)
            if fp8:  # the next step, this warpgroup's columns
                pl.when(k + 1 < end)(lambda: dequantize(kc, 1, k + 1, begin, kv_len))
            return acc

        acc = lax.fori_loop(begin, end, step, zeros_acc())
        plgpu.barrier_wait(sync_a)
        finish(kc, half, acc, load_vec(sums_row), None, first_tok, ntok)
