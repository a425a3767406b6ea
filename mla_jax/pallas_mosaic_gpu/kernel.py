"""The kernel builder: the shared-memory layout of each path (a RefUnion where the output stage aliases q and the
ring), the barriers, the grid and its launch order, and the kernel body that hands each compute warpgroup its path
(one_chain or halves) with the trace-time context (Ctx)."""

from __future__ import annotations

import dataclasses
import functools
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.pallas_mosaic_gpu.config import (
    BLOCK_H, HEAD_DIM, INFO_WORDS, KV_LORA_RANK, NUM_COMPUTE_WGS, Plan, QK_ROPE_HEAD_DIM, REDUCTION_SCRATCH_BYTES,
    V_HALF, make_plan,
)
from mla_jax.pallas_mosaic_gpu.layouts import F16_TILES, FP8_RING_TILES, PAIR_COLS, PAIR_TILES, RED_FLOATS_PER_COLUMN
from mla_jax.pallas_mosaic_gpu.softmax import accumulate_wgmma
from mla_jax.pallas_mosaic_gpu.one_chain import compute_wg
from mla_jax.pallas_mosaic_gpu.halves import compute_wg_halves


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What the kernel's building blocks read at trace time: the decided plan, the CTA's grid indices, its
    shared-memory buffers and barriers, and the refs in global memory (None where the path has none)."""

    plan: Plan
    # global memory: q [T, H, 576], the cache, the requests' block tables (sched_ref), the pieces' rows (piece_ref),
    # out and lse, the slots' partials (o_part_ref, l_part_ref; None where the kernel has none)
    q_ref: object
    kv_ref: object
    sched_ref: object
    piece_ref: object
    out_ref: object
    lse_ref: object
    o_part_ref: object
    l_part_ref: object
    # the CTA: its head tile, piece (its slot) and query tile; its info row (a view of i_smem)
    hb: object
    piece: object
    lt: object
    info_smem: object
    # shared memory: q (q_bf16: its bfloat16 view), the ring, the f16 copies (deq_smem; deq_v and deq_rope with
    # the overlap; kv_v on the halves path), P, the vectors (x_smem), info + block table (i_smem), the output stage,
    # transposed P @ V's O^T parts and identity (t_smem, e_smem), the halves' partials (m_smem) and reductions
    q_smem: object
    q_bf16: object
    stage_out: object  # (direct_single) the output stage seen in the output's dtype
    kv_smem: object
    deq_smem: object
    deq_v: object
    deq_rope: object
    kv_v: object
    p_smem: object
    x_smem: object
    i_smem: object
    stage: object
    t_smem: object
    e_smem: object
    m_smem: object
    red_smem: object
    # barriers
    q_bar: object
    info_bar: object
    bt_bar: object
    bt_bar_wg1: object
    kv_ready: object
    kv_consumed: object
    sync_a: object  # p_ready on the one chain; the merge's hand-overs on the halves path
    sync_b: object  # p_free
    deq_ready: object
    # acc + the wgmmas a function issues (accumulate_wgmma, interpret mode's form where it runs)
    accumulate: object


def _build_kernel(*, dtype, page_size: int, num_tokens: int, heads: int, hp: int, num_h_tiles: int, q_tiles: int,
                  num_reqs: int, num_slots: int, bt_chunk: int, scale_log2: float, direct_single: bool = False,
                  score_rows: int = 0,
                  fp8: bool = False, transposed_pv: bool = False, heads_fastest: bool = False,
                  kv_halves: bool = False, pv_registers: bool = False, pv_wait: int = 4, q_bits: bool = False,
                  pair_ring: bool = False, out_dtype=None, interpret: bool = False):
    """The kernel for `heads` query heads (8, 16, 32 or a multiple of 64: the wrapper pads others), for the paths
    that make_plan decides from these arguments (the wrapper's, _mla_decode).

    Grid (head tile, piece x query tile), the last axis the fastest (heads_fastest: reversed, the head tile the
    fastest): CTA (hb, g) takes row g // q_tiles of piece_ref, a piece of the work schedule, the longest first (the
    request's info, the piece's steps and slot, the first block-table chunk it needs; a row past the batch's pieces
    has q_len 0 and the CTA returns), the request's query tokens [lt * tpt, lt * tpt + tpt) for lt = g % q_tiles
    (none: the CTA returns), heads [hb * 64, hb * 64 + 64) (or all `heads` x tpt tokens when heads < 64), and
    writes the piece's fp32 partials to its slot of o_part [num_slots, max_query_len, heads, 512] and l_part
    (direct_single: a request's only piece writes out [T, heads, 512] and lse [T, heads] instead).
    """
    plan = make_plan(dtype=dtype, page_size=page_size, num_tokens=num_tokens, heads=heads, hp=hp,
                     num_h_tiles=num_h_tiles, q_tiles=q_tiles, num_reqs=num_reqs, slot_out=True,
                     direct_single=direct_single, bt_chunk=bt_chunk, scale_log2=scale_log2, score_rows=score_rows,
                     fp8=fp8,
                     transposed_pv=transposed_pv, heads_fastest=heads_fastest, kv_halves=kv_halves,
                     pv_registers=pv_registers, pv_wait=pv_wait, q_bits=q_bits, pair_ring=pair_ring,
                     out_dtype=out_dtype, interpret=interpret)
    block_kv, bt_chunk, dtype, fp8 = plan.block_kv, plan.bt_chunk, plan.dtype, plan.fp8
    interpret, num_tokens = plan.interpret, plan.num_tokens
    overlap_dequant = plan.overlap_dequant
    pages_per_step, pair_ring, pv_registers = plan.pages_per_step, plan.pair_ring, plan.pv_registers
    q_bits = plan.q_bits
    q_rows, q_toks, score_rows = plan.q_rows, plan.q_toks, plan.score_rows
    stage_dtype, stages, transforms, transposed_pv = plan.stage_dtype, plan.stages, plan.transforms, plan.transposed_pv

    def body(q_ref, kv_ref, sched_ref, piece_ref, out_ref, lse_ref, o_part_ref, l_part_ref,
             q_kv_or_stage, p_smem, x_smem, i_smem,
             q_bar, info_bar, bt_bar, kv_ready, kv_consumed, sync_a, sync_b, *extra_barriers):
        deq_smem = deq_v = deq_rope = t_smem = e_smem = None
        q_bf16 = None
        if q_bits:  # (the union's last member: q's tile seen as bfloat16, its TMA's destination)
            *q_kv_or_stage, (q_bf16,) = q_kv_or_stage
        stage_out = None
        if direct_single:  # (the member before: the stage in the output's dtype)
            *q_kv_or_stage, (stage_out,) = q_kv_or_stage
        if transposed_pv and not kv_halves:  # the stage, then O^T's two bf16 parts and the identity that transposes
            # them back
            q_group, (stage, t_smem, e_smem) = q_kv_or_stage
            q_kv_or_stage = q_group, stage
        kv_v = red_smem = m_smem = bt_bar_wg1 = deq_ready = None
        if kv_halves:
            # kv_smem: the fp8 ring, slot w warpgroup w's; kv_v: each warpgroup's f16 copy of V; x_smem: (after the
            # steps) the row sums, lse and the two partials' max and sums; m_smem: the partials'
            # O^T halves (over q and the ring); red_smem: the scratch of the cross-warp reductions, in P's bytes (the
            # p_smem argument)
            (q_smem, kv_smem, *kv_v), (stage, t_smem, e_smem), (m_smem,) = q_kv_or_stage
            kv_v = kv_v[0] if kv_v else None  # (pv_registers: none)
            p_smem, red_smem = p_smem
            (bt_bar_wg1,) = extra_barriers
        elif fp8 and overlap_dequant:
            # kv_smem: the ring of fp8 steps; deq_v: f16 V halves (0, 1: the first half of even / odd steps, 2: the
            # second half); deq_rope: the rope columns of a step
            (q_smem, kv_smem, deq_v, deq_rope), stage = q_kv_or_stage
            (deq_ready,) = extra_barriers
        elif fp8:
            # kv_smem: the ring of fp8 steps the TMAs fill; deq_smem: the step the wgmmas read
            (q_smem, kv_smem, deq_smem), stage = q_kv_or_stage
            (deq_ready,) = extra_barriers
        else:
            (q_smem, kv_smem), stage = q_kv_or_stage
        hb = lax.axis_index("h")
        g = lax.axis_index("tile")
        wg = lax.axis_index("wg")
        piece = lax.div(g, jnp.int32(q_tiles))
        lt = lax.rem(g, jnp.int32(q_tiles))
        info_smem = i_smem.at[pl.ds(0, INFO_WORDS)]
        accumulate = functools.partial(accumulate_wgmma, interpret=interpret)
        kc = Ctx(plan=plan, accumulate=accumulate, bt_bar=bt_bar, bt_bar_wg1=bt_bar_wg1, deq_ready=deq_ready,
                 deq_rope=deq_rope, deq_smem=deq_smem, deq_v=deq_v, e_smem=e_smem, hb=hb, i_smem=i_smem,
                 info_bar=info_bar, info_smem=info_smem, kv_consumed=kv_consumed, kv_ready=kv_ready, kv_ref=kv_ref,
                 kv_smem=kv_smem, kv_v=kv_v, l_part_ref=l_part_ref, lse_ref=lse_ref, lt=lt, m_smem=m_smem,
                 o_part_ref=o_part_ref, out_ref=out_ref, p_smem=p_smem, piece=piece, piece_ref=piece_ref,
                 q_bar=q_bar, q_bf16=q_bf16, q_ref=q_ref, q_smem=q_smem, red_smem=red_smem, sched_ref=sched_ref,
                 stage=stage, stage_out=stage_out, sync_a=sync_a, sync_b=sync_b, t_smem=t_smem, x_smem=x_smem)

        for w in range(NUM_COMPUTE_WGS):
            pl.when(wg == w)(functools.partial(compute_wg_halves if kv_halves else compute_wg, kc, w))

    def stage_ref(dt):  # the output stage in `dt`: per warpgroup its [64, 256] half, 128-byte swizzle rows
        cols = 128 // jnp.dtype(dt).itemsize
        return plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, V_HALF), dt,
                          transforms=(plgpu.TilingTransform((8, cols)), plgpu.SwizzleTransform(128)))

    # (direct_single) the stage in the output's dtype: a member of its own, at the union's byte 0 as the fp32 stage
    out_view = ((stage_ref(plan.out_dtype),),) if direct_single else ()
    # (transposed_pv) O^T's parts and the identity: rows of score_rows bf16 values, one swizzle row each
    t_transforms = ((plgpu.TilingTransform((8, score_rows)), plgpu.SwizzleTransform(score_rows * 2))
                    if transposed_pv else None)
    if fp8:
        # the ring of fp8 steps (8 x 64 tiles, 64-byte swizzle: one 64-column chunk a row of a tile, read in
        # the WGMMA layout to dequantize) and the dequantized step the wgmmas read (the 16-bit ring's layout;
        # overlap_dequant: three V halves and the rope columns)
        ring = plgpu.SMEM((stages, block_kv, HEAD_DIM), jnp.float8_e4m3fn, transforms=FP8_RING_TILES)
        if overlap_dequant:
            kv_bufs = (ring, plgpu.SMEM((3, block_kv, V_HALF), dtype, transforms=transforms),
                       plgpu.SMEM((1, block_kv, QK_ROPE_HEAD_DIM), dtype, transforms=transforms))
        else:
            kv_bufs = (ring, plgpu.SMEM((1, block_kv, HEAD_DIM), dtype, transforms=transforms))
    else:
        kv_bufs = (plgpu.SMEM((stages, block_kv, HEAD_DIM), dtype, transforms=transforms),)  # KV ring
    # (q_bits) q's tile seen as bfloat16, its TMA's destination: a last member of the union (at its offset 0, as q).
    # RefUnion's docs do not promise its members' placement, nor reading through another member than the one written:
    # jax 0.11.2 places every member group at the union's byte 0 (flatten_ref_union), which this relies on (checked:
    # the lowered TMA's destination is q's view; compiled, test_mosaic_gpu_fp8_q_in_kernel_is_bitwise)
    q_view = ((plgpu.SMEM((q_rows, HEAD_DIM), jnp.bfloat16, transforms=transforms),),) if q_bits else ()
    if kv_halves:
        # q's rows in use, the fp8 ring (a slot a warpgroup), each warpgroup's f16 copy of V; after the steps: the
        # partials' O^T halves; then the stage, O^T's parts and the identity (transposed_pv's)
        f16_tiles = F16_TILES
        half_slots = NUM_COMPUTE_WGS * (2 if pv_registers else 1)  # the fp8 ring: a slot a warpgroup (pv_registers: 2)
        union = plgpu.RefUnion(
            (plgpu.SMEM((q_rows, HEAD_DIM), dtype, transforms=transforms),
             *((plgpu.SMEM((half_slots, block_kv // 2, PAIR_COLS), jnp.float8_e4m3fn, transforms=PAIR_TILES),)
               if pair_ring else
               (plgpu.SMEM((half_slots, block_kv, HEAD_DIM), jnp.float8_e4m3fn, transforms=FP8_RING_TILES),)),
             *([] if pv_registers else
               [plgpu.SMEM((NUM_COMPUTE_WGS, block_kv, KV_LORA_RANK),
                           dtype, transforms=f16_tiles)])),
            (stage_ref(stage_dtype),
             plgpu.SMEM((NUM_COMPUTE_WGS, 2, V_HALF, score_rows), jnp.bfloat16, transforms=t_transforms),
             plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, score_rows), jnp.bfloat16, transforms=t_transforms)),
            # the partials' O^T halves, written and read after the steps, before the stage is written (over q and
            # the ring: 32 KiB at 16 rows, 64 at 32, where its rows of 128 bytes are tiled and swizzled: untiled,
            # its WGMMA-layout load has no conflict-free transfer)
            (plgpu.SMEM((NUM_COMPUTE_WGS, V_HALF, score_rows), jnp.float32,
                        transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
                        if score_rows == 32 else ()),),
            *out_view,
            *q_view,
        )
        scratch = [
            union,
            # each P (P^T seen) and, in its bytes, each warpgroup's scratch of its cross-warp reductions (col_reduce:
            # its two registers a thread in one round), which run while the warpgroup's P is free (its P @ V, waited
            # for at the end of a step, done; the step's P not yet written)
            plgpu.RefUnion(plgpu.SMEM((NUM_COMPUTE_WGS, score_rows, block_kv), dtype, transforms=transforms),
                           plgpu.SMEM((NUM_COMPUTE_WGS, RED_FLOATS_PER_COLUMN * score_rows), jnp.float32)),
            # the merge's vectors (outside the union: used beside the partials and the stage), rows 0: lse, 1: the
            # row sums, 2 + w: warpgroup w's max, 4 + w: its sums
            plgpu.SMEM((6, BLOCK_H), jnp.float32),
            plgpu.SMEM((INFO_WORDS + NUM_COMPUTE_WGS * bt_chunk,), jnp.int32),  # info + a block-table chunk each
            plgpu.Barrier(num_arrivals=q_toks),  # q_bar
            plgpu.Barrier(),  # info_bar
            plgpu.Barrier(),  # bt_bar (warpgroup 0's chunks)
            plgpu.Barrier(num_arrivals=pages_per_step, num_barriers=half_slots),  # kv_ready, a slot each (a TMA a page)
            plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS, num_barriers=stages),  # kv_consumed (unused)
            # sync_a: (q_bits: q converted, then) the merge's three hand-overs
            plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS),
            plgpu.Barrier(num_arrivals=1),  # sync_b (unused)
            plgpu.Barrier(),  # bt_bar_wg1 (warpgroup 1's chunks)
        ]
    else:
        scratch = [
            plgpu.RefUnion(
                (plgpu.SMEM((q_rows, HEAD_DIM), dtype, transforms=transforms), *kv_bufs),  # q, the KV ring
                # the output stage, once every read of q and the ring is done: per warpgroup its
                # [64, 256] half, each token's rows out in one TMA; swizzled, so that the stores of the
                # wgmma accumulator rows do not conflict on shared-memory banks (8-way unswizzled)
                (stage_ref(stage_dtype),
                 # transposed_pv: per warpgroup O^T's two bf16 parts and the identity (after the stage)
                 plgpu.SMEM((NUM_COMPUTE_WGS, 2, V_HALF, score_rows), jnp.bfloat16, transforms=t_transforms),
                 plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, score_rows), jnp.bfloat16, transforms=t_transforms))
                if transposed_pv else
                stage_ref(stage_dtype),
                *out_view,
                *q_view,
            ),
            # P
            plgpu.SMEM((BLOCK_H, block_kv), dtype,
                       transforms=transforms),
            # the rescale factor, the row sums, lse
            plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H), jnp.float32),
            plgpu.SMEM((INFO_WORDS + bt_chunk,), jnp.int32),  # request info + a block-table chunk
            plgpu.Barrier(num_arrivals=q_toks),  # q_bar: one TMA per token of the tile (one for H >= 64)
            plgpu.Barrier(),  # info_bar
            plgpu.Barrier(),  # bt_bar
            plgpu.Barrier(num_arrivals=pages_per_step, num_barriers=stages),  # kv_ready
            plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS, num_barriers=stages),  # kv_consumed
            plgpu.Barrier(num_arrivals=1),  # sync_a (p_ready)
            plgpu.Barrier(num_arrivals=1),  # sync_b (p_free)
        ]
    if fp8 and not kv_halves:
        scratch.append(plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS))  # deq_ready: both column sets dequantized
    # the body finds its CTA by axis name; the last axis is CUDA's x, the launch order's fastest
    axes = (("h", num_h_tiles), ("tile", num_slots * q_tiles))
    grid_names, grid = zip(*(axes[::-1] if heads_fastest else axes))
    part_q = q_tiles * plan.tpt  # (a slot's rows: a request's tokens, as many as its query tiles hold)
    out_type = (
        jax.ShapeDtypeStruct((num_tokens, heads, KV_LORA_RANK), plan.out_dtype),
        jax.ShapeDtypeStruct((num_tokens, heads), jnp.float32),
        jax.ShapeDtypeStruct((num_slots, part_q, heads, KV_LORA_RANK), jnp.float32),
        jax.ShapeDtypeStruct((num_slots, part_q, heads), jnp.float32),
    )
    return plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=scratch,
        grid=grid,
        grid_names=grid_names,
        num_threads=NUM_COMPUTE_WGS,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True,
                                             reduction_scratch_bytes=(REDUCTION_SCRATCH_BYTES
                                                                      if score_rows and not kv_halves else 0),
                                             lowering_semantics=plgpu.LoweringSemantics.Lane),
    )
