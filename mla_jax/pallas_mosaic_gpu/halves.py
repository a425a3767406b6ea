"""The warpgroup-halves path (fp8, both transposed at 16 or 32 rows): each compute warpgroup runs whole steps alone
on its own half of the split's steps (its ring slots, column softmax, P and O^T [512, rows]); the scores' left
operands come from registers as each chunk is converted, and (v_from_ring) P @ V's V^T from the ring too. The two
partials merge through shared memory at the end."""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.pallas_mosaic_gpu.config import (
    BLOCK_H, HEAD_DIM, KV_LORA_RANK, LN2, NUM_COMPUTE_WGS, QK_ROPE_HEAD_DIM, V_HALF,
)
from mla_jax.pallas_mosaic_gpu.layouts import (
    F16_TILES, FP8_RING_TILES, PAIR_TILES, Q_GROUPS, _load_k_pair_fp8, _rewrap_8bit_as_wgmma, _store_k_pair_fp8,
)
from mla_jax.pallas_mosaic_gpu.fp8 import (
    _convert_vt_fp8, _load_vt_fp8_words, _load_vt_pair_words, convert_q, k_scale, rows_below,
)
from mla_jax.pallas_mosaic_gpu.ring import half_slot, issue_half_step, load_info, load_q, tile_info
from mla_jax.pallas_mosaic_gpu.softmax import col_reduce, mask_scores, store_tiled
from mla_jax.pallas_mosaic_gpu.output import finish


def compute_wg_halves(kc, w: int):
    """(kv_halves) Warpgroup w: the tile's info (1 loads it, and q), then its half of the split's steps."""
    pv_registers = kc.plan.pv_registers
    if w == 1:
        load_info(kc)
    first_tok, ntok, first_pos, kv_len, last_page, begin, end = tile_info(kc)

    @pl.when(ntok > 0)
    def _():
        if w == 1:
            load_q(kc, first_tok)
        # warpgroup 0 the first ceil(n / 2) steps (as ceil(n x 50 / 100))
        mid = begin + lax.div((end - begin) * 50 + 99, jnp.int32(100))
        b, e = (begin, mid) if w == 0 else (mid, end)
        pl.when(e > b)(lambda: issue_half_step(kc, w, b, jnp.int32(-1), last_page))
        if pv_registers:  # (its second slot)
            pl.when(e > b + 1)(lambda: issue_half_step(kc, w, b + 1, b, last_page))
        compute_tile_halves(kc, w, first_tok, ntok, first_pos, kv_len, b, e, last_page)


