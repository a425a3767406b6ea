"""The KV ring: the request's info and block table staged in shared memory, the q tile's TMA, and each step's pages
TMA'd into a ring slot (one ring shared by the one-chain path, a slot or two a warpgroup on the halves path); pages
past a request's last are never fetched (the last page stands in for them)."""

from __future__ import annotations

import itertools
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.pallas_mosaic_gpu.config import (
    BLOCK_H, INFO_BEGIN, INFO_END, INFO_REQ, INFO_WORDS, TMA_MAX_BOX,
)


def tma_windows(shape) -> list[tuple[tuple[int, int], ...]]:
    """`shape` cut into TMA boxes of at most TMA_MAX_BOX elements along each dimension: (start, size) per dimension.

    A copy into shared memory is cut by its destination's tiling; a prefetch into L2 has none, and a box wider than
    TMA_MAX_BOX (a KV row's 576 columns) aborts the process when its descriptor is made, at the first launch."""
    return list(itertools.product(*[[(s0, min(TMA_MAX_BOX, n - s0)) for s0 in range(0, n, TMA_MAX_BOX)]
                                    for n in shape]))


def prefetch_to_l2(ref) -> None:
    """`plgpu.async_prefetch` of the GMEM ref `ref`, one TMA box (tma_windows) at a time."""
    for window in tma_windows(ref.shape):
        plgpu.async_prefetch(ref.at[tuple(pl.ds(s0, n) for s0, n in window)])


def tile_info(kc):
    """(first token, tokens in the tile, first position, KV length seen, last page, step range): the piece's steps
    that the tile's last token sees."""
    block_kv, page_size, q_toks = kc.plan.block_kv, kc.plan.page_size, kc.plan.q_toks
    tpt = kc.plan.tpt
    info_bar, info_smem, lt = kc.info_bar, kc.info_smem, kc.lt
    plgpu.barrier_wait(info_bar)
    q_start = info_smem[0]
    q_len = info_smem[1]
    seq_len = info_smem[2]
    first_qi = lt * tpt
    ntok = jnp.clip(q_len - first_qi, 0, q_toks)
    first_tok = q_start + first_qi
    first_pos = seq_len - q_len + first_qi
    kv_len = jnp.where(ntok > 0, first_pos + ntok, 0)  # KV the tile's last token sees
    last_page = lax.div(jnp.maximum(seq_len - 1, 0), jnp.int32(page_size))
    n_steps = lax.div(kv_len + (block_kv - 1), jnp.int32(block_kv))
    begin = jnp.minimum(info_smem[INFO_BEGIN], n_steps)
    end = jnp.minimum(info_smem[INFO_END], n_steps)
    return first_tok, ntok, first_pos, kv_len, last_page, begin, end


def load_info(kc):
    """The piece's row: its request's info, its steps and the block-table chunk of its first step, in one TMA."""
    bt_chunk = kc.plan.bt_chunk
    i_smem, info_bar, piece, piece_ref = kc.i_smem, kc.info_bar, kc.piece, kc.piece_ref
    plgpu.copy_gmem_to_smem(piece_ref.at[piece, pl.ds(0, INFO_WORDS + bt_chunk)],
                            i_smem.at[pl.ds(0, INFO_WORDS + bt_chunk)], info_bar)


def first_chunk(kc, begin):
    """The block-table chunk of step `begin`'s first page: the one the piece's row brings."""
    return lax.div(first_page(kc, begin), jnp.int32(kc.plan.bt_chunk))


