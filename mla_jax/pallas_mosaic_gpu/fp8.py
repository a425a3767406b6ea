"""fp8 (e4m3) cache conversion: the exact e4m3 -> f16 conversions (one cvt a value pair), V^T's ldmatrix.trans loads
from the ring, q's bf16 -> f16 conversion in shared memory, and the one-chain path's conversion of a ring step into
f16 buffers (fused into warpgroup 0's scores, or overlapped with the previous step's P @ V)."""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax._src.lib.mlir.dialects import llvm
from jax._src.lib.mlir.dialects import nvvm
from jax._src.lib.mlir.dialects import vector
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.pallas_mosaic_gpu.config import HEAD_DIM, KV_LORA_RANK, V_HALF
from mla_jax.pallas_mosaic_gpu.layouts import (
    Q_WORD_PERM, _ArithOps, _ldmatrix_x4, _pair_window, _q_unit_offsets, _vt_lane_offset, _vt_pair_lane_offset,
)


# (pv_registers) a 32-bit ldmatrix.trans value of fp8 bytes (keys 2 t, 2 t + 1 x columns 2 g, 2 g + 1: bytes
# (k0 c0, k0 c1, k1 c0, k1 c1)) -> two f16 pairs (column 2 g: keys k0, k1; column 2 g + 1: keys k0, k1)
_E4M3_PAIRS_T_PTX = """{
.reg .b32 p;
.reg .b16 lo, hi;
prmt.b32 p, $2, 0, 0x3120;
mov.b32 {lo, hi}, p;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}"""


def _vt_fp8_address(ref):
    """(pv_registers) a thread's ldmatrix address in a [64 keys, 64 columns] fp8 chunk, the tiled memref [8, 1, 8, 64]
    (rows of 64 bytes, 64-byte swizzle): (the i32 constant maker, the chunk's pointer, the thread's byte offset of key
    tile 0, the memref's strides). The swizzle (Mosaic GPU's, as the TMA writes it): a row's 16-byte unit u sits at
    u ^ ((row // 2) % 4)."""
    i32 = ir.IntegerType.get_signless(32)
    ty = ir.MemRefType(ref.type)
    strides, _ = ty.get_strides_and_offset()
    if list(ty.shape) != [8, 1, 8, 64] or list(strides[2:]) != [64, 1]:
        raise NotImplementedError(f"_load_vt_fp8 needs a [64, 64] fp8 chunk tiled (8, 64), got {ty}")
    c = lambda v: arith.constant(i32, v)
    base = _vt_lane_offset(mgpu.utils.thread_idx(), strides[0], _ArithOps)
    return c, mgpu.utils.memref_ptr(ref), base, strides


def _vt_fp8_ldmatrix(c, ptr, base, half_bytes: int, half: int):
    """(pv_registers) the ldmatrix.x4.trans (16-bit values) of keys [32 half, 32 half + 32) of the chunk (half_bytes
    past keys 0 .. 31's lines): a struct of 4 i32 words a thread (matrix mm's word mm)."""
    return _ldmatrix_x4(ptr, arith.addi(base, c(half * half_bytes)), nvvm.MMALayout.col)


def _load_vt_fp8_words(ref):
    """(load_ahead; inside inline Mosaic GPU) _load_vt_fp8's two ldmatrix.x4.trans alone: the 8 words a thread,
    unconverted, carried as a [64, 32] float16 WGMMA-layout array (a word a register, in the order (half, matrix);
    only _convert_vt_fp8 reads them), so that a chunk's loads can be issued a chunk ahead of its conversion."""
    c, ptr, base, strides = _vt_fp8_address(ref)
    return _vt_words(c, ptr, base, 4 * strides[0])


def _vt_words(c, ptr, base, half_bytes: int):
    """_load_vt_fp8_words's (and pair_ring's) two ldmatrix.x4.trans from the thread's line address `base` (keys 32 ..
    63 half_bytes on) as a [64, 32] float16 WGMMA-layout array, a word a register."""
    i32, f16 = ir.IntegerType.get_signless(32), ir.F16Type.get()
    regs = np.empty(mgpu.WGMMA_LAYOUT.registers_shape((64, 32)), dtype=object)
    if regs.size != 8:
        raise NotImplementedError(f"a [64, 32] WGMMA-layout array has {regs.size} registers a thread, not 8")
    for half in range(2):
        words = _vt_fp8_ldmatrix(c, ptr, base, half_bytes, half)
        for mm in range(4):
            regs.flat[4 * half + mm] = mgpu.utils.bitcast(llvm.extractvalue(i32, words, [mm]),
                                                          ir.VectorType.get((2,), f16))
    return mgpu.FragmentedArray(_registers=regs, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)