def compute_tile_halves(kc, w, first_tok, ntok, first_pos, kv_len, b, e, last_page):
    """(kv_halves) Warpgroup w runs steps [b, e) alone: per step it converts each 64-column chunk of the fp8 slot in
    registers, hands it to its scores' wgmma as it is (S^T = K Q^T, 9 wgmmas; V's f16 copy stored for P @ V unless
    pv_registers) and refills its ring slot, then the softmax down the columns (the sums kept [64, n] and reduced
    once at the end), P^T (its P buffer) and O^T += V^T P^T ([512, n], 8 wgmmas of M = 64). Then merge_halves."""
    block_kv, dtype, interpret, load_ahead = kc.plan.block_kv, kc.plan.dtype, kc.plan.interpret, kc.plan.load_ahead
    pair_ring, pv_registers, pv_wait = kc.plan.pair_ring, kc.plan.pv_registers, kc.plan.pv_wait
    q_bits, q_rows, qk_permuted, scale_log2 = kc.plan.q_bits, kc.plan.q_rows, kc.plan.qk_permuted, kc.plan.scale_log2
    score_rows, transforms, zero_tail = kc.plan.score_rows, kc.plan.transforms, kc.plan.zero_tail
    accumulate, info_smem, kv_ready, kv_smem, kv_v = kc.accumulate, kc.info_smem, kc.kv_ready, kc.kv_smem, kc.kv_v
    p_smem, q_bar, q_smem, sync_a = kc.p_smem, kc.q_bar, kc.q_smem, kc.sync_a
    n = score_rows
    wg_layout = plgpu.Layout.WGMMA

    def v_w():
        """This warpgroup's f16 copy of V, [block_kv, 512]; its index read from info word 4 (0) at each use, as
        kv_tile's: with a constant address the compiler hoists the descriptors of the step's 17 wgmmas out of
        the loop, and they spill."""
        return kv_v.at[info_smem[4] + w]

    def p_w():
        """This warpgroup's P buffer [n, block_kv] (P^T's wgmma operand seen transposed; its index as v_w's)."""
        return p_smem.at[info_smem[4] + w]

    scale = scale_log2 * k_scale(kc)
    plgpu.barrier_wait(q_bar)
    if q_bits:  # each warpgroup half the tile's rows, then both wait for the other's (both read all of q)
        per_wg = q_rows * Q_GROUPS // NUM_COMPUTE_WGS
        convert_q(kc, w * per_wg, per_wg)
        plgpu.barrier_arrive(sync_a)
        plgpu.barrier_wait(sync_a)

    def softmax_store(s, m_i, l_i):
        """A step's online softmax down the columns of its scaled (and masked) scores s [64, n]: (alpha, the
        new column max, the sums), P^T stored into this warpgroup's P buffer and fenced for its P @ V
        (the sums kept [64, n], reduced down their columns after the last step)."""
        m_new = jnp.maximum(m_i, col_reduce(kc, s, "max", w))
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [1]))
        l_i = l_i * lax.broadcast_in_dim(alpha, p.shape, [1]) + p
        # (this warpgroup's P @ V of the step before, P's reader, is done)
        store_tiled(kc, p_w(), p.astype(dtype), wg_layout, transforms, transpose=True)
        plgpu.commit_smem()
        return alpha, m_new, l_i

    def step(k, carry, masked: bool):
        acc, m_i, l_i = carry
        kv_start = k * block_kv
        slot = half_slot(kc, w, k)
        with jax.named_scope("kv_wait"):
            plgpu.barrier_wait(kv_ready.at[slot])
        masked_keys = masked  # (zero_tail: the slot's rows past kv_len zeroed here, the keys then unmasked)
        if masked and zero_tail:
            zero_rows_past(slot, kv_len - kv_start)
            masked_keys = False
        s = scores_from_registers(k, slot, kv_start, masked_keys)
        # (load_ahead: P @ V's first V^T chunk loaded before the softmax, converted after it)
        words0 = load_vt_words(slot, 0) if pv_registers else None
        if masked:
            s = mask_scores(kc, s, kv_start, first_pos, kv_len, scale, row_ax=1, key_ax=0)
        else:
            s = s * scale
        alpha, m_new, l_i = softmax_store(s, m_i, l_i)

        def pv(acc_ref):  # 8 wgmmas (commit groups), V's columns [64 c, 64 c + 64) the c-th's
            if pv_registers:
                pv_from_slot(acc_ref, k, slot, words0)
                return
            pv_from_copy(acc_ref, KV_LORA_RANK // 64)

        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [1])
        with jax.named_scope("pv"):
            acc = accumulate(acc, pv)
        return acc, m_new, l_i

    # (qk_permuted) the fp8 chunks' load layout, 4 values a thread, and the WGMMA-layout view of its registers
    ld_layout = plgpu.Layout.WGMMA_8BIT if qk_permuted else wg_layout

    def as_operand(x):
        """(qk_permuted) x [64, 64] f16 in ld_layout -> the scores' left operand: its registers as the WGMMA
        layout's, columns permuted by QK_PERM_64 within each 16 (never in interpret mode: the wrapper passes
        qk_permuted=False there)."""
        if not qk_permuted:
            return x

        @plgpu.inline_mgpu(arg_types=(ld_layout,),
                           return_type=plgpu.ShapeDtypeStruct(x.shape, x.dtype, layout=wg_layout))
        def rewrap(ctx, fa):
            del ctx
            return _rewrap_8bit_as_wgmma(fa)

        return rewrap(x)

    def pair_window(slot, i, parity: int):
        """(pair_ring) chunk 2 i + parity's window of the slot: its columns from tile column i, 5 + parity
        tile columns (_pair_window; i a Python int or traced)."""
        start = 128 * i if isinstance(i, int) else pl.multiple_of(i * 128, 128)
        return kv_smem.at[slot, :, pl.ds(start, 640 + 128 * parity)]

    def load_pair_chunk(slot, i, parity: int):
        """(pair_ring) chunk 2 i + parity's fp8 values [64, 64] in ld_layout (_load_k_pair_fp8)."""
        @plgpu.inline_mgpu(arg_types=(plgpu.RefType(PAIR_TILES),),
                           return_type=plgpu.ShapeDtypeStruct((64, 64), jnp.float8_e4m3fn, layout=ld_layout))
        def load(ctx, r):
            del ctx
            return _load_k_pair_fp8(r, parity)

        return load(pair_window(slot, i, parity))

    def store_pair_chunk(x, slot, i, parity: int):
        """(pair_ring) load_pair_chunk's inverse (_store_k_pair_fp8)."""
        @plgpu.inline_mgpu(arg_types=(ld_layout, plgpu.RefType(PAIR_TILES)))
        def store(ctx, fa, r):
            del ctx
            _store_k_pair_fp8(fa, r, parity)

        store(x, pair_window(slot, i, parity))

    def zero_rows_past(slot, valid):
        """(zero_tail) The slot's rows from `valid` on become 0 in shared memory, all HEAD_DIM columns (their
        cache slots may hold NaN; pages past the last are clamped), each 64-column chunk loaded in ld_layout,
        masked and stored back; then a warpgroup barrier (each thread reads the others' rows after)."""
        with jax.named_scope("zero_tail"):
            # (Mosaic GPU has no select on 8-bit values, only bitwise operations: an AND with a byte mask)
            ones = jnp.where(rows_below(kc, valid, ld_layout), jnp.int32(-1), jnp.int32(0)).astype(jnp.int8)

            if pair_ring:  # (each chunk's bytes from its window, masked and stored back by the same threads)
                for c in range(HEAD_DIM // 64):
                    x = lax.bitcast_convert_type(load_pair_chunk(slot, c // 2, c % 2), jnp.int8) & ones
                    store_pair_chunk(lax.bitcast_convert_type(x, jnp.float8_e4m3fn), slot, c // 2, c % 2)
            else:
                @pl.loop(0, HEAD_DIM // 64)
                def _(c):
                    ref = kv_smem.at[slot, :, pl.ds(pl.multiple_of(c * 64, 64), 64)]
                    x = lax.bitcast_convert_type(plgpu.load(ref, layout=ld_layout), jnp.int8) & ones
                    store_tiled(kc, ref, lax.bitcast_convert_type(x, jnp.float8_e4m3fn), ld_layout, FP8_RING_TILES)

            plgpu.commit_smem()

    def pv_from_copy(acc_ref, chunks: int):
        """O^T's first `chunks` 64-row chunks += V^T P^T, V^T read from this warpgroup's f16 copy of V."""
        for c in range(chunks):
            plgpu.wgmma(acc_ref.at[pl.ds(c * 64, 64)], v_w().at[:, pl.ds(c * 64, 64)].transpose((1, 0)),
                        p_w().transpose((1, 0)))

    def load_vt_words(slot, c: int):
        """(load_ahead) chunk c's V^T words (_load_vt_fp8_words), unconverted (pair_ring: from its window,
        _load_vt_pair_words)."""
        if pair_ring:
            tiles, ref = PAIR_TILES, pair_window(slot, c // 2, c % 2)
            words = functools.partial(_load_vt_pair_words, parity=c % 2)
        else:
            tiles, ref, words = FP8_RING_TILES, kv_smem.at[slot, :, pl.ds(c * 64, 64)], _load_vt_fp8_words

        @plgpu.inline_mgpu(arg_types=(plgpu.RefType(tiles),),
                           return_type=plgpu.ShapeDtypeStruct((64, 32), jnp.float16, layout=wg_layout))
        def load(ctx, r):
            del ctx
            return words(r)

        return load(ref)

    def convert_vt(words):
        """(load_ahead) V^T [64, block_kv] from load_vt_words's words (_convert_vt_fp8)."""
        @plgpu.inline_mgpu(arg_types=(wg_layout,),
                           return_type=plgpu.ShapeDtypeStruct((64, block_kv), dtype, layout=wg_layout))
        def convert(ctx, fa):
            del ctx
            return _convert_vt_fp8(fa)

        return convert(words)

    def pv_from_slot(acc_ref, k, slot, words0):
        """(pv_registers) O^T += V^T P^T, 8 wgmmas of M = 64 (O^T's rows permuted by PV_PERM), each left
        operand loaded from the fp8 slot (its tail past kv_len zeroed there on the masked step), at most
        pv_wait of them left running as the next is issued (8: all, one wait after); then the slot, read,
        is refilled with step k + 2. Chunk c + 1's words are loaded before chunk c is converted (chunk 0's,
        words0, before the softmax), and P's buffer index read once a step."""
        p_ref = p_w()
        words = words0
        for c in range(KV_LORA_RANK // 64):
            nxt = load_vt_words(slot, c + 1) if c + 1 < KV_LORA_RANK // 64 else None
            vt = convert_vt(words)
            words = nxt
            plgpu.wgmma(acc_ref.at[pl.ds(c * 64, 64)], vt, p_ref.transpose((1, 0)))
            if pv_wait < KV_LORA_RANK // 64:  # (at most pv_wait chunks' wgmmas left running)
                plgpu.wgmma_wait(pv_wait)
        plgpu.commit_smem()  # the slot's reads done before its refill
        pl.when(k + 2 < e)(lambda: issue_half_step(kc, w, k + 2, k + 1, last_page))

    def rope_rows(slot, kv_start, masked: bool):
        """The step's rope columns [block_kv, 64] in registers (WGMMA layout), rows past kv_len 0
        (qk_permuted: as_operand's view)."""
        rope = plgpu.load(kv_smem.at[slot, :, pl.ds(KV_LORA_RANK, QK_ROPE_HEAD_DIM)], layout=ld_layout)
        return rope_operand(rope, kv_start, masked)

    def rope_operand(rope, kv_start, masked: bool):
        """rope_rows's conversion of the loaded rope columns."""
        rope = rope.astype(dtype)
        if masked:
            rope = jnp.where(rows_below(kc, kv_len - kv_start, ld_layout), rope, jnp.zeros_like(rope))
        return as_operand(rope)

    def rope_scores(s_ref, rope):
        """The rope columns' scores into s_ref: the wgmma's left operand from registers (compiled)."""
        if not interpret:  # (the interpreter takes no left operand in registers: scores_rope_ref)
            plgpu.wgmma(s_ref, rope, q_smem.at[:, pl.ds(KV_LORA_RANK, QK_ROPE_HEAD_DIM)].transpose((1, 0)))

    def scores_rope_ref(s, rope):
        """(interpret) the rope columns' scores, the same products (exact in fp32), summed by XLA."""
        q_rope = q_smem[:, pl.ds(KV_LORA_RANK, QK_ROPE_HEAD_DIM)].astype(jnp.float32)
        return s + jnp.dot(rope.astype(jnp.float32), q_rope.T, precision=lax.Precision.HIGHEST)

    def scores_from_registers(k, slot, kv_start, masked: bool):
        """S^T = K Q^T with every left operand in registers: each 64-column chunk of V is
        loaded from the fp8 slot in the WGMMA layout, converted, stored to V's f16 copy (for P @ V; not with
        pv_registers, whose P @ V loads V^T from the slot) and
        handed to its scores' wgmma as it is, so the scores never read the copy back from shared memory.
        Then the slot is refilled."""
        keep = rows_below(kc, kv_len - kv_start, ld_layout) if masked else None

        def qk(s_ref):
            def offset(c):  # (the column where chunk c starts)
                return c * 64 if isinstance(c, int) else pl.multiple_of(c * 64, 64)

            def raw(c, parity: int = 0):  # chunk c's fp8 values, unconverted (pair_ring: chunk 2 c + parity)
                assert pair_ring or parity == 0
                if pair_ring:
                    return load_pair_chunk(slot, c, parity)
                return plgpu.load(kv_smem.at[slot, :, pl.ds(offset(c), 64)], layout=ld_layout)

            def chunk_from(c, x, c0=None):
                """Chunk c's conversion from its loaded values x, V's copy (not with pv_registers, whose
                P @ V loads V from the slot) and its scores' wgmma (c0: its offset, if already computed)."""
                x = x.astype(dtype)
                if keep is not None:
                    x = jnp.where(keep, x, jnp.zeros_like(x))
                cols = pl.ds(offset(c) if c0 is None else c0, 64)
                if not pv_registers:
                    store_tiled(kc, v_w().at[:, cols], x, ld_layout, F16_TILES)
                q_t = q_smem.at[:, cols].transpose((1, 0))
                if interpret:  # (no left operand in registers: the copy just written, the same values)
                    plgpu.wgmma(s_ref, v_w().at[:, cols], q_t)
                else:
                    plgpu.wgmma(s_ref, as_operand(x), q_t)
                # A wgmma reads its left operand's registers while it runs, and writing them before it is
                # done is undefined (PTX ISA, wgmma.mma_async): the chunk before this one (its registers
                # the next chunk's) is waited for here, this one's wgmma running under the next's load.
                plgpu.wgmma_wait(1)

            def chunk(c):
                c0 = offset(c)
                chunk_from(c, plgpu.load(kv_smem.at[slot, :, pl.ds(c0, 64)], layout=ld_layout), c0)

            with jax.named_scope("dequant"):
                if load_ahead:  # each chunk's values loaded a chunk ahead of its conversion
                    # (pair_ring's raw: chunk 2 c + parity)
                    rope_raw = raw(KV_LORA_RANK // 128) if pair_ring else raw(KV_LORA_RANK // 64)
                    first = raw(0)
                    rope = rope_operand(rope_raw, kv_start, masked)
                    rope_scores(s_ref, rope)

                    def two_chunks(i, x):  # (two chunks an iteration, their registers apart, as below)
                        x1 = raw(i, 1) if pair_ring else raw(2 * i + 1)
                        chunk_from(2 * i, x)
                        # (i = 3: chunk 8, the rope columns: loaded, unused)
                        x2 = raw(i + 1) if pair_ring else raw(2 * i + 2)
                        chunk_from(2 * i + 1, x1)
                        return x2

                    lax.fori_loop(0, KV_LORA_RANK // 128, two_chunks, first)
                else:
                    rope = rope_rows(slot, kv_start, masked)
                    rope_scores(s_ref, rope)

                    @pl.loop(0, KV_LORA_RANK // 128)  # two chunks an iteration, their registers apart
                    def _(i):
                        chunk(2 * i)
                        chunk(2 * i + 1)

                if not pv_registers:  # (pv_registers: the slot is refilled after P @ V's loads)
                    plgpu.commit_smem()  # V's copy visible to P @ V; the slot's reads done before its refill
            if not pv_registers:
                pl.when(k + 1 < e)(lambda: issue_half_step(kc, w, k + 1, k, last_page))
            with jax.named_scope("qk"):
                return s_ref[...], rope

        s, rope = pl.run_scoped(qk, plgpu.ACC((block_kv, n), jnp.float32))
        return scores_rope_ref(s, rope) if interpret else s

    col_layout = wg_layout.reduce(0)
    carry = (plgpu.layout_cast(jnp.full((KV_LORA_RANK, n), 0.0, jnp.float32), wg_layout),
             plgpu.layout_cast(jnp.full((n,), -jnp.inf, jnp.float32), col_layout),
             plgpu.layout_cast(jnp.full((block_kv, n), 0.0, jnp.float32), wg_layout))
    mid = jnp.clip(lax.div(first_pos + 1, jnp.int32(block_kv)), b, e)  # steps before it skip the mask
    carry = lax.fori_loop(b, mid, functools.partial(step, masked=False), carry)
    acc, m_i, l_i = lax.fori_loop(mid, e, functools.partial(step, masked=True), carry)
    l_i = col_reduce(kc, l_i, "add", w)

    merge_halves(kc, w, acc, m_i, l_i, first_tok, ntok)


def merge_halves(kc, w, acc, m_i, l_i, first_tok, ntok):
    """(kv_halves) The two warpgroups' partials (column max m_i, sums l_i, O^T acc [512, n]) merged through shared
    memory, as split-KV's combine merges splits: each writes its max, sums and the O^T half the other one writes
    out, then finishes its own half (`finish`, transposed P @ V's)."""
    n = kc.plan.score_rows
    m_smem, sync_a, x_smem = kc.m_smem, kc.sync_a, kc.x_smem
    wg_layout = plgpu.Layout.WGMMA
    col_layout = wg_layout.reduce(0)
    # The merge. m_smem aliases q, the ring and V's copies (and the stage, written after m_smem's reads):
    # both warpgroups first finish their steps.
    plgpu.barrier_arrive(sync_a)
    plgpu.barrier_wait(sync_a)
    x_smem.at[2 + w, pl.ds(0, n)][...] = m_i
    x_smem.at[4 + w, pl.ds(0, n)][...] = l_i
    mine, theirs = (acc[:V_HALF], acc[V_HALF:]) if w == 0 else (acc[V_HALF:], acc[:V_HALF])
    m_smem[1 - w] = theirs  # the other warpgroup's output half of this warpgroup's partial
    plgpu.barrier_arrive(sync_a)
    plgpu.barrier_wait(sync_a)
    m_o = plgpu.load(x_smem.at[3 - w, pl.ds(0, n)], layout=col_layout)
    l_o = plgpu.load(x_smem.at[5 - w, pl.ds(0, n)], layout=col_layout)
    m_tot = jnp.maximum(m_i, m_o)
    m_ref = jnp.where(m_tot == -jnp.inf, 0.0, m_tot)  # (no step at all: the sums 0, the output 0)
    f_mine, f_o = jnp.exp2(m_i - m_ref), jnp.exp2(m_o - m_ref)
    l_tot = l_i * f_mine + l_o * f_o
    o_t = (mine * lax.broadcast_in_dim(f_mine, mine.shape, [1])
           + plgpu.load(m_smem.at[w], layout=wg_layout) * lax.broadcast_in_dim(f_o, mine.shape, [1]))
    if w == 0:  # the row sums for transpose_out (rows past n: 1)
        x_smem[1] = plgpu.layout_cast(jnp.full((BLOCK_H,), 1.0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        x_smem.at[1, pl.ds(0, n)][...] = l_tot
    plgpu.barrier_arrive(sync_a)
    plgpu.barrier_wait(sync_a)  # both read x_smem's max and sums; the row sums written
    lse = (m_tot + jnp.log(l_tot) * (1.0 / LN2)) * LN2 if w == 0 else None
    finish(kc, w, o_t, l_tot, lse, first_tok, ntok)