def load_q(kc, first_tok):
    """The query tile, straight from q [T, H, 576]."""
    hp, num_tokens, q_bits, q_toks, tpt = kc.plan.hp, kc.plan.num_tokens, kc.plan.q_bits, kc.plan.q_toks, kc.plan.tpt
    hb, q_bar, q_bf16, q_ref, q_smem = kc.hb, kc.q_bar, kc.q_bf16, kc.q_ref, kc.q_smem
    q_dst = q_bf16 if q_bits else q_smem  # (q_bits: the bf16 view of the same bytes)
    if tpt == 1:
        plgpu.copy_gmem_to_smem(q_ref.at[first_tok, pl.ds(hb * BLOCK_H, BLOCK_H)], q_dst, q_bar)
    else:
        for j in range(q_toks):  # rows of tokens past the tile's last repeat a valid token: never written
            tok = jnp.minimum(first_tok + j, num_tokens - 1)
            plgpu.copy_gmem_to_smem(q_ref.at[tok], q_dst.at[pl.ds(j * hp, hp)], q_bar)


def first_page(kc, k):
    pages_per_step, steps_per_page = kc.plan.pages_per_step, kc.plan.steps_per_page
    return lax.div(k, jnp.int32(steps_per_page)) if pages_per_step == 1 else k * pages_per_step


def step_rows(kc, k, page):
    """The rows of KV step k in `page`: the whole page unless a page holds several steps (pair_ring: its
    pair rows, half as many)."""
    block_kv, pair_ring, steps_per_page = kc.plan.block_kv, kc.plan.pair_ring, kc.plan.steps_per_page
    kv_ref = kc.kv_ref
    if steps_per_page == 1:
        return kv_ref.at[page]
    rows = block_kv // 2 if pair_ring else block_kv
    off = lax.rem(k, jnp.int32(steps_per_page)) * rows
    return kv_ref.at[page, pl.ds(off, rows)]


def issue_step(kc, i, begin, last_page):
    """TMA of KV step begin + i into slot i % stages (the slot is free), signalling
    kv_ready[slot]; stages the block-table chunk it needs when it differs from the one
    in SMEM: step begin's came with the info, then the previous step's (steps go in order)."""
    bt_chunk, page_size, pages_per_step = kc.plan.bt_chunk, kc.plan.page_size, kc.plan.pages_per_step
    stages = kc.plan.stages
    bt_bar, i_smem, kv_ready, kv_smem = kc.bt_bar, kc.i_smem, kc.kv_ready, kc.kv_smem
    sched_ref = kc.sched_ref
    k = begin + i
    slot = lax.rem(i, jnp.int32(stages))
    lp0 = first_page(kc, k)
    chunk = lax.div(lp0, jnp.int32(bt_chunk))
    prev_chunk = first_chunk(kc, jnp.maximum(k - 1, begin))

    @pl.when(chunk != prev_chunk)
    def _():
        src = sched_ref.at[kc.info_smem[INFO_REQ], pl.ds(INFO_WORDS + chunk * bt_chunk, bt_chunk)]
        plgpu.copy_gmem_to_smem(src, i_smem.at[pl.ds(INFO_WORDS, bt_chunk)], bt_bar)
        plgpu.barrier_wait(bt_bar)

    def page_at(lp):
        """Page id of the request's logical page lp (in the staged chunk)."""
        return i_smem[INFO_WORDS + lp - chunk * bt_chunk]

    if pages_per_step == 1:
        plgpu.copy_gmem_to_smem(step_rows(kc, k, page_at(lp0)), kv_smem.at[slot], kv_ready.at[slot])
    else:
        for j in range(pages_per_step):
            # Pages past the request's last one are never dereferenced (their
            # rows are past kv_len): the last page stands in for them.
            page = page_at(jnp.minimum(lp0 + j, last_page))
            plgpu.copy_gmem_to_smem(step_rows(kc, k, page), kv_smem.at[slot, pl.ds(j * page_size, page_size)],
                                    kv_ready.at[slot])


def drain(kc, n):
    """Observe the last releases of every slot, so that each barrier phase is awaited
    by its consumer (the interpreter checks this)."""
    stages = kc.plan.stages
    kv_consumed = kc.kv_consumed

    @pl.loop(jnp.maximum(n - stages, 0), n)
    def _drain(i):
        plgpu.barrier_wait(kv_consumed.at[lax.rem(i, jnp.int32(stages))])


