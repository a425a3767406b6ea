"""Sparse MLA decode on Hopper (DeepSeek-V3.2's DSA, `mla_spec.sparse`): the dense Mosaic GPU kernel's one-chain
step with each 64-key step gathered from arbitrary cache slots. This module: the 16-bit cache; the fp8_ds_mla cache
is `sparse_fp8.py`'s kernel (the same schedule, gather mbarriers and output stage; `sparse_decode` picks by
cache_format).

Work split. One CTA per (query token, 64-row head tile, split): H >= 64 fills H // 64 tiles of one token; H < 64 (8,
16, 32 after padding) uses the tile's first H rows, one token a CTA. Tokens are not packed into a tile as the dense
kernel packs them, because two tokens of a tile would need the same keys and here every token has its own. A
token's steps (steps = ceil(topk / 64)) are cut into num_splits splits of S = ceil(steps / num_splits) whole steps:
split s runs the token's steps [s S, min((s + 1) S, n)) (n from the token's header; a split past n runs none), its
index chunk ring and gather pipeline starting at step s S (ring slots and mbarrier parities count from there). With
one split the CTA writes the final out and lse (the dense output stage, `finish_token`); with more, each writes its
float32 partial (`write_partial`: out normalized over its steps [S, T, H, 512], its lse [S, T, H]; out 0 and lse -inf
where it ran no step or saw only masked keys) through a float32 stage [2, 64, 256] (128 KiB, a member of the union
over q and the ring, as the 16-bit stage: it fits, the union is 216 KiB here and 185 KiB in sparse_fp8.py), and
`mla_jax.combine` merges them by lse (an lse -inf partial weighs 0; a NaN lse gives NaN; interpret mode: its jnp
formula). `sparse_num_splits` picks num_splits: one wave of CTAs, num_sms // (T x head tiles) a (token, head tile),
at least MIN_STEPS_PER_SPLIT = 4 steps a split (the Triton sparse kernel's value), 1 where T x head tiles fill the
SMs (DeepSeek-V3.2's decode size, 128 heads and 64 tokens: 128 CTAs); at topk 2048 and 1 to 8 tokens, 8 splits.
Timed only as it picks (an H100, the `sparse` grid of docs/performance.md: 1.6-2.4x FA3 at 1-32 tokens, where it
splits); other split counts, and the partials' write and merge against the idle SMs they fill, are not timed.

The step is the dense kernel's FlashMLA split (one_chain.py): warpgroup 0 computes S = Q K^T of 64 keys, the
online softmax and P, hands P and alpha over, and does P @ V for output columns [0, 256); warpgroup 1 does P @ V for
[256, 512) and fills the two-stage ring, so its P @ V of step k runs under warpgroup 0's scores of step k + 1. The
softmax, the accumulation (`accumulate_wgmma`) and the output stage (`output.finish`) are the dense kernel's.

The gather. A step's 64 keys are 64 arbitrary cache rows (slot = block * page_size + offset, any page size: the
cache is seen as [num_slots, 576]). What Mosaic GPU offers on Hopper, and what lowers:
  - a TMA per row: `plgpu.copy_gmem_to_smem` of a [1, 576] slice into row r of the ring's tiled (8, 64) and
    128-byte-swizzled slot is refused by the lowering ("slice start and size divisible by the tile size (8)");
    the interpreter takes it. Below Pallas, a row is 9 TMA boxes of [1, 64] (one per 64-column swizzle tile: a
    row's 128-byte pieces are 1 KiB apart in the slot), 576 TMA issues a step from one thread, each with a
    descriptor: not taken.
  - registers: 128 threads load 72 KiB a step with vector loads and store them swizzled (FlashMLA's sparse fp8
    decode does this in a producer warpgroup that also dequantizes), 36 16-byte loads a thread in flight: warpgroup
    1 also holds its 64 x 256 fp32 accumulator (128 registers), and a third warpgroup caps every thread at 168
    registers (the dense kernel's reason not to have one). Not taken.
  - cp.async (LDGSTS, Ampere's asynchronous copy, still on Hopper): each of warpgroup 1's 128 threads copies 16
    bytes global -> shared per instruction to an address it computes, no registers held, completion counted on an
    mbarrier (`cp.async.mbarrier.arrive.noinc`). Taken: thread i copies half of row i // 2 (its 36 16-byte pieces of
    even or odd index, into the swizzled (8, 64) tile layout the wgmmas read), one index read a thread a step. Pallas
    exposes cp.async only before Hopper (copy_gmem_to_smem falls back to it on sm80), so the gather is inline Mosaic
    GPU (`plgpu.inline_mgpu`: nvvm.cp_async_shared_global), with an mbarrier of its own a ring slot (an int64 word
    in shared memory, initialised for 128 arrivals; Pallas barriers cannot be passed to inline Mosaic GPU) and
    warpgroup 0 waiting on it by parity (each slot's phase is the step's (i // 2) % 2). cp.async writes through the
    generic proxy: the waiting warpgroups fence (`commit_smem`) before their wgmmas read the slot.
  Interpret mode has no rule for inline Mosaic GPU: there the gather is 64 `copy_gmem_to_smem` of one row each
  (the interpreter takes the 1-row slice), on a Pallas barrier of 64 arrivals. So interpret mode checks the kernel's
  indexing, masks and softmax; the cp.async gather's addresses are checked only where it runs (GPU). Timed on an
  H100 (`sparse` grid): at 128 tokens of topk 2048, one wave of 128 CTAs of 32 steps, a step takes about 6.6 us at
  H = 16 and 64 alike (210.7 and 214.4 us), some ten times its math (~1.1k cycles at 64 rows); the gather binds there,
  and the Triton kernel is 1.1-1.8x faster at 64-128 tokens.

Masked entries (-1, past topk_length, topk's tail to a multiple of 64) never load a NaN: the wrapper replaces each
by the token's first used slot (a row it reads anyway: in L2, finite) and marks it, so every step loads 64 rows
(a fixed arrival count) and the scores mask the marked keys (MASK_VALUE: P is exactly 0 there once a real key is
seen; a step of only masked keys before the first real one is wiped by alpha = 0). A token's loop runs
ceil(n / 64) steps, n its last used entry's position + 1 (<= topk_length); a token with no used entry runs none and
gets out 0 and lse -inf from the output stage (l = 0, m = -inf). The index rows are staged in a ring of three
64-entry chunks, each TMA'd right after the previous step's gather (one gather ahead of its own: unmeasured whether
that hides its latency), in one 1 KiB buffer with the header and the gather's mbarriers (every scratch buffer takes
a multiple of 1 KiB, and q, the two ring slots and P leave about 3 KiB of the 227).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mla_jax.combine import combine, combine_ref
from mla_jax.pallas_mosaic_gpu.config import (
    BLOCK_H, BLOCK_KV, HEAD_DIM, KV_LORA_RANK, LN2, LOG2E, MASK_VALUE, NUM_COMPUTE_WGS, NUM_SMS_H200, STAGES, V_HALF,
    _kernel_heads, make_plan,
)
from mla_jax.pallas_mosaic_gpu.kernel import Ctx
from mla_jax.pallas_mosaic_gpu.output import finish
from mla_jax.pallas_mosaic_gpu.softmax import accumulate_wgmma

HDR_WORDS = 32  # a token's header row (word 0: its step count), 128 bytes: a TMA's multiple
IDX_SLOTS = STAGES + 1  # index chunks staged: a step's chunk TMA'd one gather before its own
ROW_BYTES = HEAD_DIM * 2  # a 16-bit cache row
PIECES = ROW_BYTES // 16  # 16-byte cp.async pieces a row (72)
WG_THREADS = 128
MIN_STEPS_PER_SPLIT = 4
"""`sparse_num_splits`'s least 64-key steps a split: the Triton sparse kernel's value (mla_jax.sparse_triton: a split
writes a 64 x 512 float32 partial that the merge reads back), unmeasured for this kernel."""


def sparse_num_splits(num_tokens: int, head_tiles: int, steps: int, num_sms: int = NUM_SMS_H200) -> int:
    """Splits of each token's steps (the heuristic): as many as fill the SMs in one wave, num_sms // (num_tokens x
    head_tiles) CTAs a (token, head tile) (one CTA fits an SM: 195-226 KiB of shared memory), at most steps //
    MIN_STEPS_PER_SPLIT, at least 1 (1 where the tokens' CTAs alone fill the SMs). Unmeasured."""
    ctas = max(1, num_tokens) * head_tiles
    return max(1, min(num_sms // ctas, steps // MIN_STEPS_PER_SPLIT))


def split_steps(steps: int, num_splits: int) -> int:
    """Steps a split takes (split s: the token's steps [s S, min((s + 1) S, n)))."""
    return -(-steps // num_splits)


def encode_indices(indices, topk_length, num_slots: int):
    """(sched [T, HDR_WORDS + steps * 64] int32, steps): per token a header (word 0: its step count) and its
    entries, each a used slot s as s, a masked entry (-1, past topk_length, the tail to a multiple of 64) as
    -(f + 1) with f the token's first used slot (0 where it has none: then it runs no step). Slots past the cache
    are clamped: validated inputs have none, and a clamp never reads out of bounds. One small XLA fusion."""
    T, topk = indices.shape
    steps = -(-topk // BLOCK_KV)
    pad = steps * BLOCK_KV - topk
    idx = jnp.pad(indices.astype(jnp.int32), ((0, 0), (0, pad)), constant_values=-1)
    pos = jnp.arange(steps * BLOCK_KV, dtype=jnp.int32)[None, :]
    used = idx >= 0
    if topk_length is not None:
        used &= pos < topk_length.astype(jnp.int32)[:, None]
    idx = jnp.clip(idx, 0, num_slots - 1)
    any_used = used.any(axis=1)
    first = jnp.take_along_axis(idx, jnp.argmax(used, axis=1)[:, None], axis=1)[:, 0]
    fill = jnp.where(any_used, first, 0)
    enc = jnp.where(used, idx, -(fill[:, None] + 1))
    last = jnp.max(jnp.where(used, pos + 1, 0), axis=1)
    n_steps = -(-last // BLOCK_KV)
    hdr = jnp.zeros((T, HDR_WORDS), jnp.int32).at[:, 0].set(n_steps)
    return jnp.concatenate([hdr, enc], axis=1), steps


# ---------------------------------------------------------------------------------------------------------------
# The compiled gather: cp.async into the swizzled slot, counted on an mbarrier of the gather's own
# ---------------------------------------------------------------------------------------------------------------


def _mgpu():
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, nvvm

    return mgpu, mgpu_utils, ir, arith, llvm, nvvm


def gather_init(bars):
    """(compiled) Initialises the gather's mbarriers (int32 [2 slots], 8 bytes each) for WG_THREADS arrivals each; one thread
    of the calling warpgroup. The caller publishes it (a Pallas barrier arrival) before anyone waits."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def init(ctx, ref):
        del ctx
        mgpu, u, ir, arith, llvm, nvvm = _mgpu()
        i32 = ir.IntegerType.get_signless(32)
        base = u.memref_ptr(ref)
        pred = u.single_thread_predicate(u.ThreadSubset.WARPGROUP)
        for s in range(ir.MemRefType(ref.type).shape[0] // 2):
            nvvm.mbarrier_init(u.getelementptr(base, [2 * s], i32), u.c(WG_THREADS, i32), predicate=pred)
        nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)

    init(bars)


def gather_wait(bars, slot, parity):
    """(compiled) Waits for phase `parity` of the gather's mbarrier `slot`, then fences the generic proxy's writes
    (cp.async) before the wgmmas (async proxy) read the slot."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.Layout.WG_SPLAT, plgpu.Layout.WG_SPLAT))
    def wait(ctx, ref, s, p):
        del ctx
        mgpu, u, ir, arith, llvm, nvvm = _mgpu()
        i32 = ir.IntegerType.get_signless(32)
        i64 = ir.IntegerType.get_signless(64)
        ptr = u.getelementptr(u.memref_ptr(ref), [arith.muli(s.registers.item(), u.c(2, i32))], i32)
        done = arith.cmpi(arith.CmpIPredicate.ne, p.registers.item(), u.c(0, i32))
        u.BarrierRef(ptr, u.c(0, i32), None, 1).wait_parity(done)

    wait(bars, slot, parity)
    plgpu.commit_smem()


def gather_rows(kv_flat, dst, idx, bars, slot):
    """(compiled) The 64 rows idx names (each entry e: slot e, or -e - 1 where e < 0) of kv_flat [num_slots, 576]
    into dst ([64, 576], tiled (8, 64), 128-byte swizzle) by cp.async, thread t of the warpgroup the even or odd
    16-byte pieces (t % 2) of row t // 2; each thread's copies then arrive (noinc) on mbarrier `slot` of bars."""
    dtype_bits = 16

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType((plgpu.TilingTransform((8, 64)),
                                                                   plgpu.SwizzleTransform(128))),
                                  plgpu.RefType(), plgpu.RefType(), plgpu.Layout.WG_SPLAT))
    def gather(ctx, kv, d, ix, b, s):
        del ctx
        mgpu, u, ir, arith, llvm, nvvm = _mgpu()
        i32 = ir.IntegerType.get_signless(32)
        i64 = ir.IntegerType.get_signless(64)
        i8 = ir.IntegerType.get_signless(8)
        tid = u.thread_idx()
        if isinstance(tid.type, ir.IndexType):
            tid = arith.index_castui(i32, tid)
        tid = arith.remui(tid, u.c(WG_THREADS, i32))
        row = arith.divui(tid, u.c(2, i32))
        half = arith.remui(tid, u.c(2, i32))
        # the row's slot: the index entry, decoded
        ix_ptr = u.memref_ptr(ix)
        e = llvm.load(i32, u.getelementptr(ix_ptr, [row], i32))
        neg = arith.cmpi(arith.CmpIPredicate.slt, e, u.c(0, i32))
        slot_id = arith.select(neg, arith.subi(u.c(-1, i32), e), e)
        src = llvm.addrspacecast(llvm.PointerType.get(address_space=1), u.memref_ptr(kv))
        src = u.getelementptr(src, [arith.muli(arith.extui(i64, slot_id), u.c(ROW_BYTES, i64))], i8)
        src = u.getelementptr(src, [arith.extui(i64, arith.muli(half, u.c(16, i32)))], i8)
        # the tiled slot: [8 row tiles, 9 column tiles, 8, 64] bf16; row r's 16-byte unit j of column tile c at
        # ((r // 8) * 9 + c) * 1024 + (r % 8) * 128 + ((j ^ (r % 8)) * 16)
        rt = arith.divui(row, u.c(8, i32))
        r8 = arith.remui(row, u.c(8, i32))
        row_off = arith.addi(arith.muli(rt, u.c(9 * 1024, i32)), arith.muli(r8, u.c(128, i32)))
        d_ptr = u.getelementptr(u.memref_ptr(d), [row_off], i8)
        hx = arith.xori(half, r8)  # unit 2a + half, swizzled: (2a) ^ (half ^ r8)
        units = [arith.muli(arith.xori(u.c(2 * a, i32), hx), u.c(16, i32)) for a in range(4)]
        for m in range(PIECES // 2):  # piece 2m + half: column tile m // 4, unit 2 (m % 4) + half
            dst_ptr = u.getelementptr(d_ptr, [arith.addi(u.c((m // 4) * 1024, i32), units[m % 4])], i8)
            nvvm.cp_async_shared_global(dst_ptr, u.getelementptr(src, [32 * m], i8), 16,
                                        nvvm.LoadCacheModifierKind.CG)
        bar = u.getelementptr(u.memref_ptr(b), [arith.muli(s.registers.item(), u.c(2, i32))], i32)
        nvvm.cp_async_mbarrier_arrive(bar, noinc=True)

    del dtype_bits
    gather(kv_flat, dst, idx, bars, slot)


# ---------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------


_EMPTY_CTX = Ctx(**{f.name: None for f in dataclasses.fields(Ctx)})


def sparse_plan(*, dtype, num_tokens: int, heads: int, hp: int, scale_log2: float, interpret: bool):
    """The dense kernel's plan for a sparse CTA (both sparse kernels build theirs here): one token a CTA, its hp heads
    in the tile's first rows, no split-KV (the output stage in the output's dtype, `out_stage_dtype`)."""
    plan = make_plan(dtype=dtype, page_size=BLOCK_KV, num_tokens=num_tokens, heads=heads, hp=hp,
                     num_h_tiles=heads // hp, q_tiles=1, num_reqs=num_tokens, bt_chunk=BLOCK_KV,
                     scale_log2=scale_log2, interpret=interpret)
    return dataclasses.replace(plan, tpt=1, q_toks=1)


def out_stage_dtype(plan):
    """The output stage's (and the output's) dtype of a sparse plan."""
    return plan.stage_dtype


def sparse_ctx(plan, hb, out_ref, lse_ref, stage, x_smem) -> Ctx:
    """What the dense output stage (`output.finish`) reads, for a sparse CTA."""
    return dataclasses.replace(_EMPTY_CTX, plan=plan, hb=hb, out_ref=out_ref, lse_ref=lse_ref, stage=stage,
                               x_smem=x_smem)


def finish_token(kc, half, acc, l_tot, lse, tok):
    """The dense output stage for the CTA's one token: its final out columns of `half` and (lse not None) its lse."""
    finish(kc, half, acc, l_tot, lse, tok, 1)


def write_partial(kc, split, tok, half, acc, l_tot, lse):
    """A split's float32 partial of the CTA's token (num_splits > 1; kc.out_ref o_part [S, T, H, 512], kc.lse_ref
    lse_part [S, T, H], kc.stage float32 [2, 64, 256]): out columns of `half` normalized by l_tot (0 where l_tot is
    0: no step run, or only masked keys, whose l the caller zeroed) and (lse not None) the lse, through the stage
    (aliasing q and the ring, as finish's: every warpgroup is past its last read of them) by TMA to
    o_part[split, tok, head rows] and lse_part[split, tok, head rows]."""
    hp, hb, stage, x_smem = kc.plan.hp, kc.hb, kc.stage, kc.x_smem
    whole = hp == BLOCK_H
    rows = pl.ds(hb * hp, hp)
    if half is not None:
        inv = jnp.where(l_tot > 0.0, 1.0 / jnp.maximum(l_tot, 1e-30), 0.0)
        stage[half] = acc * lax.broadcast_in_dim(inv, acc.shape, [0])
    if lse is not None:
        x_smem[0] = lse
    plgpu.commit_smem()
    if half is not None:
        plgpu.copy_smem_to_gmem(stage.at[half] if whole else stage.at[half, pl.ds(0, hp)],
                                kc.out_ref.at[split, tok, rows, pl.ds(half * V_HALF, V_HALF)])
    if lse is not None:
        plgpu.copy_smem_to_gmem(x_smem.at[0] if whole else x_smem.at[0, pl.ds(0, hp)], kc.lse_ref.at[split, tok, rows])
    plgpu.wait_smem_to_gmem(0)


def write_token(kc, partial: bool, tok, half, acc, l_tot, lse):
    """A warpgroup's share of the CTA's output: the split's fp32 partial (`write_partial`) or the token's final out
    and lse (`finish_token`)."""
    if partial:
        write_partial(kc, lax.axis_index("split"), tok, half, acc, l_tot, lse)
    else:
        finish_token(kc, half, acc, l_tot, lse, tok)


def index_chunk(i_smem, i):
    """Step i's 64 encoded entries: row 1 + i % IDX_SLOTS of i_smem (row 0: the header and the gather's mbarriers)."""
    return i_smem.at[1 + lax.rem(i, jnp.int32(IDX_SLOTS))]


def load_index_chunk(sched_ref, i_smem, idx_bar, tok, lo, i):
    """TMA of the split's step i's entries (the token's step lo + i; lo None: unsplit) into index_chunk(i)."""
    c = i if lo is None else lo + i
    plgpu.copy_gmem_to_smem(sched_ref.at[tok, pl.ds(HDR_WORDS + c * BLOCK_KV, BLOCK_KV)], index_chunk(i_smem, i),
                            idx_bar.at[lax.rem(i, jnp.int32(IDX_SLOTS))])


def load_q(q_ref, q_smem, tok, hb, hp: int, q_bar):
    """The token's hp heads of head tile hb into q's tile (its first hp rows)."""
    plgpu.copy_gmem_to_smem(q_ref.at[tok, pl.ds(hb * hp, hp)], q_smem if hp == BLOCK_H else q_smem.at[pl.ds(0, hp)],
                            q_bar)


def zeros_acc():
    return plgpu.layout_cast(jnp.full((BLOCK_H, V_HALF), 0.0, jnp.float32), plgpu.Layout.WGMMA)


def rescale(acc, f):
    return acc * lax.broadcast_in_dim(f, acc.shape, [0])


def masked_softmax(s, chunk, m_i, l_i, scale_log2: float):
    """One step's online softmax over its 64 keys: scores s [64, 64], the step's encoded entries `chunk` (a masked
    entry < 0 scores MASK_VALUE), the running max m_i and sum l_i -> (P, alpha, m_new, l_new), exp2 in fp32."""
    e = plgpu.load(chunk, layout=plgpu.Layout.WGMMA.reduce(0))
    used = lax.broadcast_in_dim(e, s.shape, [1]) >= 0
    s = jnp.where(used, s * scale_log2, MASK_VALUE)
    m_new = jnp.maximum(m_i, s.max(axis=1))
    alpha = jnp.exp2(m_i - m_new)
    p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
    return p, alpha, m_new, l_i * alpha + p.sum(axis=1)


def hand_over_p(k, p, alpha, p_smem, x_smem, p_free, p_ready):
    """(warpgroup 0) Step k's P and rescale factor to warpgroup 1, once it has read step k - 1's."""

    @pl.when(k > 0)
    def _():
        plgpu.barrier_wait(p_free)

    p_smem[...] = p.astype(p_smem.dtype)
    x_smem[0] = alpha
    plgpu.commit_smem()
    plgpu.barrier_arrive(p_ready)


def finish_scores_warpgroup(kc, partial: bool, tok, n, acc, m_i, l_i, p_free, p_ready):
    """(warpgroup 0, after its n steps) the row sums to warpgroup 1 (once it has read the last P), then its half of
    the output and the lse (natural log). With splits, a split with no used key (m still the mask's) gets l 0, so
    out 0 and lse -inf."""
    x_smem = kc.x_smem

    @pl.when(n > 0)
    def _():
        plgpu.barrier_wait(p_free)

    if partial:
        l_i = jnp.where(m_i > MASK_VALUE, l_i, 0.0)
    x_smem[kc.plan.sums_row] = l_i
    plgpu.commit_smem()
    plgpu.barrier_arrive(p_ready)
    lse = (m_i + jnp.log(l_i) * (1.0 / LN2)) * LN2
    write_token(kc, partial, tok, 0, acc, l_i, lse)


def split_range(n, num_splits: int, steps: int):
    """(lo, n_local): the split's first step and its step count, from the token's step count n; (None, n) unsplit."""
    if num_splits == 1:
        return None, n
    per = split_steps(steps, num_splits)
    lo = lax.axis_index("split") * per
    return lo, jnp.clip(n - lo, 0, per)


def kernel_grid(num_h_tiles: int, num_tokens: int, num_splits: int):
    """(grid, grid_names) of a sparse kernel: (h, tok), and split with num_splits > 1."""
    if num_splits == 1:
        return (num_h_tiles, num_tokens), ("h", "tok")
    return (num_h_tiles, num_tokens, num_splits), ("h", "tok", "split")


def kernel_out_type(num_tokens: int, heads: int, num_splits: int, out_dtype):
    """(out, lse) shapes: the final [T, H, 512] in out_dtype and [T, H], or float32 partials [S, T, H, 512] and
    [S, T, H]."""
    if num_splits == 1:
        return (jax.ShapeDtypeStruct((num_tokens, heads, KV_LORA_RANK), out_dtype),
                jax.ShapeDtypeStruct((num_tokens, heads), jnp.float32))
    return (jax.ShapeDtypeStruct((num_splits, num_tokens, heads, KV_LORA_RANK), jnp.float32),
            jax.ShapeDtypeStruct((num_splits, num_tokens, heads), jnp.float32))


def token_steps(sched_ref, hdr_smem, hdr_bar, gbars, init_bar, wg, tok, num_splits: int, steps: int,
                interpret: bool):
    """A CTA's start, both warpgroups: warpgroup 1 stages the token's header (and, compiled, initialises the
    gather's mbarriers gbars), then arrives on init_bar; both wait for the header. Returns the split's steps
    (lo, n): steps [lo, lo + n) of the token's (ring slots and parities count from lo)."""

    @pl.when(wg == 1)
    def _():
        plgpu.copy_gmem_to_smem(sched_ref.at[tok, pl.ds(0, HDR_WORDS)], hdr_smem, hdr_bar)
        if not interpret:
            gather_init(gbars)
        plgpu.barrier_arrive(init_bar)

    plgpu.barrier_wait(hdr_bar)
    return split_range(hdr_smem[0], num_splits, steps)


def start_scores(init_bar, q_bar, row_layout):
    """(warpgroup 0) Waits for the gather's mbarriers and q; returns the online softmax's initial (m_i, l_i)."""
    plgpu.barrier_wait(init_bar)
    plgpu.barrier_wait(q_bar)
    return (plgpu.layout_cast(jnp.full((BLOCK_H,), -jnp.inf, jnp.float32), row_layout),
            plgpu.layout_cast(jnp.full((BLOCK_H,), 0.0, jnp.float32), row_layout))


def slot_of_entry(e):
    """The cache slot an index entry names: e, or -e - 1 for a masked entry (its token's first used slot)."""
    return jnp.where(e >= 0, e, -1 - e)


def launch(body, out_type, scratch, grid, grid_names):
    """plgpu.kernel for a sparse kernel's body: the two compute warpgroups ("wg"), lane semantics."""
    return plgpu.kernel(
        body, out_type=out_type, scratch_types=scratch, grid=grid, grid_names=grid_names,
        num_threads=NUM_COMPUTE_WGS, thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True, reduction_scratch_bytes=0,
                                             lowering_semantics=plgpu.LoweringSemantics.Lane))


def _build_sparse_kernel(*, dtype, num_tokens: int, num_slots: int, heads: int, hp: int, steps: int,
                         scale_log2: float, interpret: bool, num_splits: int = 1):
    num_h_tiles = heads // hp
    plan = sparse_plan(dtype=dtype, num_tokens=num_tokens, heads=heads, hp=hp, scale_log2=scale_log2,
                       interpret=interpret)
    transforms, stages = plan.transforms, plan.stages
    width = HDR_WORDS + steps * BLOCK_KV
    partial = num_splits > 1
    stage_dtype = jnp.float32 if partial else out_stage_dtype(plan)  # fp32 [2, 64, 256]: 128 KiB, in the union

    def body(q_ref, kv_ref, sched_ref, out_ref, lse_ref, union, p_smem, x_smem, i_smem,
             hdr_bar, q_bar, idx_bar, kv_ready, kv_consumed, p_ready, p_free, init_bar):
        (q_smem, kv_smem), stage = union
        # i_smem: row 0 the header (words [0, 32)) and the gather's mbarriers (words [32, 36)), rows 1.. the index
        # chunks (every scratch buffer takes a multiple of 1 KiB: one buffer for the three)
        hdr_smem = i_smem.at[0, pl.ds(0, HDR_WORDS)]
        gbars = i_smem.at[0, pl.ds(HDR_WORDS, 2 * stages)]
        hb = lax.axis_index("h")
        tok = lax.axis_index("tok")
        wg = lax.axis_index("wg")
        kc = sparse_ctx(plan, hb, out_ref, lse_ref, stage, x_smem)
        accumulate = functools.partial(accumulate_wgmma, interpret=interpret)
        row_layout = plgpu.Layout.WGMMA.reduce(1)

        def load_idx(i):
            load_index_chunk(sched_ref, i_smem, idx_bar, tok, lo, i)

        def idx_chunk(i):
            return index_chunk(i_smem, i)

        lo, n = token_steps(sched_ref, hdr_smem, hdr_bar, gbars, init_bar, wg, tok, num_splits, steps, interpret)

        def issue(i):
            """Step i's rows into ring slot i % stages (free), from index chunk i (staged); chunk i + 1 staged
            next (its slot's last reader, step i - 2, is done: step i's slot was free)."""
            slot = lax.rem(i, jnp.int32(stages))
            plgpu.barrier_wait(idx_bar.at[lax.rem(i, jnp.int32(IDX_SLOTS))])
            ix = idx_chunk(i)
            if interpret:
                for r in range(BLOCK_KV):
                    s = slot_of_entry(ix[r])
                    plgpu.copy_gmem_to_smem(kv_ref.at[pl.ds(s, 1)], kv_smem.at[slot, pl.ds(r, 1)],
                                            kv_ready.at[slot])
            else:
                gather_rows(kv_ref, kv_smem.at[slot], ix, gbars, slot)

            @pl.when(i + 1 < n)
            def _():
                load_idx(i + 1)

        def wait_rows(i):
            slot = lax.rem(i, jnp.int32(stages))
            if interpret:
                plgpu.barrier_wait(kv_ready.at[slot])
            else:
                gather_wait(gbars, slot, lax.rem(lax.div(i, jnp.int32(stages)), jnp.int32(2)))

        def pv(acc, half, slot):
            v = kv_smem.at[slot, :, pl.ds(half * V_HALF, V_HALF)]
            return accumulate(acc, lambda acc_ref: plgpu.wgmma(acc_ref, p_smem, v))

        @pl.when(wg == 0)
        def _():
            m_i, l_i = start_scores(init_bar, q_bar, row_layout)

            def step(k, carry):
                acc, m_i, l_i = carry
                slot = lax.rem(k, jnp.int32(stages))
                with jax.named_scope("kv_wait"):
                    wait_rows(k)

                def qk(s_ref):
                    plgpu.wgmma(s_ref, q_smem, kv_smem.at[slot].transpose((1, 0)))
                    return s_ref[...]

                with jax.named_scope("qk"):
                    s = pl.run_scoped(qk, plgpu.ACC((BLOCK_H, BLOCK_KV), jnp.float32))
                p, alpha, m_new, l_i = masked_softmax(s, idx_chunk(k), m_i, l_i, scale_log2)
                hand_over_p(k, p, alpha, p_smem, x_smem, p_free, p_ready)
                acc = rescale(acc, alpha)
                with jax.named_scope("pv"):
                    acc = pv(acc, 0, slot)
                plgpu.barrier_arrive(kv_consumed.at[slot])
                return acc, m_new, l_i

            acc, m_i, l_i = lax.fori_loop(0, n, step, (zeros_acc(), m_i, l_i))

            finish_scores_warpgroup(kc, partial, tok, n, acc, m_i, l_i, p_free, p_ready)

        @pl.when(wg == 1)
        def _():
            load_q(q_ref, q_smem, tok, hb, hp, q_bar)
            pl.when(n > 0)(functools.partial(load_idx, 0))

            @pl.loop(0, jnp.minimum(n, stages))
            def _prologue(i):
                issue(i)

            def step(k, acc):
                slot = lax.rem(k, jnp.int32(stages))
                plgpu.barrier_wait(p_ready)
                if not interpret:  # (the gather's cp.async writes: fenced for this warpgroup's wgmmas too)
                    plgpu.commit_smem()
                acc = rescale(acc, plgpu.load(x_smem.at[0], layout=row_layout))
                with jax.named_scope("pv"):
                    acc = pv(acc, 1, slot)
                plgpu.barrier_arrive(p_free)
                plgpu.barrier_arrive(kv_consumed.at[slot])

                @pl.when(k + stages < n)
                def _():
                    plgpu.barrier_wait(kv_consumed.at[slot])
                    issue(k + stages)

                return acc

            acc = lax.fori_loop(0, n, step, zeros_acc())

            @pl.loop(jnp.maximum(n - stages, 0), n)
            def _drain(i):
                plgpu.barrier_wait(kv_consumed.at[lax.rem(i, jnp.int32(stages))])

            plgpu.barrier_wait(p_ready)
            write_token(kc, partial, tok, 1, acc, plgpu.load(x_smem.at[plan.sums_row], layout=row_layout), None)

    stage_cols = 128 // jnp.dtype(stage_dtype).itemsize
    stage_transforms = (plgpu.TilingTransform((8, stage_cols)), plgpu.SwizzleTransform(128))
    scratch = [
        plgpu.RefUnion(
            (plgpu.SMEM((BLOCK_H, HEAD_DIM), dtype, transforms=transforms),
             plgpu.SMEM((stages, BLOCK_KV, HEAD_DIM), dtype, transforms=transforms)),
            plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, V_HALF), stage_dtype, transforms=stage_transforms),
        ),
        plgpu.SMEM((BLOCK_H, BLOCK_KV), dtype, transforms=transforms),  # P
        plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H), jnp.float32),  # alpha, the row sums, lse
        plgpu.SMEM((1 + IDX_SLOTS, BLOCK_KV), jnp.int32),  # the header, the gather's mbarriers, the index chunks
        plgpu.Barrier(),  # hdr_bar
        plgpu.Barrier(),  # q_bar
        plgpu.Barrier(num_barriers=IDX_SLOTS),  # idx_bar
        plgpu.Barrier(num_arrivals=BLOCK_KV, num_barriers=stages),  # kv_ready (interpret: a TMA a row)
        plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS, num_barriers=stages),  # kv_consumed
        plgpu.Barrier(),  # p_ready (then the row sums)
        plgpu.Barrier(),  # p_free
        plgpu.Barrier(),  # init_bar: the gather's mbarriers initialised
    ]
    out_type = kernel_out_type(num_tokens, heads, num_splits, out_stage_dtype(plan))
    grid, grid_names = kernel_grid(num_h_tiles, num_tokens, num_splits)
    del width
    return launch(body, out_type, scratch, grid, grid_names)




def _sparse_decode(q, kv_cache, indices, topk_length, softmax_scale: float, interpret: bool, fp8: bool,
                   num_splits: int | None):
    T, num_heads, _ = q.shape
    heads = _kernel_heads(num_heads)
    hp = min(heads, BLOCK_H)
    if heads != num_heads:
        q = jnp.pad(q, ((0, 0), (0, heads - num_heads), (0, 0)))
    num_slots = kv_cache.shape[0] * kv_cache.shape[1]
    sched, steps = encode_indices(indices, topk_length, num_slots)
    if num_splits is None:
        num_splits = sparse_num_splits(T, heads // hp, steps)
    if fp8:  # the fp8_ds_mla cache: its own kernel (sparse_fp8.py)
        from mla_jax.pallas_mosaic_gpu.sparse_fp8 import sparse_decode_fp8

        out, lse = sparse_decode_fp8(q, kv_cache.reshape(num_slots, kv_cache.shape[-1]), sched, heads=heads, hp=hp,
                                     steps=steps, scale_log2=softmax_scale * LOG2E, interpret=interpret,
                                     num_splits=num_splits)
    else:
        kernel = _build_sparse_kernel(dtype=q.dtype, num_tokens=T, num_slots=num_slots, heads=heads, hp=hp,
                                      steps=steps, scale_log2=softmax_scale * LOG2E, interpret=interpret,
                                      num_splits=num_splits)
        out, lse = kernel(q, kv_cache.reshape(num_slots, HEAD_DIM), sched)
    if num_splits > 1:  # the splits' float32 partials merged by lse (interpret mode: the merge's jnp formula)
        out, lse = combine_ref(out, lse, q.dtype) if interpret else combine(out, lse, q.dtype)
    return out[:, :num_heads], lse[:, :num_heads]


@functools.partial(jax.jit, static_argnames=("softmax_scale", "interpret", "fp8", "num_splits"))
def _sparse_decode_jit(q, kv_cache, indices, topk_length, softmax_scale, interpret, fp8, num_splits):
    if interpret:
        params = interpret if isinstance(interpret, plgpu.InterpretGPUParams) else plgpu.InterpretGPUParams()
        with plgpu.force_gpu_interpret_mode(params):
            return _sparse_decode(q, kv_cache, indices, topk_length, softmax_scale, True, fp8, num_splits)
    return _sparse_decode(q, kv_cache, indices, topk_length, softmax_scale, False, fp8, num_splits)


def sparse_decode(q, kv_cache, metadata, config, *, cache_format="auto", interpret=False, tuning=None,
                  num_splits=None):
    """The sparse decode: `(out [T, H, 512] in q's dtype, lse [T, H] float32)`.

    q [T, H, 576] in config.dtype (bfloat16 / float16; bfloat16 with the fp8_ds_mla cache); kv_cache
    [num_blocks, page_size, 576] of q's dtype (cache_format "auto") or uint8 [num_blocks, page_size, 656]
    (cache_format "fp8_ds_mla": sparse_fp8.py's kernel) (any page size: rows are read by global slot); metadata: a
    `SparseMetadata` of int32 jax arrays (validated by the caller, `mla_jax.sparse_mla_decode`). tuning: none yet
    (must be None). num_splits: splits of each token's steps (an int >= 1; None: `sparse_num_splits`'s pick).
    jit-compatible."""
    if tuning is not None:
        raise ValueError(f"the sparse Mosaic GPU kernel has no tuning yet, got tuning={tuning!r}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be None or an int >= 1, got num_splits={num_splits!r}")
    if q.ndim != 3 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"q must be [T, H, {HEAD_DIM}], got q.shape={tuple(q.shape)}")
    if cache_format not in ("auto", "fp8_ds_mla"):
        raise ValueError(f"unknown cache_format={cache_format!r}; expected one of ('auto', 'fp8_ds_mla')")
    fp8 = cache_format == "fp8_ds_mla"
    if fp8 and jnp.dtype(q.dtype) != jnp.bfloat16:
        raise NotImplementedError(f"the fp8_ds_mla cache needs a bfloat16 q (the dequantized cache's wgmmas run in "
                                  f"bfloat16), got q.dtype={jnp.dtype(q.dtype).name}")
    return _sparse_decode_jit(q, kv_cache, metadata.indices, metadata.topk_length, float(config.softmax_scale),
                              interpret, fp8, num_splits)