def _load_vt_pair_words(ref, parity: int):
    """(pair_ring, load_ahead; inside inline Mosaic GPU) _load_vt_fp8_words from chunk 2 i + parity's window of a
    pair slot (_vt_pair_lane_offset's addresses; keys 32 .. 63 two row tiles on): the same words, in the same
    order."""
    c, ptr, strides = _pair_window(ref, parity)
    base = _vt_pair_lane_offset(mgpu.utils.thread_idx(), parity, strides[0], _ArithOps)
    return _vt_words(c, ptr, base, 2 * strides[0])


def _convert_vt_word(regs, half: int, mm: int, word):
    """(pv_registers) one ldmatrix.trans word (i32; matrix mm of the key half `half`) -> V^T's WGMMA-layout registers
    [0, 4 half + mm, 0, 0, h, ...] for h = 0, 1 (_load_vt_fp8's layout): a prmt and two cvts."""
    i32, f16 = ir.IntegerType.get_signless(32), ir.F16Type.get()
    pair = llvm.inline_asm(llvm.StructType.get_literal([i32, i32]), [word], _E4M3_PAIRS_T_PTX, "=r,=r,r")
    for h in range(2):
        regs[0, 4 * half + mm, 0, 0, h, 0, 0, 0, 0] = mgpu.utils.bitcast(
            llvm.extractvalue(i32, pair, [h]), ir.VectorType.get((2,), f16))


def _convert_vt_fp8(words_fa):
    """(load_ahead; inside inline Mosaic GPU) _load_vt_fp8_words's words -> V^T [64 columns, 64 keys] float16 in the
    WGMMA layout, as _load_vt_fp8 converts them."""
    regs = np.empty(mgpu.WGMMA_LAYOUT.registers_shape((64, 64)), dtype=object)
    for i, reg in enumerate(words_fa.registers.flat):
        half, mm = divmod(i, 4)
        _convert_vt_word(regs, half, mm, mgpu.utils.bitcast(reg, ir.IntegerType.get_signless(32)))
    return mgpu.FragmentedArray(_registers=regs, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)


# (q_in_kernel) a bf16 pair (one 32-bit word) -> the f16 pair: both widened to f32 exactly (a shift, an
# and), then one cvt.rn.f16x2.f32 (a's value to the upper half, b's to the lower): round to nearest even, as XLA's
# convert; beyond 65504 inf, as the wrapper's conversion
_BF16X2_TO_F16X2_PTX = """{
.reg .b32 lo, hi;
shl.b32 lo, $1, 16;
and.b32 hi, $1, 0xFFFF0000;
cvt.rn.f16x2.f32 $0, hi, lo;
}"""