def half_slot(kc, w: int, k):
    """(kv_halves) Warpgroup w's ring slot of step k: w (pv_registers: 2 w + k % 2, two a warpgroup)."""
    pv_registers = kc.plan.pv_registers
    return 2 * w + lax.rem(k, jnp.int32(2)) if pv_registers else w


def stage_half_bt(kc, w: int, k, prev_k):
    """(kv_halves) Warpgroup w's block-table buffer restaged when step k's chunk differs from the one there:
    prev_k's (the step before k in this warpgroup's range; -1: none yet, where warpgroup 0's buffer holds the
    chunk of the piece's first step, loaded with the info, and 1's nothing). Returns (step k's first page's index,
    its block-table chunk)."""
    bt_chunk = kc.plan.bt_chunk
    bt_bar, bt_bar_wg1, i_smem, sched_ref = kc.bt_bar, kc.bt_bar_wg1, kc.i_smem, kc.sched_ref
    bar = bt_bar if w == 0 else bt_bar_wg1
    base = INFO_WORDS + w * bt_chunk
    lp0 = first_page(kc, k)
    chunk = lax.div(lp0, jnp.int32(bt_chunk))
    staged = jnp.where(prev_k >= 0, first_chunk(kc, jnp.maximum(prev_k, 0)),
                       first_chunk(kc, kc.info_smem[INFO_BEGIN]) if w == 0 else jnp.int32(-1))

    @pl.when(chunk != staged)
    def _():
        plgpu.copy_gmem_to_smem(sched_ref.at[kc.info_smem[INFO_REQ], pl.ds(INFO_WORDS + chunk * bt_chunk, bt_chunk)],
                                i_smem.at[pl.ds(base, bt_chunk)], bar)
        plgpu.barrier_wait(bar)

    return lp0, chunk


def half_pages(kc, w: int, lp0, chunk, last_page):
    """(kv_halves) The cache pages of the step whose first page is lp0 (in block-table chunk `chunk`, staged in
    warpgroup w's buffer: stage_half_bt), pages_per_step of them: pages past the request's last, the last
    (its rows past kv_len)."""
    bt_chunk, pages_per_step = kc.plan.bt_chunk, kc.plan.pages_per_step
    i_smem = kc.i_smem
    base = INFO_WORDS + w * bt_chunk

    def page_at(lp):
        return i_smem[base + lp - chunk * bt_chunk]

    if pages_per_step == 1:
        return [page_at(lp0)]
    return [page_at(jnp.minimum(lp0 + j, last_page)) for j in range(pages_per_step)]


def issue_half_step(kc, w: int, k, prev_k, last_page):
    """(kv_halves) TMA of KV step k into warpgroup w's ring slot (half_slot; kv_ready's). Its block-table
    buffer (w) is restaged first when step k's chunk differs from the one there (stage_half_bt)."""
    page_size, pages_per_step, pair_ring = kc.plan.page_size, kc.plan.pages_per_step, kc.plan.pair_ring
    kv_ready, kv_smem = kc.kv_ready, kc.kv_smem
    lp0, chunk = stage_half_bt(kc, w, k, prev_k)
    slot = half_slot(kc, w, k)

    def copy(src, rows=None):  # (src: [rows, 576] of the cache (pair_ring: [rows, 1152] of its pairs); rows:
        # the slot's rows it fills)
        at = (slot,) if rows is None else (slot, rows)
        plgpu.copy_gmem_to_smem(src, kv_smem.at[at], kv_ready.at[slot])

    if pages_per_step == 1:
        [page] = half_pages(kc, w, lp0, chunk, last_page)
        copy(step_rows(kc, k, page))
    else:
        rows = page_size // 2 if pair_ring else page_size  # (the slot's rows a page fills)
        for j, page in enumerate(half_pages(kc, w, lp0, chunk, last_page)):
            copy(step_rows(kc, k, page), pl.ds(j * rows, rows))
