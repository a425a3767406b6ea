"""The sparse Mosaic GPU kernel (`mla_jax.pallas_mosaic_gpu.sparse`) on FlashMLA's fp8_ds_mla cache
(`mla_spec.fp8_sparse`: a row is 656 bytes, 512 float8_e4m3fn latent values, 4 float32 scales one per 128 of them,
64 bfloat16 rope values; the cache is uint8 [num_blocks, page_size, 656], read in place).

What stays the 16-bit kernel's: one CTA per (token, 64-row head tile, split of the token's steps: the partials and
their merge as there), FlashMLA's split of a 64-key step (warpgroup 0 the scores, the online softmax and P, and P @
V for output columns [0, 256); warpgroup 1 P @ V for [256, 512) and the gather), the index schedule
(`encode_indices`: masked entries replaced by the token's first used slot and masked in the scores, so no NaN row is
ever read and every step gathers 64 rows), the output stage.

The arithmetic: dequantize to bfloat16, wgmmas in bfloat16. A scale is per key row and per 128 latent columns, so
it cannot be folded into the scores and the output as the dense kernel's per-tensor k_scale is: V needs its values
scaled before P @ V (a per-(row, column tile) factor of V is no factor of P nor of the output), and a scaled K for
the scores then comes with it. Each step is converted into a [64, 576] bfloat16 copy (`conv`), the operand the
16-bit kernel's ring slot is, and the scores and P @ V run on it as they do there. bf16, not f16: an e4m3 value
(at most 4 significant bits, 2**-9 .. 448) times a power-of-two scale (FlashMLA's: 2**-13 and up; an all-zero tile
gets 2**-13, a tile of amax A gets the power of two at or above A / 448) is exactly a bfloat16 for every such scale
(bf16 has float32's exponent range and 8 significant bits), so the copy is exact and the scores and P @ V see the
reference's values; in f16 it is exact only while the scale is at most 2**7 (448 x 2**8 > 65504; tiles with
|x| > 57344 overflow). FlashMLA's Hopper sparse fp8 decode makes the same choice (bf16 q, K dequantized to bf16
in shared memory by a producer, the scale rounded to bf16: exact for powers of two). The conversion: e4m3 -> f32
(Mosaic GPU's fp8 upcast), x scale (exact), -> bf16 (exact), 64 columns a chunk (`WGMMA_8BIT` registers, the scale
broadcast from a row vector). The rope values are bf16 already: copied into the copy's columns [512, 576).
So q must be bfloat16 (the wgmmas' other operand); a float16 q would need rounding to bf16 (inexact) and is
refused by name (`mla_jax.sparse_unsupported_reason`).

Shared memory (227 KiB a CTA). The 16-bit kernel holds q (64 x 576 x 2 = 72 KiB), two ring slots (144 KiB), P (8
KiB) and 2 KiB of vectors, indices and barriers: 226 KiB. Here a gathered step is 41 KiB: the latent [64, 512] fp8
(32 KiB, tiled (8, 64) with the 64-byte swizzle: the dense kernel's fp8 ring layout, which its conversion loads in
WGMMA_8BIT), the rope [64, 64] bf16 (8 KiB, tiled (8, 64), 128-byte swizzle) and the scales [4, 64] float32 (1 KiB,
transposed: scale tile t of the 64 rows is one row, read as a row vector). The converted step is 72 KiB. q 72 + conv
72 + P 8 + 2 = 154 KiB leaves 73 KiB: one gathered slot (41), not two (82). So the pipeline is one fp8 slot and one
converted step (195 KiB in all; the output stage, 64 KiB, or 128 KiB in float32 for a split's partials, aliases q
and the buffers as before: the union is 185 KiB). Rejected: two fp8 slots with a converted step (236 KiB); two
converted steps (298); a converted step in halves as the dense kernel's overlap_dequant (three 32 KiB V buffers;
more barriers, not needed to fit); 32-key steps (wgmma N = 32 halves the scores' efficiency and doubles the
hand-offs).

The step. Step k's 64 rows land in the fp8 slot (gathered during step k - 1); each warpgroup converts its own
columns of step k right after its own P @ V of step k - 1 (warpgroup 0 V's [0, 256) and the rope, warpgroup 1
V's [256, 512)): a column block is read by step k - 1 only by the warpgroup that overwrites it (the scores of step
k - 1, which read all 576 columns, finished before P of step k - 1 was handed over, which warpgroup 1's P @ V of
step k - 1 waited for). Both then arrive on `deq_ready` (2 arrivals); warpgroup 0 waits for it before the scores,
warpgroup 1 before it gathers step k + 1 into the fp8 slot (both are done reading it). So the gather of step
k + 1 runs under step k's scores, softmax and P @ V; the conversion is not overlapped with the tensor cores (each
warpgroup converts between its P @ V and the next step). Timed on an H100 (`sparse` grid of
docs/performance.md): 1.14x the 16-bit kernel's speed, geomean (0.84-1.54), the most at 64-128 tokens, where that
kernel's gather binds (41 KiB a step here against 72); 1.13x FlashMLA's sparse fp8 decode. The conversion's own cost
(32 K values a step, 128 a thread: ~2 cvt + 1 mul + a store each half-pair) is not isolated.

The gather (compiled): warpgroup 1's 128 threads by cp.async, thread t row t // 2, half h = t % 2: the latent's 16-byte
pieces 2 m + h (16 a thread, into the 64-byte swizzle: unit u of a 64-byte row r at u ^ ((r // 2) % 4)), the rope's
pieces 2 m + h (4 a thread, 128-byte swizzle: unit u at u ^ (r % 8)) and the scales 2 j + h (2 a thread, 4-byte
cp.async into the transposed [4, 64] scales); then one cp.async.mbarrier.arrive.noinc each, on the slot's mbarrier
(128 arrivals, waited by parity: step k's phase is k % 2). A row is 41 16-byte units at a 16-byte aligned offset
(656 = 41 x 16). Interpret mode (no inline Mosaic GPU there): the wrapper splits the cache into its three typed
views (an XLA copy: fine for tests, never on the compiled path) and each row is three 1-row TMAs, counted on a
Pallas barrier of 3 x 64 arrivals. So interpret mode checks the indexing, the conversion's arithmetic, the masks,
the hand-offs' order; the cp.async addresses are checked only where it runs (a GPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mla_jax.pallas_mosaic_gpu.config import BLOCK_H, BLOCK_KV, HEAD_DIM, KV_LORA_RANK, NUM_COMPUTE_WGS, V_HALF
from mla_jax.pallas_mosaic_gpu.layouts import FP8_RING_TILES
from mla_jax.pallas_mosaic_gpu.softmax import accumulate_wgmma
from mla_jax.pallas_mosaic_gpu.sparse import (
    HDR_WORDS, IDX_SLOTS, WG_THREADS, _mgpu, finish_scores_warpgroup, gather_wait, hand_over_p,
    index_chunk, kernel_grid, kernel_out_type, launch, load_index_chunk, load_q, masked_softmax, out_stage_dtype,
    rescale, slot_of_entry, sparse_ctx, sparse_plan, start_scores, token_steps, write_token, zeros_acc,
)

ROW_BYTES = 656  # mla_spec.fp8_sparse.BYTES_PER_TOKEN
SCALES_OFFSET = KV_LORA_RANK  # 4 float32 scales
ROPE_OFFSET = KV_LORA_RANK + 16  # 64 bfloat16 rope values
ROPE_DIM = HEAD_DIM - KV_LORA_RANK
NUM_TILES = 4  # scale tiles (128 latent values each)
LATENT_PIECES = KV_LORA_RANK // 16  # 16-byte units of a row's latent (32)
ROPE_PIECES = ROPE_DIM * 2 // 16  # (8)
ROPE_TILES = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def gather_rows_fp8(kv_flat, lat, rope, scales, idx, bars):
    """(compiled) The 64 rows idx names (each entry e: slot e, or -e - 1 where e < 0) of kv_flat uint8
    [num_slots, 656] into lat ([64, 512] fp8, FP8_RING_TILES), rope ([64, 64] bf16, ROPE_TILES) and scales
    ([4, 64] float32, transposed) by cp.async: thread t of the warpgroup the units of parity t % 2 of row t // 2;
    each thread's copies then arrive (noinc) on mbarrier 0 of bars."""

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(FP8_RING_TILES), plgpu.RefType(ROPE_TILES),
                                  plgpu.RefType(), plgpu.RefType(), plgpu.RefType()))
    def gather(ctx, kv, lt, rp, sc, ix, b):
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
        e = llvm.load(i32, u.getelementptr(u.memref_ptr(ix), [row], i32))
        neg = arith.cmpi(arith.CmpIPredicate.slt, e, u.c(0, i32))
        slot_id = arith.select(neg, arith.subi(u.c(-1, i32), e), e)
        src = llvm.addrspacecast(llvm.PointerType.get(address_space=1), u.memref_ptr(kv))
        src = u.getelementptr(src, [arith.muli(arith.extui(i64, slot_id), u.c(ROW_BYTES, i64))], i8)
        rt = arith.divui(row, u.c(8, i32))
        r8 = arith.remui(row, u.c(8, i32))

        def copy(dst_ptr, src_off, size):
            src_at = u.getelementptr(src, [src_off], i8)
            kind = nvvm.LoadCacheModifierKind.CG if size == 16 else nvvm.LoadCacheModifierKind.CA
            nvvm.cp_async_shared_global(dst_ptr, src_at, size, kind)

        # the latent: [8 row tiles, 8 column tiles, 8, 64] fp8 (64-byte rows, 512-byte tiles); row r's unit j of
        # column tile c at ((r // 8) * 8 + c) * 512 + (r % 8) * 64 + (j ^ ((r // 2) % 4)) * 16
        src_half = arith.muli(half, u.c(16, i32))
        lat_ptr = u.getelementptr(u.memref_ptr(lt), [arith.addi(arith.muli(rt, u.c(8 * 512, i32)),
                                                                arith.muli(r8, u.c(64, i32)))], i8)
        hx = arith.xori(half, arith.remui(arith.divui(row, u.c(2, i32)), u.c(4, i32)))
        lat_units = [arith.muli(arith.xori(u.c(2 * a, i32), hx), u.c(16, i32)) for a in range(2)]
        for m in range(LATENT_PIECES // 2):  # piece 2 m + h: column tile m // 2, unit 2 (m % 2) + h
            dst = u.getelementptr(lat_ptr, [arith.addi(u.c((m // 2) * 512, i32), lat_units[m % 2])], i8)
            copy(dst, arith.extui(i64, arith.addi(src_half, u.c(32 * m, i32))), 16)
        # the rope: [8 row tiles, 1, 8, 64] bf16 (128-byte rows, 1 KiB tiles); unit j of row r at
        # (r // 8) * 1024 + (r % 8) * 128 + (j ^ (r % 8)) * 16
        rope_ptr = u.getelementptr(u.memref_ptr(rp), [arith.addi(arith.muli(rt, u.c(1024, i32)),
                                                                 arith.muli(r8, u.c(128, i32)))], i8)
        rx = arith.xori(half, r8)
        for m in range(ROPE_PIECES // 2):
            dst = u.getelementptr(rope_ptr, [arith.muli(arith.xori(u.c(2 * m, i32), rx), u.c(16, i32))], i8)
            copy(dst, arith.extui(i64, arith.addi(src_half, u.c(ROPE_OFFSET + 32 * m, i32))), 16)
        # the scales, transposed: scale t of row r at (t * 64 + r) * 4
        for j in range(NUM_TILES // 2):
            t = arith.addi(half, u.c(2 * j, i32))
            dst = u.getelementptr(u.memref_ptr(sc), [arith.addi(arith.muli(t, u.c(64, i32)), row)], i32)
            copy(dst, arith.extui(i64, arith.addi(arith.muli(t, u.c(4, i32)), u.c(SCALES_OFFSET, i32))), 4)
        nvvm.cp_async_mbarrier_arrive(u.memref_ptr(b), noinc=True)

    gather(kv_flat, lat, rope, scales, idx, bars)


def convert_columns(lat, scales, rope, conv, w: int):
    """This warpgroup's columns of the gathered step -> the bf16 step `conv` [64, 576]: V's [256 w, 256 w + 256)
    (64-column chunks: e4m3 -> f32, x the row's scale of the chunk's 128-column tile, -> bf16, all exact), and for
    warpgroup 0 the rope (bf16, copied). A loop over the chunks (not unrolled: warpgroup 1 holds its 128-register
    accumulator meanwhile)."""
    layout = plgpu.Layout.WGMMA_8BIT

    @pl.loop(0, V_HALF // 64)
    def _(i):
        c = w * (V_HALF // 64) + i
        cols = pl.ds(pl.multiple_of(c * 64, 64), 64)
        x = plgpu.load(lat.at[:, cols], layout=layout).astype(jnp.float32)
        s = plgpu.load(scales.at[lax.div(c, jnp.int32(2))], layout=layout.reduce(1))
        s = plgpu.layout_cast(lax.broadcast_in_dim(s, x.shape, [0]), layout)  # (the broadcast's layout: a hint)
        conv.at[:, cols][...] = (x * s).astype(conv.dtype)

    if w == 0:
        conv.at[:, pl.ds(KV_LORA_RANK, ROPE_DIM)][...] = plgpu.load(rope, layout=plgpu.Layout.WGMMA)


def _build_sparse_fp8_kernel(*, num_tokens: int, heads: int, hp: int, scale_log2: float, interpret: bool,
                             steps: int = 1, num_splits: int = 1):
    dtype = jnp.bfloat16
    num_h_tiles = heads // hp
    plan = sparse_plan(dtype=dtype, num_tokens=num_tokens, heads=heads, hp=hp, scale_log2=scale_log2,
                       interpret=interpret)
    transforms = plan.transforms
    partial = num_splits > 1
    stage_dtype = jnp.float32 if partial else out_stage_dtype(plan)  # fp32 [2, 64, 256]: 128 KiB, in the union

    def body(*refs):
        if interpret:  # the cache's three typed views
            (q_ref, lat_g, sc_g, rope_g, sched_ref, out_ref, lse_ref), rest = refs[:7], refs[7:]
            kv_ref = None
        else:
            (q_ref, kv_ref, sched_ref, out_ref, lse_ref), rest = refs[:5], refs[5:]
        (union, p_smem, x_smem, i_smem, hdr_bar, q_bar, idx_bar, kv_ready, deq_ready, p_ready, p_free,
         init_bar) = rest
        (q_smem, conv, lat, rope, scales), stage = union
        # i_smem: row 0 the header (words [0, 32)) and the gather's mbarrier (words [32, 34)), rows 1.. the index
        # chunks
        hdr_smem = i_smem.at[0, pl.ds(0, HDR_WORDS)]
        gbars = i_smem.at[0, pl.ds(HDR_WORDS, 2)]
        hb = lax.axis_index("h")
        tok = lax.axis_index("tok")
        wg = lax.axis_index("wg")
        kc = sparse_ctx(plan, hb, out_ref, lse_ref, stage, x_smem)
        accumulate = functools.partial(accumulate_wgmma, interpret=interpret)
        row_layout = plgpu.Layout.WGMMA.reduce(1)

        def idx_chunk(i):
            return index_chunk(i_smem, i)

        def load_idx(i):
            load_index_chunk(sched_ref, i_smem, idx_bar, tok, lo, i)

        lo, n = token_steps(sched_ref, hdr_smem, hdr_bar, gbars, init_bar, wg, tok, num_splits, steps, interpret)

        def issue(i):
            """(warpgroup 1) Step i's rows into the fp8 slot (free), from index chunk i (staged); chunk i + 1
            staged next (its slot's last reader, the scores of step i - 2, is done: the slot was free)."""
            plgpu.barrier_wait(idx_bar.at[lax.rem(i, jnp.int32(IDX_SLOTS))])
            ix = idx_chunk(i)
            if interpret:
                for r in range(BLOCK_KV):
                    s = slot_of_entry(ix[r])
                    plgpu.copy_gmem_to_smem(lat_g.at[pl.ds(s, 1)], lat.at[pl.ds(r, 1)], kv_ready)
                    plgpu.copy_gmem_to_smem(rope_g.at[pl.ds(s, 1)], rope.at[pl.ds(r, 1)], kv_ready)
                    plgpu.copy_gmem_to_smem(sc_g.at[:, pl.ds(s, 1)], scales.at[:, pl.ds(r, 1)], kv_ready)
            else:
                gather_rows_fp8(kv_ref, lat, rope, scales, ix, gbars)

            @pl.when(i + 1 < n)
            def _():
                load_idx(i + 1)

        def convert(k, w):
            """Step k (gathered) -> this warpgroup's columns of conv, fenced for the wgmmas; deq_ready."""
            with jax.named_scope("kv_wait"):
                if interpret:
                    plgpu.barrier_wait(kv_ready)
                else:
                    gather_wait(gbars, jnp.int32(0), lax.rem(k, jnp.int32(2)))
            with jax.named_scope("dequant"):
                convert_columns(lat, scales, rope, conv, w)
                plgpu.commit_smem()
            plgpu.barrier_arrive(deq_ready)
            with jax.named_scope("deq_wait"):
                plgpu.barrier_wait(deq_ready)

        def pv(acc, half):
            v = conv.at[:, pl.ds(half * V_HALF, V_HALF)]
            return accumulate(acc, lambda acc_ref: plgpu.wgmma(acc_ref, p_smem, v))

        @pl.when(wg == 0)
        def _():
            m_i, l_i = start_scores(init_bar, q_bar, row_layout)

            def step(k, carry):
                acc, m_i, l_i = carry
                convert(k, 0)

                def qk(s_ref):
                    plgpu.wgmma(s_ref, q_smem, conv.transpose((1, 0)))
                    return s_ref[...]

                with jax.named_scope("qk"):
                    s = pl.run_scoped(qk, plgpu.ACC((BLOCK_H, BLOCK_KV), jnp.float32))
                p, alpha, m_new, l_i = masked_softmax(s, idx_chunk(k), m_i, l_i, scale_log2)
                hand_over_p(k, p, alpha, p_smem, x_smem, p_free, p_ready)
                acc = rescale(acc, alpha)
                with jax.named_scope("pv"):
                    acc = pv(acc, 0)
                return acc, m_new, l_i

            acc, m_i, l_i = lax.fori_loop(0, n, step, (zeros_acc(), m_i, l_i))

            finish_scores_warpgroup(kc, partial, tok, n, acc, m_i, l_i, p_free, p_ready)

        @pl.when(wg == 1)
        def _():
            load_q(q_ref, q_smem, tok, hb, hp, q_bar)

            pl.when(n > 0)(functools.partial(load_idx, 0))

            @pl.loop(0, jnp.minimum(n, 1))  # (a traced index: chunk 1's slice is out of bounds at one step)
            def _prologue(i):
                issue(i)

            def step(k, acc):
                convert(k, 1)  # (then both warpgroups are done with the fp8 slot)
                pl.when(k + 1 < n)(functools.partial(issue, k + 1))
                plgpu.barrier_wait(p_ready)
                acc = rescale(acc, plgpu.load(x_smem.at[0], layout=row_layout))
                with jax.named_scope("pv"):
                    acc = pv(acc, 1)
                plgpu.barrier_arrive(p_free)
                return acc

            acc = lax.fori_loop(0, n, step, zeros_acc())
            plgpu.barrier_wait(p_ready)
            write_token(kc, partial, tok, 1, acc, plgpu.load(x_smem.at[plan.sums_row], layout=row_layout), None)

    stage_cols = 128 // jnp.dtype(stage_dtype).itemsize
    stage_transforms = (plgpu.TilingTransform((8, stage_cols)), plgpu.SwizzleTransform(128))
    scratch = [
        plgpu.RefUnion(
            (plgpu.SMEM((BLOCK_H, HEAD_DIM), dtype, transforms=transforms),  # q
             plgpu.SMEM((BLOCK_KV, HEAD_DIM), dtype, transforms=transforms),  # the converted step
             plgpu.SMEM((BLOCK_KV, KV_LORA_RANK), jnp.float8_e4m3fn, transforms=FP8_RING_TILES),  # gathered: latent
             plgpu.SMEM((BLOCK_KV, ROPE_DIM), dtype, transforms=ROPE_TILES),  # gathered: rope
             plgpu.SMEM((NUM_TILES, BLOCK_KV), jnp.float32)),  # gathered: scales, transposed
            plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, V_HALF), stage_dtype, transforms=stage_transforms),
        ),
        plgpu.SMEM((BLOCK_H, BLOCK_KV), dtype, transforms=transforms),  # P
        plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H), jnp.float32),  # alpha, the row sums, lse
        plgpu.SMEM((1 + IDX_SLOTS, BLOCK_KV), jnp.int32),  # the header, the gather's mbarrier, the index chunks
        plgpu.Barrier(),  # hdr_bar
        plgpu.Barrier(),  # q_bar
        plgpu.Barrier(num_barriers=IDX_SLOTS),  # idx_bar
        plgpu.Barrier(num_arrivals=3 * BLOCK_KV),  # kv_ready (interpret: three TMAs a row)
        plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS),  # deq_ready: both warpgroups converted (and done with the slot)
        plgpu.Barrier(),  # p_ready (then the row sums)
        plgpu.Barrier(),  # p_free
        plgpu.Barrier(),  # init_bar: the gather's mbarrier initialised
    ]
    out_type = kernel_out_type(num_tokens, heads, num_splits, out_stage_dtype(plan))
    grid, grid_names = kernel_grid(num_h_tiles, num_tokens, num_splits)
    return launch(body, out_type, scratch, grid, grid_names)


def typed_views(kv_flat):
    """(interpret) uint8 [num_slots, 656] -> (latent float8_e4m3fn [num_slots, 512], scales float32 [4, num_slots]
    (transposed, as the kernel keeps them), rope bfloat16 [num_slots, 64]): XLA copies."""
    num_slots = kv_flat.shape[0]
    lat = lax.bitcast_convert_type(kv_flat[:, :KV_LORA_RANK], jnp.float8_e4m3fn)
    sc = lax.bitcast_convert_type(kv_flat[:, SCALES_OFFSET:ROPE_OFFSET].reshape(num_slots, NUM_TILES, 4),
                                  jnp.float32)
    rope = lax.bitcast_convert_type(kv_flat[:, ROPE_OFFSET:].reshape(num_slots, ROPE_DIM, 2), jnp.bfloat16)
    return lat, sc.T, rope


def sparse_decode_fp8(q, kv_flat, sched, *, heads: int, hp: int, steps: int, scale_log2: float, interpret: bool,
                      num_splits: int = 1):
    """(sparse._sparse_decode) q [T, heads, 576] bfloat16 (heads padded), kv_flat uint8 [num_slots, 656], sched
    (encode_indices, `steps` 64-entry chunks a token) -> (out [T, heads, 512] bfloat16, lse [T, heads] float32),
    or with num_splits > 1 the splits' float32 partials (out [S, T, heads, 512], lse [S, T, heads])."""
    kernel = _build_sparse_fp8_kernel(num_tokens=q.shape[0], heads=heads, hp=hp, scale_log2=scale_log2,
                                      interpret=interpret, steps=steps, num_splits=num_splits)
    if interpret:
        return kernel(q, *typed_views(kv_flat), sched)
    return kernel(q, kv_flat, sched)
