"""Register layouts and shared-memory addresses: the column permutations that let a wgmma take registers loaded
4 fp8 values a thread (QK_PERM) or by ldmatrix.trans (PV_PERM), the pair ring's and q tile's byte addresses (plain
Python ints in the tests, i32 arith ops in the kernel), and the ldmatrix / stmatrix loads of a pair slot."""

from __future__ import annotations

import numpy as np
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax._src.lib.mlir.dialects import llvm
from jax._src.lib.mlir.dialects import nvvm
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.pallas_mosaic_gpu.config import HEAD_DIM, KV_LORA_RANK


# (kv_halves) the scratch of a warpgroup's cross-warp column reductions of [64, n] fp32: 4 warps x 32 lanes x 2 floats
# for each of the n / 8 registers a thread holds, so that all of them go in one round (one store, barrier, load,
# barrier; 256 floats took them one register at a time)
RED_FLOATS_PER_COLUMN = 4 * 32 * 2 // 8


# kv_halves: each warpgroup's f16 copy of V, 8 x 64 tiles with a 128-byte swizzle
F16_TILES = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


# the fp8 ring's slots: 8 x 64 tiles (a 64-column chunk a row of a tile), 64-byte swizzle
FP8_RING_TILES = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(64))


# the halves path's scores operands (qk_permuted): a [64, 64] f16 array in the WGMMA_8BIT layout (a thread's
# register j holds columns 16 j' + 4 q .. + 3, q = lane % 4) taken as the WGMMA layout's (2 columns a register
# piece: 8 j + 2 q, + 1) without moving a value: the column the WGMMA layout calls c holds column
# QK_PERM_16[c % 16] + c - c % 16 (derived from jax 0.11.2's layouts, fragmented_array.py; checked in
# tests/test_fp8.py)
QK_PERM_16 = (0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)
QK_PERM = np.array([16 * b + QK_PERM_16[c] for b in range(HEAD_DIM // 16) for c in range(16)])  # q's 576 columns
QK_PERM_64 = QK_PERM[:64]  # a 64-column chunk's


# v_from_ring (pv_registers): P @ V's left operand V^T [64 columns, 64 keys] of a chunk loaded from the fp8 slot by
# ldmatrix.trans of 16-bit values (two adjacent fp8 columns each), so a thread holds columns 2 g and 2 g + 1 of its
# keys: row r of the WGMMA layout's 16 (g = r % 8) holds V's column PV_PERM_16[r] = 2 (r % 8) + r // 8, and O^T's
# rows (the output's columns) come out permuted the same way, undone in the wrapper (PV_UNPERM)
PV_PERM_16 = tuple(2 * (r % 8) + r // 8 for r in range(16))
PV_PERM = np.array([16 * b + PV_PERM_16[r] for b in range(KV_LORA_RANK // 16) for r in range(16)])
PV_UNPERM = np.argsort(PV_PERM)  # out[..., PV_UNPERM]: the kernel's output columns back in order


def _rewrap_8bit_as_wgmma(fa):
    """(qk_permuted; inside inline Mosaic GPU) a [64 m, 64 n] 16-bit FragmentedArray in the WGMMA_8BIT layout
    (4-value register pieces) -> the same registers as a WGMMA-layout array (each piece split in two): its columns
    permuted by QK_PERM within each 16, no instruction emitted (FragmentedArray.to_layout's index map, without its
    shuffles)."""
    if fa.layout != mgpu.WGMMA_LAYOUT_8BIT or ir.VectorType(fa.registers.flat[0].type).shape != [4]:
        raise NotImplementedError(f"_rewrap_8bit_as_wgmma needs WGMMA_8BIT pieces of 4, got {fa.layout}, "
                                  f"{fa.registers.flat[0].type}")
    shape = mgpu.WGMMA_LAYOUT.registers_shape(fa.shape)
    regs = np.empty(shape, dtype=object)
    for idx, reg in np.ndenumerate(fa.registers):
        for s in range(2):
            regs[(idx[0], 2 * idx[1] + s, *idx[2:len(shape)])] = mgpu.utils.vector_slice(reg, slice(2 * s, 2 * s + 2))
    return mgpu.FragmentedArray(_registers=regs, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)


def _vt_lane_offset(tid, tile_stride: int, ops=None):
    """(_vt_fp8_address) thread tid's ldmatrix row address (bytes from the chunk's start) for key tile 0: lane 8 m +
    rr gives line rr of matrix m, key 8 m + rr; warp tid // 32 % 4 the chunk's 16-byte unit of its 16 columns, at
    the 64-byte swizzle's (row // 2) % 4; tile_stride: the bytes between 8-key tiles. Python ints with _IntOps, the
    default (the tests' model)."""
    ops = _IntOps if ops is None else ops
    lane, wp = ops.rem(tid, 32), ops.rem(ops.div(tid, 32), 4)
    m, rr = ops.div(lane, 8), ops.rem(lane, 8)
    unit = ops.xor(wp, ops.band(ops.shr(rr, 1), 3))
    return ops.add(ops.add(ops.mul(m, tile_stride), ops.mul(rr, 64)), ops.shl(unit, 4))


def _ldmatrix_x4(ptr, offset, layout):
    """ldmatrix.x4 of 8 x 8 16-bit matrices, this lane's line at byte `offset` from ptr (layout nvvm.MMALayout.col:
    .trans): a struct of 4 i32 words a thread (matrix mm's word mm)."""
    return nvvm.ldmatrix(mgpu.utils.getelementptr(ptr, [offset], ir.IntegerType.get_signless(8)), layout=layout,
                         num=4, shape=ir.Attribute.parse("#nvvm.ld_st_matrix_shape<m=8, n=8>"),
                         elt_type=nvvm.LdStMatrixEltType.B16)


# (ring_pairs, pair_ring) the fp8 cache seen two tokens a row, [N, P / 2, 1152] (a free reshape): a slot's 32 pair
# rows in 8 x 128 tiles with a 128-byte swizzle, token 2 p + h's column c at pair row p, column 576 h + c. Each
# step's TMA then brings whole 128-byte lines (the bf16 ring's boxes and 1152-byte pitch at half the rows; the
# default fp8 ring's 64-byte box rows take half lines). The kernel's own ldmatrix addresses read a chunk's tokens
# in their order (the scores' K, V^T, the tail's zeroing), so every sum runs as the default's.
PAIR_COLS = 2 * HEAD_DIM
PAIR_TILES = (plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))


def _pair_offset(tok, col, row_tile_stride, ops=None):
    """(pair_ring) the byte offset of token tok's 16 bytes at column col (a multiple of 16) in a window of a pair
    slot (the tiled memref [pair rows / 8, tile columns, 8, 128]: row_tile_stride its first stride, tile columns
    1024 bytes apart): pair row p = tok // 2, column b = 576 (tok % 2) + col, the 128-byte swizzle's unit
    ((b // 16) % 8) ^ (p % 8) (Mosaic GPU's, as the TMA writes it). Python ints with _IntOps, the default."""
    ops = _IntOps if ops is None else ops
    p = ops.shr(tok, 1)
    b = ops.add(ops.mul(ops.band(tok, 1), HEAD_DIM), col)
    unit = ops.xor(ops.band(ops.shr(b, 4), 7), ops.band(p, 7))
    return ops.add(ops.add(ops.mul(ops.shr(p, 3), row_tile_stride), ops.shl(ops.shr(b, 7), 10)),
                   ops.add(ops.shl(ops.band(p, 7), 7), ops.shl(unit, 4)))


def _k_pair_lane_offset(tid, parity: int, call: int, row_tile_stride, ops=None):
    """(pair_ring) thread tid's ldmatrix (not transposed) line address for the scores' K chunk c = 2 i + parity in
    its window (from tile column i): lane 8 mm + rr gives line rr of matrix mm, register [0, 2 call + mm // 2, 0, 0,
    mm % 2] of the WGMMA_8BIT layout (a thread's word: line lane // 4, bytes 4 (lane % 4) .. + 3): token 16 warp +
    8 (mm % 2) + rr, the chunk's columns 16 (2 call + mm // 2) .. + 16."""
    ops = _IntOps if ops is None else ops
    lane, wp = ops.rem(tid, 32), ops.rem(ops.div(tid, 32), 4)
    mm, rr = ops.shr(lane, 3), ops.band(lane, 7)
    tok = ops.add(ops.add(ops.shl(wp, 4), ops.shl(ops.band(mm, 1), 3)), rr)
    col = ops.add(64 * parity + 32 * call, ops.shl(ops.shr(mm, 1), 4))
    return _pair_offset(tok, col, row_tile_stride, ops)


def _vt_pair_lane_offset(tid, parity: int, row_tile_stride, ops=None):
    """(pair_ring) thread tid's ldmatrix.trans line address for V^T's chunk c = 2 i + parity in its window, keys 0 ..
    31 (keys 32 .. 63: 2 row_tile_stride on): lane 8 m + rr gives line rr of matrix m, key 8 m + rr, the chunk's
    columns [16 w, 16 w + 16) (w: the warp), as _vt_lane_offset's."""
    ops = _IntOps if ops is None else ops
    lane, wp = ops.rem(tid, 32), ops.rem(ops.div(tid, 32), 4)
    return _pair_offset(lane, ops.add(64 * parity, ops.shl(wp, 4)), row_tile_stride, ops)


def _pair_window(ref, parity: int):
    """(pair_ring) a window's (the i32 constant maker, pointer, strides), checked: the tiled memref [4, 5 + parity,
    8, 128] of fp8 (chunk 2 i + parity's columns of the even tokens lie in the window's tile column 0, of the odd
    ones in its column 4 + parity)."""
    i32 = ir.IntegerType.get_signless(32)
    ty = ir.MemRefType(ref.type)
    strides, _ = ty.get_strides_and_offset()
    if list(ty.shape) != [4, 5 + parity, 8, 128] or list(strides[1:]) != [1024, 128, 1]:
        raise NotImplementedError(f"a pair_ring chunk needs a [32, {640 + 128 * parity}] window of a pair slot "
                                  f"tiled (8, 128), got {ty}")
    return (lambda v: arith.constant(i32, v)), mgpu.utils.memref_ptr(ref), strides


def _load_k_pair_fp8(ref, parity: int):
    """(pair_ring; inside inline Mosaic GPU) ref: chunk 2 i + parity's window of a pair slot (_pair_window) -> the
    chunk [64 tokens, 64 columns] fp8 in the WGMMA_8BIT layout, as plgpu.load gives the default slot's: two
    ldmatrix.x4 (16-bit lines) a thread (_k_pair_lane_offset)."""
    i32 = ir.IntegerType.get_signless(32)
    _, ptr, strides = _pair_window(ref, parity)
    regs = np.empty(mgpu.WGMMA_LAYOUT_8BIT.registers_shape((64, 64)), dtype=object)
    if regs.size != 8:
        raise NotImplementedError(f"a [64, 64] WGMMA_8BIT array has {regs.size} registers a thread, not 8")
    f8x4 = ir.VectorType.get((4,), ir.Float8E4M3FNType.get())
    tid = mgpu.utils.thread_idx()
    for call in range(2):
        words = _ldmatrix_x4(ptr, _k_pair_lane_offset(tid, parity, call, strides[0], _ArithOps), nvvm.MMALayout.row)
        for mm in range(4):
            regs.flat[4 * call + mm] = mgpu.utils.bitcast(llvm.extractvalue(i32, words, [mm]), f8x4)
    return mgpu.FragmentedArray(_registers=regs, _layout=mgpu.WGMMA_LAYOUT_8BIT, _is_signed=None)


def _store_k_pair_fp8(fa, ref, parity: int):
    """(pair_ring; inside inline Mosaic GPU) _load_k_pair_fp8's inverse: the chunk's registers back to its window,
    two stmatrix.x4 a thread at the same addresses."""
    i32, i8 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(8)
    _, ptr, strides = _pair_window(ref, parity)
    if fa.layout != mgpu.WGMMA_LAYOUT_8BIT or fa.registers.size != 8:
        raise NotImplementedError(f"_store_k_pair_fp8 needs a [64, 64] WGMMA_8BIT array, got {fa.layout}")
    tid = mgpu.utils.thread_idx()
    for call in range(2):
        off = _k_pair_lane_offset(tid, parity, call, strides[0], _ArithOps)
        words = [mgpu.utils.bitcast(fa.registers.flat[4 * call + mm], i32) for mm in range(4)]
        nvvm.stmatrix(mgpu.utils.getelementptr(ptr, [off], i8), words, layout=nvvm.MMALayout.row,
                      shape=ir.Attribute.parse("#nvvm.ld_st_matrix_shape<m=8, n=8>"),
                      elt_type=nvvm.LdStMatrixEltType.B16)


# (q_in_kernel with qk_permuted) the 8 32-bit words (column pairs) of a 16-column group of q in QK_PERM_16's order:
# word j of the permuted group is word Q_WORD_PERM[j] of q's
Q_WORD_PERM = tuple(QK_PERM_16[2 * j] // 2 for j in range(8))
Q_GROUPS = HEAD_DIM // 16  # a row of q: 36 groups of 16 columns (32 bytes, two 16-byte units)


class _IntOps:
    """_q_unit_offsets's arithmetic on Python ints (the tests' model of the kernel's addresses)."""
    div, rem, add, mul, xor = (lambda a, b: a // b), (lambda a, b: a % b), (lambda a, b: a + b), \
        (lambda a, b: a * b), (lambda a, b: a ^ b)
    shr, band, shl = (lambda a, b: a >> b), (lambda a, b: a & b), (lambda a, b: a << b)


class _ArithOps:
    """_q_unit_offsets's arithmetic as i32 arith ops (inside inline Mosaic GPU; Python ints become constants)."""

    @staticmethod
    def c(v):
        return arith.constant(ir.IntegerType.get_signless(32), v) if isinstance(v, int) else v

    div = staticmethod(lambda a, b: arith.divui(_ArithOps.c(a), _ArithOps.c(b)))
    rem = staticmethod(lambda a, b: arith.remui(_ArithOps.c(a), _ArithOps.c(b)))
    add = staticmethod(lambda a, b: arith.addi(_ArithOps.c(a), _ArithOps.c(b)))
    mul = staticmethod(lambda a, b: arith.muli(_ArithOps.c(a), _ArithOps.c(b)))
    xor = staticmethod(lambda a, b: arith.xori(_ArithOps.c(a), _ArithOps.c(b)))
    shr = staticmethod(lambda a, b: arith.shrui(_ArithOps.c(a), _ArithOps.c(b)))
    band = staticmethod(lambda a, b: arith.andi(_ArithOps.c(a), _ArithOps.c(b)))
    shl = staticmethod(lambda a, b: arith.shli(_ArithOps.c(a), _ArithOps.c(b)))


def _q_unit_offsets(i, rows: int, strides, ops=_IntOps):
    """(q_in_kernel) item i of q's tile [rows, 576] in shared memory (row i % rows, 16-column group i // rows: the
    rows fastest, so that 8 threads in a row take 8 rows of a tile, whose swizzles put their units on different banks),
    16-bit values tiled (8, 64) with a 128-byte swizzle (strides: the tiled memref [rows / 8, 9, 8, 64]'s, in
    elements) -> the byte offsets of the group's two 16-byte units. The swizzle is Mosaic GPU's (fragmented_array.py's
    transfer_tiled, as the TMA's): 16-byte unit u of a tile's row rr (128 bytes) sits at unit u ^ rr."""
    r, g = ops.rem(i, rows), ops.div(i, rows)
    rr = ops.rem(r, 8)
    base = ops.add(ops.add(ops.mul(ops.div(r, 8), 2 * strides[0]), ops.mul(ops.div(g, 4), 2 * strides[1])),
                   ops.mul(rr, 128))
    u0 = ops.mul(ops.rem(g, 4), 2)
    return [ops.add(base, ops.mul(ops.xor(ops.add(u0, h), rr), 16)) for h in (0, 1)]


assert RED_FLOATS_PER_COLUMN * 4 <= 64 * 2  # (in a warpgroup's P's bytes, [n, block_kv = 64] 16-bit: kv_halves)


assert all(QK_PERM_16[2 * j + 1] == QK_PERM_16[2 * j] + 1 for j in range(8))  # (pairs stay whole)