def _convert_q_in_place(ref, first: int, count: int, permute: bool):
    """(q_in_kernel; inside inline Mosaic GPU) ref: q's tile in shared memory, f16 [rows, 576] holding q's bf16 bits as
    its TMA wrote them (the tiled memref [rows / 8, 9, 8, 64], 128-byte swizzle). The warpgroup's 128 threads convert
    items [first, first + count) (a row's 16-column group each, _q_unit_offsets; items [w N / 2, w N / 2 + N / 2) are
    groups [18 w, 18 w + 18) of every row) to f16 in place, a thread an item
    at a time: two 16-byte loads, 8 conversions (_BF16X2_TO_F16X2_PTX), two 16-byte stores at the same addresses
    (permute: the words in Q_WORD_PERM's order, q[:, QK_PERM]'s). A thread writes only the bytes it read: no thread
    waits for another's loads."""
    i32, i8 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(8)
    ty = ir.MemRefType(ref.type)
    strides, _ = ty.get_strides_and_offset()
    if (len(ty.shape) != 4 or list(ty.shape[1:]) != [HEAD_DIM // 64, 8, 64] or list(strides[2:]) != [64, 1]
            or mgpu.utils.bitwidth(ty.element_type) != 16):
        raise NotImplementedError(f"_convert_q_in_place needs q's 16-bit tile [rows, {HEAD_DIM}] tiled (8, 64), "
                                  f"got {ty}")
    ops = _ArithOps
    ptr = mgpu.utils.memref_ptr(ref)
    threads = mgpu.utils.WARPGROUP_SIZE
    tid = arith.remui(mgpu.utils.thread_idx(), ops.c(threads))
    v4 = ir.VectorType.get((4,), i32)
    order = Q_WORD_PERM if permute else tuple(range(8))

    def item(local):
        ptrs = [mgpu.utils.getelementptr(ptr, [off], i8)
                for off in _q_unit_offsets(ops.add(local, first), ty.shape[0] * 8, strides, ops)]
        words = []
        for p in ptrs:
            v = llvm.load(v4, p)
            words += [vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([k]))
                      for k in range(4)]
        conv = [llvm.inline_asm(i32, [w], _BF16X2_TO_F16X2_PTX, "=r,r") for w in words]
        new = [mgpu.utils.bitcast(conv[o], ir.VectorType.get((1,), i32)) for o in order]
        for h, p in enumerate(ptrs):
            llvm.store(mgpu.utils.vector_concat(new[4 * h:4 * h + 4]), p)

    for j in range(-(-count // threads)):
        local = arith.addi(tid, ops.c(j * threads))
        if (j + 1) * threads <= count:
            item(local)
        else:
            with mgpu.utils.when(arith.cmpi(arith.CmpIPredicate.ult, local, ops.c(count))):
                item(local)


def kv_tile(kc, slot):
    """The KV step the wgmmas read: the ring's slot, or with fp8 the dequantized step. Its index
    (always 0) is read from info word 4 at each use: with a constant address the compiler hoists
    the descriptors of the step's wgmmas (64-bit each, 2 per wgmma) out of the KV loop, and they
    spill (ptxas: ~1 KiB a thread)."""
    fp8 = kc.plan.fp8
    deq_smem, info_smem, kv_smem = kc.deq_smem, kc.info_smem, kc.kv_smem
    return deq_smem.at[info_smem[4]] if fp8 else kv_smem.at[slot]


def deq_chunk(kc, k, c: int):
    """(overlap_dequant) chunk c (static; columns [64 c, 64 c + 64)) of step k's f16 copy: V's first half
    in deq_v[k % 2], its second half in deq_v[2], the rope in deq_rope (dynamic indices, as kv_tile's)."""
    deq_rope, deq_v, info_smem = kc.deq_rope, kc.deq_v, kc.info_smem
    if c == KV_LORA_RANK // 64:
        return deq_rope.at[info_smem[4]]
    if c < V_HALF // 64:
        return deq_v.at[lax.rem(k, jnp.int32(2)), :, pl.ds(c * 64, 64)]
    return deq_v.at[info_smem[4] + 2, :, pl.ds((c - V_HALF // 64) * 64, 64)]


def deq_half(kc, k, half: int):
    """(overlap_dequant) V half `half` of step k's f16 copy, [block_kv, 256]."""
    deq_v, info_smem = kc.deq_v, kc.info_smem
    return deq_v.at[lax.rem(k, jnp.int32(2)) if half == 0 else info_smem[4] + 2]


def convert_step(kc, k, begin, kv_len, convert_chunks, wait: bool = True, fence: bool = False):
    """Converts columns of fp8 step k (its ring slot; wait: once its TMA is done, a warpgroup waiting once
    for each phase of a barrier): convert_chunks(slot, keep), keep the rows kept (rows_below) in the step
    that runs past kv_len (their cache slots may hold NaN), else None; fence: then commit_smem. -> the slot."""
    block_kv, stages = kc.plan.block_kv, kc.plan.stages
    kv_ready = kc.kv_ready
    slot = lax.rem(k - begin, jnp.int32(stages))
    if wait:
        with jax.named_scope("deq_wait"):
            plgpu.barrier_wait(kv_ready.at[slot])
    valid = kv_len - k * block_kv
    with jax.named_scope("dequant"):
        pl.when(valid < block_kv)(lambda: convert_chunks(slot, rows_below(kc, valid)))
        pl.when(valid >= block_kv)(lambda: convert_chunks(slot, None))
        if fence:
            plgpu.commit_smem()
    return slot


def overlap_convert(kc, k, begin, kv_len, chunks, wait: bool = True):
    """(overlap_dequant) chunks (static) of fp8 step k into their f16 buffers (deq_chunk). No fence."""
    def convert_chunks(slot, keep):
        for c in chunks:
            convert_chunk(kc, slot, c, keep, deq_chunk(kc, k, c))

    convert_step(kc, k, begin, kv_len, convert_chunks, wait=wait)


def k_scale(kc):
    """The fp8 cache's per-tensor scale, float32 bits in info word 3 (after tile_info's wait)."""
    info_smem = kc.info_smem
    return lax.bitcast_convert_type(info_smem[3], jnp.float32)


def rows_below(kc, valid, layout=None):
    """[block_kv, 64] in `layout` (default deq_layout): row < valid (the rows of a step kept by its
    dequantization)."""
    block_kv, deq_layout = kc.plan.block_kv, kc.plan.deq_layout
    return plgpu.broadcasted_iota(jnp.int32, (block_kv, 64), 0, layout=layout or deq_layout) < valid


def convert_chunk(kc, slot, c, keep=None, dst=None):
    """Chunk c (columns [64 c, 64 c + 64)) of the fp8 step in ring slot `slot` -> the dequantized step
    (or `dst`, a [64, 64] ref); rows where `keep` (rows_below) is False become 0 (their cache slots may
    hold NaN)."""
    deq_layout, dtype = kc.plan.deq_layout, kc.plan.dtype
    deq_smem, kv_smem = kc.deq_smem, kc.kv_smem
    # e4m3 -> f16, exact: one cvt.rn.f16x2.e4m3x2 per two values
    cols = pl.ds(c * 64 if isinstance(c, int) else pl.multiple_of(c * 64, 64), 64)
    x = plgpu.load(kv_smem.at[slot, :, cols], layout=deq_layout)
    x = x.astype(dtype)
    if keep is not None:
        x = jnp.where(keep, x, jnp.zeros_like(x))
    (deq_smem.at[0, :, cols] if dst is None else dst)[...] = x


def dequantize(kc, w: int, k, begin, kv_len):
    """fp8 step k (ring slot) -> the dequantized step, this warpgroup's columns: those of its P @ V
    half (warpgroup 0 also the 64 rope columns, which only its scores read), so that neither
    warpgroup writes columns the other may still be reading. In the step that runs past kv_len,
    rows past it become 0 (their cache slots may hold NaN; P = 0 times NaN is NaN). Then releases
    the slot to the TMAs."""
    deq_ready, kv_consumed = kc.deq_ready, kc.kv_consumed
    slot = convert_step(kc, k, begin, kv_len, functools.partial(convert_columns, kc, w), fence=True)
    plgpu.barrier_arrive(deq_ready)
    plgpu.barrier_arrive(kv_consumed.at[slot])


def convert_columns(kc, w: int, slot, keep):
    """This warpgroup's columns of the fp8 step in `slot` -> the dequantized step (rows where `keep` is False
    0): its P @ V half, then (warpgroup 0) the rope chunk; a loop over the chunks (not unrolled)."""
    num_chunks = V_HALF // 64 + (1 if w == 0 else 0)  # 64-column chunks (warpgroup 0: + rope)

    @pl.loop(0, num_chunks)
    def _(i):
        # chunk i of this warpgroup's columns: V half w, then (warpgroup 0) the rope chunk
        rope_i = (i == V_HALF // 64).astype(jnp.int32)
        convert_chunk(kc, slot, w * (V_HALF // 64) + i + rope_i * (KV_LORA_RANK // 64 - V_HALF // 64), keep)


def fused_chunks(kc, w: int) -> list[int]:
    """The 64-column chunks of the head dim warpgroup w converts (fused_dequant):
    warpgroup 0 the rope chunk first (its scores' wgmma can start at once), then its P @ V half; 1 its half."""
    v = [w * (V_HALF // 64) + i for i in range(V_HALF // 64)]
    return [KV_LORA_RANK // 64] + v if w == 0 else v


def convert_q(kc, first: int, count: int):
    """(q_bits) Items [first, first + count) of q's tile (a row's 16 columns each) from bf16 to f16 in place by
    this warpgroup (_convert_q_in_place), then fenced for the wgmmas (commit_smem: and a warpgroup barrier)."""
    qk_permuted, transforms = kc.plan.qk_permuted, kc.plan.transforms
    q_smem = kc.q_smem
    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(transforms),))
    def conv(ctx, r):
        del ctx
        _convert_q_in_place(r, first, count, permute=qk_permuted)

    conv(q_smem)
    plgpu.commit_smem()
