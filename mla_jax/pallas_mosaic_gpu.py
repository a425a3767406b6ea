"""Paged MLA decode on Hopper: a Pallas Mosaic GPU (`plgpu`) kernel.

Design (one CTA = one 64-row query tile x one KV split; 2 compute warpgroups):

* Query tiles. The wgmma M dimension is 64 rows. The kernel runs 8, 16, 32 or a
  multiple of 64 heads (the wrapper pads q to that otherwise). For `H < 64` a tile
  packs `64 // H` consecutive query tokens *of one request* x H heads (row = token
  * H + head); for `H >= 64`, one token's heads fill `H // 64` tiles. Grid = (head
  tile, split, request x query tile of the request): CTA (hb, split, g) takes request
  g // q_tiles and its tokens [lt * tpt, (lt + 1) * tpt) for lt = g % q_tiles
  (q_tiles = ceil(max_query_len / tpt)); a CTA with no tokens returns. The last grid
  axis is CUDA's x, the launch order's fastest: requests first, so at H = 128 with more
  CTAs than SMs a request's second head tile runs a wave after its first
  (`MosaicConfig(heads_fastest=True)`, the heuristic's pick wherever there are several head
  tiles since session 14: head tiles first, FA3's order, a request's tiles reading each KV
  step near together). The kernel
  reads the request's (q_start, q_len, seq_len) and block table from one small
  int32 schedule array (one XLA fusion per call), TMA-loads its q rows straight from
  q [T, H, 576], and writes out [T, H, 512] / lse [T, H] straight from SMEM per
  token (split-KV: each split's fp32 partials, per token, merged by mla_jax.combine). Every row of a
  tile sees the same KV (the request's), with bottom-right causal masking per row:
  row i of a tile whose first token sits at position `first_pos` sees KV positions
  `p <= first_pos + i // Hp`; steps every row sees entirely skip the mask.
* Producer. A compute warpgroup also issues the TMAs (warpgroup 0 with the "split" schedule,
  warpgroup 1 with "flashmla"): the query tile, and per KV step of
  `block_kv` (64) tokens the pages of that step from `kv_cache.at[page]` (page ids
  read as scalars from a chunk of the block table staged in SMEM) into a
  `max_concurrent_steps`-deep ring of swizzled SMEM stages (`kv_ready[slot]`); at
  the end of step k it waits `kv_consumed[slot]` (both P @ V halves released it) and
  issues step k + stages. (`MosaicConfig(memory_warpgroup=True)`: a third, memory
  warpgroup does this instead, FA3 / attention_mgpu-style warp specialization; its
  threads cap every thread at 168 registers, and the compute warpgroups spilled.)
* Compute split (FlashMLA-style: each compute warpgroup owns a 256-wide half of
  the 512-wide latent output, so its fp32 accumulator is 64x256 = 128 registers
  per thread). Per step, warpgroup w computes the scores of its half of the KV
  step's tokens, `S_w = Q[64,576] @ K[w-th half of the step]^T` (wgmma, K = 576),
  masks them, and the two warpgroups exchange their row maxima through SMEM
  (barrier `sync_a`), so both hold the same running max. Each writes its
  probabilities `P_w` (bf16/fp16) into SMEM; after `sync_b` both compute
  `acc_w += P_0 @ V[rows of half 0, cols of w] + P_1 @ V[rows of half 1, cols of w]`
  (two wgmmas, K = 32 each). No QK^T work is duplicated. Online softmax in fp32
  with exp2 (scores pre-scaled by softmax_scale * log2(e)).
* FlashMLA schedule (`MosaicConfig(schedule="flashmla")`, the default since the H200 timed it
  1.09-1.31x faster than "split" on 4 of 5 shapes, session 3):
  warpgroup 0 computes all the scores of a step (`S = Q @ K^T`, wgmma N = 64, 128-byte
  swizzle), the online softmax and P, writes P and the rescale factor to SMEM (`p_ready`)
  and does P @ V for columns [0, 256); warpgroup 1 rescales, does P @ V for [256, 512),
  releases P (`p_free`) and issues the TMAs. One hand-off a step instead of two lock-step
  barriers, and warpgroup 1's P @ V overlaps warpgroup 0's next scores.
* P in the KV slot (`MosaicConfig(p_in_kv=True)`, opt-in; 0.4-5% slower at H = 128 on the H200, 4-5% on
  three rows in session 16):
  "flashmla" with P of a step stored in its slot's 64 rope columns (free after the step's
  scores, until the slot is released): no P buffer and no `p_free` wait.
* Transposed scores (`MosaicConfig(transposed_scores=True)`, the heuristic's pick where a tile uses at most
  16 rows, H = 16 at q_len 1, or 32 with transposed_pv, H = 16 at q_len 2):
  where a tile uses fewer than its 64 rows (H = 16 at q_len 1 uses 16), warpgroup 0 of
  "flashmla" computes S^T = K Q^T (M = the step's 64 keys, N = the rows in use) and the
  softmax down the columns, and stores P transposed; P @ V is unchanged (P's other rows are 0).
  The H200 timed it 1.04-1.16x faster on four H = 16, q_len 1 shapes (interleaved rounds, session 5),
  but 1.04-1.12x slower at q_len 2 (32 rows) and 1.35x at q_len 3 (session 9); with P @ V transposed as well
  (`transposed_pv`, below) it is the heuristic's pick at q_len 2 too (session 12).
* Transposed P @ V (`MosaicConfig(transposed_pv=True)`, with transposed scores at 16 or 32 rows; the
  heuristic's pick there since session 12, with an fp8 cache at 16 only): O^T = V^T P^T, each warpgroup a
  [256, rows in use] accumulator (4x less tensor work than [64, 256] at 16 rows), transposed back once per
  tile by two wgmmas of an identity by a bf16 hi / lo split of O^T (within ~1e-5; a row whose sum is NaN is
  zeroed before them and set NaN after, so that a non-finite q entry stays in its head).
* Rows past seq_len. The cache slots past a request's `seq_len` may hold anything
  (NaN in tests). Scores of masked positions are replaced by a finite -1e30 with
  `where` (so NaN scores never propagate), and on the (single) step of a split
  that runs past the tile's KV end, each compute warpgroup zeroes the invalid
  rows of its own V half in SMEM before its P @ V (P = 0 times V = NaN would be
  NaN). Pages past the last page of a request are never fetched: the producer
  clamps the page index to the request's last page.
* Split-KV. Each split takes a contiguous range of KV steps; with num_splits > 1 the
  kernel writes each split's fp32 partial output [S, T, H, 512] and lse [S, T, H] for the
  tile's tokens, and mla_jax.combine (one Pallas Triton kernel) merges them. With
  num_splits == 1 it writes the final output (in q's dtype) and lse. Either way the output
  goes out through a shared-memory stage that aliases q and the KV ring (a RefUnion: both
  warpgroups are past their last read of them), swizzled so that the accumulator's stores
  do not conflict on banks, one TMA per token and warpgroup half.
  The split count comes from a cost model of the H200 (heuristic_config).

* FP8 KV cache (kv_cache_dtype="fp8_e4m3", "flashmla" only). The TMAs fill a ring of fp8 steps
  (1 byte an element: half the bytes from HBM); each compute warpgroup dequantizes its own columns
  of the next step (its P @ V half; warpgroup 0 also the 64 rope columns) into one f16 step buffer
  right after its P @ V of the current one, so neither writes columns the other may still read,
  and warpgroup 0's scores wait on `deq_ready` (both halves). The wgmmas run in f16: e4m3 -> f16 is
  exact, one cvt per two values (a bf16 step's bit trick took ~270 instructions a 64 x 64 chunk);
  bf16 q enters as f16 (exact for |q| in [2^-14, 65504]) and the output leaves in q's dtype. Rows
  past kv_len are zeroed there (NaN-safe). The per-tensor k_scale scales the scores and the output.
  With transposed scores of at most 32 rows the next step converts under this step's P @ V instead
  (overlap_dequant, two f16 buffers for V's first half), warpgroup 1 converting that half while it waits
  for P (overlap_wait); MosaicConfig's docstring has the measured gains. At 16 rows (H = 16 at q_len 1, H = 8
  at q_len 2) each compute warpgroup instead runs whole steps alone on its half of the split's steps
  (`MosaicConfig(kv_halves=True)`, compute_tile_halves): its own fp8 slot, f16 V, column softmax, P and O^T,
  the rope columns' scores from registers, the two partials merged in shared memory at the end; where a split has
  enough steps P @ V's V^T comes from the fp8 slot too (`pv_registers`, no f16 copy; two slots a warpgroup). At
  32 rows (H = 16 at q_len 2, H = 32 at q_len 1) the same with pv_registers, where a split has 32 steps or more.

SMEM: Q tile 72 KiB + 2 stages x 72 KiB (the output stage aliases them) + P 8 KiB +
2 KiB of small buffers = 226 KiB, inside the 227 KiB a Hopper CTA can have (so 2 stages at most).
With fp8: Q + 2 fp8 stages x 36 KiB + one dequantized step of 72 KiB, the same 216 KiB.

The phases of a step are `jax.named_scope` regions (kv_wait, qk, p_free_wait, pv, p_ready_wait, deq_wait,
dequant): with the Mosaic GPU profiler on (plgpu.CompilerParams(profile_space=..., profile_dir=...)) each
warpgroup's time in them is traced (`python -m parity.regions` runs one call under it and reads the
traces); off, they cost nothing.

Interpret mode (`interpret=True`) runs the same kernel on CPU through
`plgpu.force_gpu_interpret_mode`; P is staged through SMEM for the P @ V wgmma,
which both the interpreter and the GPU accept.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm, nvvm, scf, vector

from mla_jax.combine import combine, combine_ref
from mla_spec import DecodeMetadata, MLAConfig

KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576
BLOCK_H = 64  # wgmma M
NUM_COMPUTE_WGS = 2
V_HALF = KV_LORA_RANK // NUM_COMPUTE_WGS  # 256 latent columns per compute warpgroup
INFO_WORDS = 32  # per-tile int32 metadata row (TMA copies must be multiples of 128 bytes)
TMA_MAX_BOX = 256  # a TMA box's elements along each dimension (cuTensorMapEncodeTiled's limit)
NUM_SMS_H200 = 132
MAX_GRID_YZ = 65535  # CUDA grid: y and z at most 65535 blocks (x: 2^31 - 1)
MASK_VALUE = -1e30  # finite: a fully masked row stays NaN-free
REDUCTION_SCRATCH_BYTES = 1024  # transposed scores: the column max / sum across the 4 warps of warpgroup 0
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
SUPPORTED_DTYPES = ("bfloat16", "float16")
BLOCK_KV = 64  # KV tokens a pipeline step: two 32-row score tiles
STAGES = 2  # the KV ring's slots: q (72 KiB) and 2 stages (144 KiB) fill the 227 KiB
BT_CHUNK = 224  # block-table entries staged in shared memory at a time (a multiple of 32)
# fp8 with plain scores: warpgroup 0's V-half chunks converted between two fences (fused into its scores)
FUSED_GROUP = 4
# MosaicConfig.overlap_dequant: the most rows of a tile in use (transposed scores) for which the two f16 copies of
# V's first half fit in shared memory beside q (32 rows: 36 KiB), the fp8 ring (72), V (3 x 32) and the rope (8)
OVERLAP_MAX_ROWS = 32
# MosaicConfig.transposed_pv: the rows in use it runs at (its transpose back: rows of 32 or 64 bytes, a swizzle each;
# the identity's K a multiple of 16)
TRANSPOSED_PV_ROWS = (16, 32)
# (kv_halves) the scratch of a warpgroup's cross-warp column reductions of [64, n] fp32: 4 warps x 32 lanes x 2 floats
# for each of the n / 8 registers a thread holds, so that all of them go in one round (one store, barrier, load,
# barrier; 256 floats took them one register at a time)
RED_FLOATS_PER_COLUMN = 4 * 32 * 2 // 8
assert RED_FLOATS_PER_COLUMN * 4 <= 64 * 2  # (in a warpgroup's P's bytes, [n, block_kv = 64] 16-bit: kv_halves)
# MosaicConfig.kv_halves: each warpgroup's block-table chunk (2 x 96 entries fit the shared memory left)
KV_HALVES_BT_CHUNK = 96
# kv_halves: each warpgroup's f16 copy of V, 8 x 64 tiles with a 128-byte swizzle
F16_TILES = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
# the fp8 ring's slots: 8 x 64 tiles (a 64-column chunk a row of a tile), 64-byte swizzle
FP8_RING_TILES = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(64))
# MosaicConfig.qk_permuted: a [64, 64] f16 array in the WGMMA_8BIT layout (a thread's register j holds columns
# 16 j' + 4 q .. + 3, q = lane % 4) taken as the WGMMA layout's (2 columns a register piece: 8 j + 2 q, + 1) without
# moving a value: the column the WGMMA layout calls c holds column QK_PERM_16[c % 16] + c - c % 16 (derived
# from jax 0.11.2's layouts, fragmented_array.py; checked in tests/test_fp8.py)
QK_PERM_16 = (0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)
QK_PERM = np.array([16 * b + QK_PERM_16[c] for b in range(HEAD_DIM // 16) for c in range(16)])  # q's 576 columns
QK_PERM_64 = QK_PERM[:64]  # a 64-column chunk's
# MosaicConfig.pv_registers: P @ V's left operand V^T [64 columns, 64 keys] of a chunk loaded from the fp8 slot by
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


# (MosaicConfig.pair_ring) the fp8 cache seen two tokens a row, [N, P / 2, 1152] (a free reshape): a slot's 32 pair
# rows in 8 x 128 tiles with a 128-byte swizzle, token 2 p + h's column c at pair row p, column 576 h + c. Each
# step's TMA then brings whole 128-byte lines (the bf16 ring's boxes and 1152-byte pitch at half the rows; the
# default fp8 ring's 64-byte box rows take half lines). The kernel's own ldmatrix addresses read a chunk's tokens
# in their order (the scores' K, V^T, the tail's zeroing), so every sum runs as the default's.
PAIR_COLS = 2 * HEAD_DIM
PAIR_TILES = (plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))


def pair_ring_fits(page_size: int) -> bool:
    """(pair_ring) whether a page is whole 8-row tiles of pair rows (a multiple of 16 tokens); elsewhere the default
    ring runs."""
    return page_size % 16 == 0


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


# (MosaicConfig.q_in_kernel) a bf16 pair (one 32-bit word) -> the f16 pair: both widened to f32 exactly (a shift, an
# and), then one cvt.rn.f16x2.f32 (a's value to the upper half, b's to the lower): round to nearest even, as XLA's
# convert; beyond 65504 inf, as the wrapper's conversion
_BF16X2_TO_F16X2_PTX = """{
.reg .b32 lo, hi;
shl.b32 lo, $1, 16;
and.b32 hi, $1, 0xFFFF0000;
cvt.rn.f16x2.f32 $0, hi, lo;
}"""
# (q_in_kernel with qk_permuted) the 8 32-bit words (column pairs) of a 16-column group of q in QK_PERM_16's order:
# word j of the permuted group is word Q_WORD_PERM[j] of q's
Q_WORD_PERM = tuple(QK_PERM_16[2 * j] // 2 for j in range(8))
assert all(QK_PERM_16[2 * j + 1] == QK_PERM_16[2 * j] + 1 for j in range(8))  # (pairs stay whole)
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


LAUNCH_ORDERS = ("requests_first", "heads_first")
TRANSPOSES = ("none", "scores", "scores_and_pv")


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Tuning of the Mosaic GPU kernel; heuristic_config picks it, and a field has no effect where its path cannot
    run (the wrapper decides which paths run for the problem: _plan)."""

    num_splits: int = 1
    """KV splits a request's keys are cut into (flash-decoding); above 1 a combine kernel merges fp32 partials."""
    launch_order: str = "requests_first"
    """The grid's fastest axis: "heads_first" launches a request's head tiles together so the second reads each KV
    step from L2 (1.06-1.11x at H = 128); "requests_first" the requests."""
    transpose: str = "none"
    """The tile's layout where it uses at most 32 of its 64 rows: "scores" computes S^T = K Q^T (4x less tensor work
    at 16 rows), "scores_and_pv" also O^T = V^T P^T (1.03-1.13x over "scores" at 16 and 32 rows)."""
    warpgroup_halves: bool = False
    """(fp8, "scores_and_pv" at 16 or 32 rows) each compute warpgroup runs whole steps on its own half of the
    split's KV steps, two step chains a CTA (1.19x at H = 16, q_len 1)."""
    v_from_ring: bool = False
    """(with warpgroup_halves, compiled) P @ V's V^T loaded from the fp8 ring into registers, no f16 copy of V,
    which frees a second ring slot a warpgroup (1.07x where a split has 32 steps or more)."""
    pv_in_flight: int = 4
    """(with v_from_ring) P @ V chunks left running as the next is issued (1 at 32 rows, where registers bind)."""
    q_in_kernel: bool = False
    """(fp8 with a bf16 q, compiled) q converted to f16 inside the kernel rather than by an XLA op before it."""
    ring_pairs: bool = False
    """(with v_from_ring, pages of a multiple of 16 tokens) the fp8 ring holds two tokens a row, so each TMA moves
    whole 128-byte lines (1.01-1.02x at 16 rows on the H100)."""

    def __post_init__(self):
        for name in ("num_splits", "pv_in_flight"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"{name} must be an int, got {name}={x!r}")
        for name in ("warpgroup_halves", "v_from_ring", "q_in_kernel", "ring_pairs"):
            x = getattr(self, name)
            if not isinstance(x, bool):
                raise ValueError(f"{name} must be a bool, got {name}={x!r}")
        if self.launch_order not in LAUNCH_ORDERS:
            raise ValueError(f"launch_order must be one of {LAUNCH_ORDERS}, got launch_order={self.launch_order!r}")
        if self.transpose not in TRANSPOSES:
            raise ValueError(f"transpose must be one of {TRANSPOSES}, got transpose={self.transpose!r}")
        if self.num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got num_splits={self.num_splits}")
        if not 1 <= self.pv_in_flight <= KV_LORA_RANK // 64:
            raise ValueError(f"pv_in_flight must be in [1, {KV_LORA_RANK // 64}] (P @ V chunks), got "
                             f"pv_in_flight={self.pv_in_flight}")
        if self.warpgroup_halves and self.transpose != "scores_and_pv":
            raise ValueError(f"warpgroup_halves=True runs where the scores and P @ V are transposed: it needs "
                             f"transpose='scores_and_pv', got transpose={self.transpose!r}")


def _tile_geometry(num_heads: int) -> tuple[int, int, int]:
    """(heads the kernel runs, heads per tile hp, tokens per tile)."""
    heads = _kernel_heads(num_heads)
    hp = min(heads, BLOCK_H)
    return heads, hp, BLOCK_H // hp


def _num_tiles_bound(num_tokens: int, num_reqs: int, tokens_per_tile: int) -> int:
    # sum_r ceil(q_len_r / tpt) <= (T + R * (tpt - 1)) / tpt, and <= T.
    return max(1, min(num_tokens, (num_tokens + num_reqs * (tokens_per_tile - 1)) // tokens_per_tile))


# The split heuristic's cost model, in microseconds, from H200 runs of the flashmla schedule (session 3):
# a 64-token step takes ~2.2 us (H128 B64 S16384: 554 us / 256 steps; H16 B128 S16384: 655 / 256),
# a CTA ~3 us more (info, q and first pages in flight, the output out), and the split combine reads
# and writes the fp32 partials (~3 TB/s) after one more launch.
STEP_US = 2.2
CTA_US = 3.0
COMBINE_LAUNCH_US = 2.0
COMBINE_BYTES_PER_US = 3e6
MAX_SPLITS = 128
# The heuristic's transposed scores: on the H200 (parity.sweep, 3 interleaved rounds, session 9) they were
# 1.12x faster than the plain ones at H = 16, q_len 1 (16 rows) on B128 S16384 and even at B8 S4096, but
# 1.04-1.12x slower at q_len 2 (32 rows) on four shapes and 1.35x slower at q_len 3 (48 rows, B64 S4096).
# With P @ V transposed too (transposed_pv, at TRANSPOSED_PV_ROWS) they win at 32 rows as well (session 12).
TRANSPOSED_MAX_ROWS = 16
# The heuristic's pv_registers: where a split has at least this many steps (measured: 64 and 256 faster, 4 slower)
PV_REGISTERS_MIN_STEPS = 32
# The heuristic's q_in_kernel (an fp8 cache): where the batch has at most this many query tokens (measured on the
# H200, session 35: 1.05x at B1 H16, 1.02x at B1 H128, 1.01x at B32; even at 128 tokens, 0.97x at B128 within noise;
# on the H100, session 42, parity.sweep 3 rounds: 1.07x at H16 B8 S4096, 19.3 -> 18.1 us, 1.03x at H128 B8 S4096,
# 42.8 -> 41.6)
Q_IN_KERNEL_MAX_TOKENS = 32


def heuristic_config(config: MLAConfig, num_tokens: int, max_blocks: int, num_reqs: int | None = None,
                     num_sms: int = NUM_SMS_H200, max_query_len: int | None = None) -> MosaicConfig:
    """Picks transposed scores where a tile uses at most 16 of its 64 rows (H = 16 at q_len 1) or 32 (H = 16 at
    q_len 2, H = 32 at q_len 1, H = 8 at q_len 4: the same tiles, not timed; with an fp8 cache 16, and 32 where
    kv_halves runs), with P @ V transposed too (transposed_pv) wherever the scores are at 16 or 32 rows, and the split
    count
    with the least modelled time: waves of CTAs (one CTA per SM: the
    Q tile and two KV stages fill its shared memory) x (the longest split's steps + a CTA's fixed
    cost), plus the combine of the fp32 partials. Splits of one 64-token step are allowed.
    With max_query_len the CTA count is the grid's (requests x query tiles x head tiles);
    without, a bound from the token and request counts."""
    heads, hp, tpt = _tile_geometry(config.num_heads)
    num_reqs = num_tokens if num_reqs is None else num_reqs
    q_tiles = None if max_query_len is None else -(-max(1, max_query_len) // tpt)  # query tiles a request
    tiles = _num_tiles_bound(num_tokens, num_reqs, tpt) if q_tiles is None else num_reqs * q_tiles
    ctas = tiles * (heads // hp)
    max_steps = max(1, -(-max_blocks * config.page_size // BLOCK_KV))

    def cost(s):
        waves = -(-ctas * s // num_sms)
        t = waves * (STEP_US * -(-max_steps // s) + CTA_US)
        if s > 1:
            t += COMBINE_LAUNCH_US + 2 * s * num_tokens * heads * (KV_LORA_RANK + 1) * 4 / COMBINE_BYTES_PER_US
        return t

    num_splits = min(range(1, min(MAX_SPLITS, max_steps) + 1), key=cost)  # ties: the fewest splits
    # Transposed scores where a tile uses at most TRANSPOSED_MAX_ROWS of its 64 rows (without max_query_len:
    # where every request has one token, num_tokens <= num_reqs).
    # And where transposed_pv runs (TRANSPOSED_PV_ROWS: 16 or 32 rows), both transposed: on the H200 (parity.sweep,
    # 3 interleaved rounds, session 12) transposed_pv was 1.03-1.05x faster than transposed scores alone at H = 16,
    # q_len 1 and 1.08-1.13x at q_len 2; at q_len 2 both transposed were 1.07x faster than the plain scores at H16
    # B128 S16384 and equal at B64 S4096. With an fp8 cache only at 16 rows (1.13-1.14x over transposed scores
    # alone): at q_len 2 the plain path (the fused conversion) was 1.06x faster at B64 S4096 and 1.01x at B128
    # S16384 than both transposed with the overlap.
    q_len = max_query_len if max_query_len is not None else 1 if num_tokens <= num_reqs else tpt
    rows = hp * min(tpt, max(1, q_len))
    # With an fp8 cache at 16 rows (transposed_pv's there) each warpgroup runs its own half of a split's steps
    # (kv_halves) where a split has at least two steps (one each): on the H200 (parity.sweep, 3 rounds, 1 s idle,
    # session 20) 1.19x faster than the one-chain path at H16 B128 S16384 and 1.20x at B32 S16384 (splits of 256 and 64
    # steps), 1.07x at B8 S4096 (4 steps a split), 1.03x slower at B1 S1024 (16 splits of one step: warpgroup 1 idle).
    # At 32 rows (with pv_registers: V's f16 copies do not fit beside q there) where a split has at least
    # PV_REGISTERS_MIN_STEPS steps: on the H200 (parity.sweep, 3 rounds, 1 s idle, session 26, each against FA3 in
    # its own run) 1.58x faster than the one-chain fused path at H16 B128 S16384 q2 (739.1 -> 467.3 us), 1.20x at
    # H32 B64 S4096 q1 (107.0 -> 89.1), 1.06x at H16 B64 S4096 q2 (107.6 -> 101.7; 32 steps a split), 1.30x slower
    # at B8 S4096 q2 (24.6 -> 31.9; 4 steps a split); at 255 registers, pv_wait 1 (444 bytes of spills) faster than
    # 2, 4 (none) and 8 (session 26 call B: 102.7 / 114.3 / 116.7 / 119.4 us at B64 S4096 q2).
    steps_per_split = -(-max_steps // num_splits)
    fp8 = config.is_fp8_kv_cache
    kv_halves = fp8 and (rows == TRANSPOSED_PV_ROWS[0] and steps_per_split >= NUM_COMPUTE_WGS
                         or rows == TRANSPOSED_PV_ROWS[1] and steps_per_split >= PV_REGISTERS_MIN_STEPS)
    # (an fp8 cache at 32 rows: transposed_pv with kv_halves only; the one-chain path runs the plain scores there)
    transposed_pv = rows in TRANSPOSED_PV_ROWS and (not fp8 or rows == TRANSPOSED_PV_ROWS[0] or kv_halves)
    # A request's head tiles launched together wherever there are several (H > 64) and the requests x query tiles
    # fit CUDA's z axis (without max_query_len, tpt query tiles a request at most): on the H200 (parity.sweep, 3
    # rounds, 2 s idle before each timing, session 14) 1.06-1.11x faster at H = 128 on five shapes, one wave, two and
    # split-KV alike.
    heads_fastest = heads // hp > 1 and num_reqs * (tpt if q_tiles is None else q_tiles) <= MAX_GRID_YZ
    # with qk_registers (session 21, parity.sweep, 3 rounds, 1 s idle: 1.20x faster than kv_halves alone at H16
    # B128 S16384, 513.1 -> 426.7 us, 1.17x at B32 S16384, 140.9 -> 120.3) and sums_at_end (session 22, the same
    # sweep: 1.05x faster at H16 B128 S16384, 432.2 -> 409.8 us, 1.06x at B32 S16384, 120.3 -> 113.1, 1.02x at B8
    # S4096, 19.1 -> 18.7) and qk_permuted (session 23, the same sweep: 1.06x faster at H16 B128 S16384, 400.9 -> 376.7
    # us, 1.05x at B32 S16384, 113.3 -> 108.3, 1.01x at B8 S4096, 18.6 -> 18.4)
    # With an fp8 cache warpgroup 0's V half converted 4 chunks between two fences (fused_group; it matters only where
    # the fused conversion runs: not under overlap_dequant): on the H200 (parity.sweep, 3 rounds, 1 s idle, session 24)
    # 1.02x faster than 2 at H128 B32 S4096 q1 (115.7 -> 113.1 us), 1.03x at B64 S16384 (756.4 -> 736.7), 1.015x at
    # B32 S4096 q2 (198.0 -> 195.0), 1.02x at B8 S4096 (40.5 -> 39.8), and at H = 16, q_len 2 (32 rows) 1.025x at
    # B128 S16384 (749.3 -> 731.2), 1.005x at B64 S4096 (107.5 -> 107.0). (Session 10 had 2 ahead, before the later
    # changes of the fused path.)
    # With kv_halves, P @ V's left operand from the fp8 slot (pv_registers, 4 chunks in flight) where a split has at
    # least PV_REGISTERS_MIN_STEPS steps: on the H200 (parity.sweep, 3 rounds, 1 s idle, session 25) 1.07x faster at
    # H16 B128 S16384 (387.7 -> 362.5 us), 1.01x at B32 S16384 (107.1 -> 106.1; 64 steps a split), 1.12x slower at
    # B8 S4096 (18.2 -> 20.3; 4 steps a split)
    pv_registers = kv_halves and steps_per_split >= PV_REGISTERS_MIN_STEPS  # (at 32 rows: always)
    pv_wait = 1 if pv_registers and rows == TRANSPOSED_PV_ROWS[1] else 4
    # With pv_registers, the masked step's slot tail zeroed in shared memory (zero_tail): on the H200 (parity.sweep,
    # 3 rounds, 1 s idle, session 27) 1.11x faster at H32 B64 S4095 q1 (103.3 -> 93.2 us), 1.10x at H16 B64 S4096 q2
    # (102.0 -> 92.6), 1.03x at H32 B64 S4096 q1 (89.9 -> 86.9; no masked step), 1.00x at H16 B128 S16383 (366.1 ->
    # 364.8); without pv_registers 1.02x slower at H16 B8 S4095 (18.9 -> 19.3).
    # With pv_registers, each chunk's loads a chunk ahead of its conversion (load_ahead): on the H200 (parity.sweep,
    # 3 rounds, 1 s idle, session 30) 1.13x faster at H16 B128 S16384 (386.0 -> 341.1 us), 1.10x at B32 S16384
    # (106.2 -> 96.9), 1.10x at H16 B64 S4096 q2 (84.8 -> 76.9; 32 rows)
    # With pv_registers at 16 rows, the cache two tokens a row in the ring (pair_ring; pages of a multiple of 16
    # rows): on the H100 (parity.sweep, 3 rounds, 1 s idle, session 42, FA3 in the same run) 1.02x faster at H16 B128
    # S16384 (439.9 -> 430.0 us; rounds 439.0-440.3 against 428.8-430.5), 1.01x at B32 S16384 (120.9 -> 119.9), as
    # session 36's (1.04x, 1.02x); at 32 rows 0.93x (H16 B64 S4096 q2, 86.0 -> 92.8: more spills), so not there.
    # Not yet timed on the H200.
    pair_ring = pv_registers and rows == TRANSPOSED_PV_ROWS[0] and pair_ring_fits(config.page_size)
    transposed_scores = rows <= TRANSPOSED_MAX_ROWS or transposed_pv
    return MosaicConfig(num_splits=num_splits,
                        launch_order="heads_first" if heads_fastest else "requests_first",
                        transpose="scores_and_pv" if transposed_pv else "scores" if transposed_scores else "none",
                        warpgroup_halves=kv_halves, v_from_ring=pv_registers, pv_in_flight=pv_wait,
                        ring_pairs=pair_ring, q_in_kernel=fp8 and num_tokens <= Q_IN_KERNEL_MAX_TOKENS)


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


def supported_page_size(page_size: int, block_kv: int = 64) -> bool:
    if page_size >= block_kv:
        return page_size % block_kv == 0
    return page_size % 8 == 0 and block_kv % page_size == 0


def unsupported_reason(config: MLAConfig, device=None) -> str | None:
    """Why this kernel cannot run `config` (on `device`, when given); None when it can."""
    if config.kv_lora_rank != KV_LORA_RANK or config.qk_rope_head_dim != QK_ROPE_HEAD_DIM:
        return (
            f"needs kv_lora_rank={KV_LORA_RANK} and qk_rope_head_dim={QK_ROPE_HEAD_DIM}, got "
            f"kv_lora_rank={config.kv_lora_rank}, qk_rope_head_dim={config.qk_rope_head_dim}"
        )
    if config.dtype not in SUPPORTED_DTYPES:
        return f"dtype must be one of {SUPPORTED_DTYPES}, got dtype={config.dtype!r}"
    if not supported_page_size(config.page_size):
        return (
            f"page_size must be 8, 16, 32 or a multiple of 64 (TMA of whole 8-row tiles), "
            f"got page_size={config.page_size}"
        )
    if device is not None:
        platform = getattr(device, "platform", None)
        if platform != "gpu":
            return f"Mosaic GPU needs a GPU device, got platform={platform!r}"
        cc = str(getattr(device, "compute_capability", ""))
        if not cc.startswith("9."):
            return f"needs a Hopper GPU (compute capability 9.x), got compute_capability={cc!r}"
    return None


# --------------------------------------------------------------------------------------
# The kernel.


def _build_kernel(*, dtype, page_size: int, num_tokens: int, heads: int, hp: int, num_h_tiles: int, q_tiles: int,
                  num_reqs: int, num_splits: int, bt_chunk: int, scale_log2: float, score_rows: int = 0,
                  fp8: bool = False, transposed_pv: bool = False, heads_fastest: bool = False,
                  kv_halves: bool = False, pv_registers: bool = False, pv_wait: int = 4, q_bits: bool = False,
                  pair_ring: bool = False, out_dtype=None, interpret: bool = False):
    """The kernel for `heads` query heads (8, 16, 32 or a multiple of 64: the wrapper pads others).

    Grid (head tile, split, request x query tile), the last axis the fastest (heads_fastest: reversed, the head
    tile the fastest): CTA (hb, split, g) takes request g // q_tiles,
    its query tokens [lt * tpt, lt * tpt + tpt) for lt = g % q_tiles (none: the CTA returns), heads
    [hb * 64, hb * 64 + 64) (or all `heads` x tpt tokens when heads < 64), and its split of the KV.
    score_rows > 0 (a multiple of hp below 64): the tile's rows in use, whose scores
    warpgroup 0 computes transposed (MosaicConfig.transposed_scores); q holds only those rows.
    kv_halves: MosaicConfig's (an fp8 cache, transposed_pv at 16 or 32 rows: a ring slot a warpgroup;
    compute_tile_halves), with the scores' left operands from registers, the sums reduced once at the end and
    (compiled) q's columns permuted by QK_PERM, the caller's.
    pv_registers: MosaicConfig's (with kv_halves, compiled: P @ V's left operand from the fp8 slot, a ring of two
    slots a warpgroup, each chunk's loads a chunk ahead, the masked step's slot tail zeroed in shared memory; the
    output's columns permuted by PV_PERM, the caller undoes it). pv_wait: MosaicConfig's.
    pair_ring: MosaicConfig's (with pv_registers, compiled; pages of a multiple of 16 rows): kv_cache
    comes as [N, P / 2, 1152].
    q_bits: (MosaicConfig.q_in_kernel: an fp8 cache, compiled) q [T, heads, 576] is bfloat16, unpermuted: its TMA
    writes a bfloat16 view of q's tile, which the warpgroups reading q convert to f16 in place (kv_halves: in
    QK_PERM's column order) before their first wgmma.
    fp8: the cache is float8_e4m3fn; the TMAs fill a ring of fp8 steps, and the compute warpgroups convert them to
    `dtype` (plain scores: warpgroup 0 fused into its scores, FUSED_GROUP chunks between two fences, warpgroup 1
    its half after its P @ V; transposed scores of at most OVERLAP_MAX_ROWS rows: the next step under this step's
    P @ V). The per-tensor k_scale (info word 3, float32 bits) scales the scores and the
    output. `dtype` (q, the wgmma operands) is then float16: e4m3 -> f16 is one exact conversion per two
    values. out_dtype: the final output's dtype (default `dtype`).
    """
    if fp8 and dtype != jnp.float16:
        raise ValueError(f"an fp8 cache runs the wgmmas in float16, got dtype={jnp.dtype(dtype).name}")
    out_dtype = dtype if out_dtype is None else out_dtype
    block_kv, stages = BLOCK_KV, STAGES
    tpt = BLOCK_H // hp  # query tokens per tile
    if page_size >= block_kv:
        pages_per_step, steps_per_page = 1, page_size // block_kv
    else:
        pages_per_step, steps_per_page = block_kv // page_size, 1
    if bt_chunk % pages_per_step:
        raise ValueError(f"bt_chunk={bt_chunk} must be a multiple of pages_per_step={pages_per_step}")
    split_out = num_splits > 1
    if score_rows and (score_rows % hp or not 0 < score_rows < BLOCK_H):
        raise ValueError(f"score_rows={score_rows} needs a multiple of {hp=} below {BLOCK_H}")
    if transposed_pv and score_rows not in TRANSPOSED_PV_ROWS:
        raise ValueError(f"transposed_pv needs transposed scores of {TRANSPOSED_PV_ROWS} rows, got {score_rows=}")
    if kv_halves and not (fp8 and transposed_pv and score_rows in TRANSPOSED_PV_ROWS):
        raise ValueError(f"kv_halves needs an fp8 cache and transposed_pv at {TRANSPOSED_PV_ROWS} rows, "
                         f"got {fp8=}, {transposed_pv=}, {score_rows=}")
    if kv_halves and score_rows > TRANSPOSED_PV_ROWS[0] and not (pv_registers or interpret):
        raise ValueError(f"kv_halves at {score_rows} rows fits shared memory only without V's f16 copies: it needs "
                         f"pv_registers=True (or interpret mode), got {pv_registers=}")
    if pv_registers and not (kv_halves and not interpret):
        raise ValueError(f"pv_registers loads P @ V's left operand beside kv_halves's permuted chunks (compiled): it "
                         f"needs kv_halves=True and interpret=False, got {kv_halves=}, {interpret=}")
    if pair_ring and not (pv_registers and pair_ring_fits(page_size)):
        raise ValueError(f"pair_ring reads the scores' K chunks and V^T by pv_registers's ldmatrix (compiled) from "
                         f"slots of pair rows, a page a multiple of 8 of them: it needs pv_registers=True and a "
                         f"page_size multiple of 16, got {pv_registers=}, {page_size=}")
    if q_bits and not (fp8 and not interpret):
        raise ValueError(f"q_bits (q_in_kernel) converts a bf16 q beside an fp8 cache (compiled), got {fp8=}, "
                         f"{interpret=}")
    # kv_halves: the scores' left operands from registers, viewed permuted (compiled: the interpreter has no rule
    # for inline_mgpu nor for a wgmma's left operand in registers); pv_registers: the loads a chunk ahead
    qk_permuted = kv_halves and not interpret
    load_ahead = zero_tail = pv_registers
    # fp8 without kv_halves: the next step converted under this step's P @ V (transposed scores of at most
    # OVERLAP_MAX_ROWS rows), else warpgroup 0's columns converted inside the scores (fused)
    overlap_dequant = fp8 and not kv_halves and 0 < score_rows <= OVERLAP_MAX_ROWS
    fused_dequant = fp8 and not kv_halves and not overlap_dequant
    q_rows = score_rows or BLOCK_H  # rows of q in SMEM
    q_toks = q_rows // hp  # tokens of q loaded per tile
    producer_wg = 1  # (FlashMLA: warpgroup 1 has the lighter step)

    def body(q_ref, kv_ref, sched_ref, out_ref, lse_ref,
             q_kv_or_stage, p_smem, x_smem, i_smem,
             q_bar, info_bar, bt_bar, kv_ready, kv_consumed, sync_a, sync_b, *extra_barriers):
        deq_smem = deq_v = deq_rope = t_smem = e_smem = None
        q_bf16 = None
        if q_bits:  # (the union's last member: q's tile seen as bfloat16, its TMA's destination)
            *q_kv_or_stage, (q_bf16,) = q_kv_or_stage
        if transposed_pv and not kv_halves:  # the stage, then O^T's two bf16 parts and the identity that transposes
            # them back
            q_group, (stage, t_smem, e_smem) = q_kv_or_stage
            q_kv_or_stage = q_group, stage
        kv_v = red_smem = None
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
        split = lax.axis_index("split")
        g = lax.axis_index("tile")
        wg = lax.axis_index("wg")
        req = lax.div(g, jnp.int32(q_tiles))
        lt = lax.rem(g, jnp.int32(q_tiles))
        info_smem = i_smem.at[pl.ds(0, INFO_WORDS)]
        sums_row = 1  # the row of x_smem with warpgroup 0's row sums

        def tile_info():
            """(first token, tokens in the tile, first position, KV length seen, last page, step range)."""
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
            per_split = lax.div(n_steps + (num_splits - 1), jnp.int32(num_splits))
            begin = jnp.minimum(split * per_split, n_steps)
            end = jnp.minimum(begin + per_split, n_steps)
            return first_tok, ntok, first_pos, kv_len, last_page, begin, end

        def kv_tile(slot):
            """The KV step the wgmmas read: the ring's slot, or with fp8 the dequantized step. Its index
            (always 0) is read from info word 4 at each use: with a constant address the compiler hoists
            the descriptors of the step's wgmmas (64-bit each, 2 per wgmma) out of the KV loop, and they
            spill (ptxas: ~1 KiB a thread; session 6 in parity/NOTES_pallas_mosaic_gpu.md)."""
            return deq_smem.at[info_smem[4]] if fp8 else kv_smem.at[slot]

        def deq_chunk(k, c: int):
            """(overlap_dequant) chunk c (static; columns [64 c, 64 c + 64)) of step k's f16 copy: V's first half
            in deq_v[k % 2], its second half in deq_v[2], the rope in deq_rope (dynamic indices, as kv_tile's)."""
            if c == KV_LORA_RANK // 64:
                return deq_rope.at[info_smem[4]]
            if c < V_HALF // 64:
                return deq_v.at[lax.rem(k, jnp.int32(2)), :, pl.ds(c * 64, 64)]
            return deq_v.at[info_smem[4] + 2, :, pl.ds((c - V_HALF // 64) * 64, 64)]

        def deq_half(k, half: int):
            """(overlap_dequant) V half `half` of step k's f16 copy, [block_kv, 256]."""
            return deq_v.at[lax.rem(k, jnp.int32(2)) if half == 0 else info_smem[4] + 2]

        def convert_step(k, begin, kv_len, convert_chunks, wait: bool = True, fence: bool = False):
            """Converts columns of fp8 step k (its ring slot; wait: once its TMA is done, a warpgroup waiting once
            for each phase of a barrier): convert_chunks(slot, keep), keep the rows kept (rows_below) in the step
            that runs past kv_len (their cache slots may hold NaN), else None; fence: then commit_smem. -> the slot."""
            slot = lax.rem(k - begin, jnp.int32(stages))
            if wait:
                with jax.named_scope("deq_wait"):
                    plgpu.barrier_wait(kv_ready.at[slot])
            valid = kv_len - k * block_kv
            with jax.named_scope("dequant"):
                pl.when(valid < block_kv)(lambda: convert_chunks(slot, rows_below(valid)))
                pl.when(valid >= block_kv)(lambda: convert_chunks(slot, None))
                if fence:
                    plgpu.commit_smem()
            return slot

        def overlap_convert(k, begin, kv_len, chunks, wait: bool = True):
            """(overlap_dequant) chunks (static) of fp8 step k into their f16 buffers (deq_chunk). No fence."""
            def convert_chunks(slot, keep):
                for c in chunks:
                    convert_chunk(slot, c, keep, deq_chunk(k, c))

            convert_step(k, begin, kv_len, convert_chunks, wait=wait)

        def k_scale():
            """The fp8 cache's per-tensor scale, float32 bits in info word 3 (after tile_info's wait)."""
            return lax.bitcast_convert_type(info_smem[3], jnp.float32)

        # the registers' layout of an fp8 chunk: WGMMA_8BIT (4 fp8 values a thread and load)
        deq_layout = plgpu.Layout.WGMMA_8BIT

        def rows_below(valid, layout=None):
            """[block_kv, 64] in `layout` (default deq_layout): row < valid (the rows of a step kept by its
            dequantization)."""
            return plgpu.broadcasted_iota(jnp.int32, (block_kv, 64), 0, layout=layout or deq_layout) < valid

        def convert_chunk(slot, c, keep=None, dst=None):
            """Chunk c (columns [64 c, 64 c + 64)) of the fp8 step in ring slot `slot` -> the dequantized step
            (or `dst`, a [64, 64] ref); rows where `keep` (rows_below) is False become 0 (their cache slots may
            hold NaN)."""
            # e4m3 -> f16, exact: one cvt.rn.f16x2.e4m3x2 per two values
            cols = pl.ds(c * 64 if isinstance(c, int) else pl.multiple_of(c * 64, 64), 64)
            x = plgpu.load(kv_smem.at[slot, :, cols], layout=deq_layout)
            x = x.astype(dtype)
            if keep is not None:
                x = jnp.where(keep, x, jnp.zeros_like(x))
            (deq_smem.at[0, :, cols] if dst is None else dst)[...] = x

        def dequantize(w: int, k, begin, kv_len):
            """fp8 step k (ring slot) -> the dequantized step, this warpgroup's columns: those of its P @ V
            half (warpgroup 0 also the 64 rope columns, which only its scores read), so that neither
            warpgroup writes columns the other may still be reading. In the step that runs past kv_len,
            rows past it become 0 (their cache slots may hold NaN; P = 0 times NaN is NaN). Then releases
            the slot to the TMAs."""
            slot = convert_step(k, begin, kv_len, functools.partial(convert_columns, w), fence=True)
            plgpu.barrier_arrive(deq_ready)
            plgpu.barrier_arrive(kv_consumed.at[slot])

        def convert_columns(w: int, slot, keep):
            """This warpgroup's columns of the fp8 step in `slot` -> the dequantized step (rows where `keep` is False
            0): its P @ V half, then (warpgroup 0) the rope chunk; a loop over the chunks (not unrolled)."""
            num_chunks = V_HALF // 64 + (1 if w == 0 else 0)  # 64-column chunks (warpgroup 0: + rope)

            @pl.loop(0, num_chunks)
            def _(i):
                # chunk i of this warpgroup's columns: V half w, then (warpgroup 0) the rope chunk
                rope_i = (i == V_HALF // 64).astype(jnp.int32)
                convert_chunk(slot, w * (V_HALF // 64) + i + rope_i * (KV_LORA_RANK // 64 - V_HALF // 64), keep)

        def fused_chunks(w: int) -> list[int]:
            """The 64-column chunks of the head dim warpgroup w converts (fused_dequant):
            warpgroup 0 the rope chunk first (its scores' wgmma can start at once), then its P @ V half; 1 its half."""
            v = [w * (V_HALF // 64) + i for i in range(V_HALF // 64)]
            return [KV_LORA_RANK // 64] + v if w == 0 else v

        accumulate = functools.partial(accumulate_wgmma, interpret=interpret)

        def zero_v_tail(slot, kv_start, kv_len, col0: int, ncols: int):
            """If the step in `slot` (its first position kv_start) runs past kv_len, zeroes its rows from
            kv_len on, columns [col0, col0 + ncols) (64 at a time): their cache slots may hold NaN, and
            P = 0 times NaN is NaN."""
            @pl.when(kv_start + block_kv > kv_len)
            def _zero_tail():
                n_valid = kv_len - kv_start
                rows = plgpu.broadcasted_iota(jnp.int32, (block_kv, 64), 0, layout=plgpu.Layout.WGMMA)
                for c in range(ncols // 64):
                    ref = kv_smem.at[slot, :, pl.ds(col0 + c * 64, 64)]
                    ref[...] = jnp.where(rows < n_valid, ref[...], jnp.zeros((), dtype))

        def mask_scores(s, first_key, first_pos, kv_len, scale, row_ax: int = 0, key_ax: int = 1):
            """Scores s * scale, and MASK_VALUE where a row may not see the key: row i holds token i // hp
            of the tile, at position first_pos + i // hp, and key j (along key_ax) is at first_key + j;
            kv_pos <= first_pos + i // hp  <=>  (kv_pos - first_pos) * hp <= i, and kv_pos < kv_len."""
            row = plgpu.broadcasted_iota(jnp.int32, s.shape, row_ax, layout=plgpu.Layout.WGMMA)
            kv_pos = plgpu.broadcasted_iota(jnp.int32, s.shape, key_ax, layout=plgpu.Layout.WGMMA) + first_key
            visible = ((kv_pos - first_pos) * hp <= row) & (kv_pos < kv_len)
            return jnp.where(visible, s * scale, MASK_VALUE)

        # ---------------------------------------------------------------- the producer
        def load_info():
            """The request's info and the first chunk of its block table, in one TMA."""
            plgpu.copy_gmem_to_smem(sched_ref.at[req, pl.ds(0, INFO_WORDS + bt_chunk)],
                                    i_smem.at[pl.ds(0, INFO_WORDS + bt_chunk)], info_bar)

        def load_q(first_tok):
            """The query tile, straight from q [T, H, 576]."""
            q_dst = q_bf16 if q_bits else q_smem  # (q_bits: the bf16 view of the same bytes)
            if tpt == 1:
                plgpu.copy_gmem_to_smem(q_ref.at[first_tok, pl.ds(hb * BLOCK_H, BLOCK_H)], q_dst, q_bar)
            else:
                for j in range(q_toks):  # rows of tokens past the tile's last repeat a valid token: never written
                    tok = jnp.minimum(first_tok + j, num_tokens - 1)
                    plgpu.copy_gmem_to_smem(q_ref.at[tok], q_dst.at[pl.ds(j * hp, hp)], q_bar)

        def convert_q(first: int, count: int):
            """(q_bits) Items [first, first + count) of q's tile (a row's 16 columns each) from bf16 to f16 in place by
            this warpgroup (_convert_q_in_place), then fenced for the wgmmas (commit_smem: and a warpgroup barrier)."""
            @plgpu.inline_mgpu(arg_types=(plgpu.RefType(transforms),))
            def conv(ctx, r):
                del ctx
                _convert_q_in_place(r, first, count, permute=qk_permuted)

            conv(q_smem)
            plgpu.commit_smem()

        def first_page(k):
            return lax.div(k, jnp.int32(steps_per_page)) if pages_per_step == 1 else k * pages_per_step

        def step_rows(k, page):
            """The rows of KV step k in `page`: the whole page unless a page holds several steps (pair_ring: its
            pair rows, half as many)."""
            if steps_per_page == 1:
                return kv_ref.at[page]
            rows = block_kv // 2 if pair_ring else block_kv
            off = lax.rem(k, jnp.int32(steps_per_page)) * rows
            return kv_ref.at[page, pl.ds(off, rows)]

        def issue_step(i, begin, last_page):
            """TMA of KV step begin + i into slot i % stages (the slot is free), signalling
            kv_ready[slot]; stages the block-table chunk it needs when it differs from the one
            in SMEM: chunk 0 came with the info, then the previous step's (steps go in order)."""
            k = begin + i
            slot = lax.rem(i, jnp.int32(stages))
            lp0 = first_page(k)
            chunk = lax.div(lp0, jnp.int32(bt_chunk))
            prev_chunk = jnp.where(i == 0, 0, lax.div(first_page(k - 1), jnp.int32(bt_chunk)))

            @pl.when(chunk != prev_chunk)
            def _():
                src = sched_ref.at[req, pl.ds(INFO_WORDS + chunk * bt_chunk, bt_chunk)]
                plgpu.copy_gmem_to_smem(src, i_smem.at[pl.ds(INFO_WORDS, bt_chunk)], bt_bar)
                plgpu.barrier_wait(bt_bar)

            def page_at(lp):
                """Page id of the request's logical page lp (in the staged chunk)."""
                return i_smem[INFO_WORDS + lp - chunk * bt_chunk]

            if pages_per_step == 1:
                plgpu.copy_gmem_to_smem(step_rows(k, page_at(lp0)), kv_smem.at[slot], kv_ready.at[slot])
            else:
                for j in range(pages_per_step):
                    # Pages past the request's last one are never dereferenced (their
                    # rows are past kv_len): the last page stands in for them.
                    page = page_at(jnp.minimum(lp0 + j, last_page))
                    plgpu.copy_gmem_to_smem(step_rows(k, page), kv_smem.at[slot, pl.ds(j * page_size, page_size)],
                                            kv_ready.at[slot])

        def drain(n):
            """Observe the last releases of every slot, so that each barrier phase is awaited
            by its consumer (the interpreter checks this)."""

            @pl.loop(jnp.maximum(n - stages, 0), n)
            def _drain(i):
                plgpu.barrier_wait(kv_consumed.at[lax.rem(i, jnp.int32(stages))])

        # ---------------------------------------------------------------- compute warpgroups
        def compute_wg(w: int):  # w is static: all SMEM slices below are static
            if w == producer_wg:
                load_info()
            first_tok, ntok, first_pos, kv_len, last_page, begin, end = tile_info()

            @pl.when(ntok > 0)
            def _():
                producer = w == producer_wg
                n = end - begin
                if producer:
                    # This compute warpgroup (1) is also the producer: the
                    # query tile and the first `stages` steps now, then step
                    # k + stages once the P @ V warpgroups released step k's slot (kv_consumed).
                    load_q(first_tok)

                    @pl.loop(0, jnp.minimum(n, stages))
                    def _prologue(i):
                        issue_step(i, begin, last_page)

                def refill(k):
                    """Step k + stages into step k's slot, once released (kv_consumed)."""
                    i = k - begin + stages

                    @pl.when(i < n)
                    def _():
                        plgpu.barrier_wait(kv_consumed.at[lax.rem(k - begin, jnp.int32(stages))])
                        issue_step(i, begin, last_page)

                compute_tile_flashmla(w, first_tok, ntok, first_pos, kv_len, begin, end, refill if producer else None)
                if producer:
                    drain(n)

        def compute_tile_flashmla(w, first_tok, ntok, first_pos, kv_len, begin, end, refill):
            """FlashMLA's split of a step ("flashmla").

            Warpgroup 0 computes all the scores S = Q K^T of the 64-token step (wgmma N = 64), the online
            softmax and P, and hands P (SMEM) and the rescale factor alpha (x_smem[0]) over (`p_ready`).
            Each warpgroup then rescales its accumulator and does P @ V for its 256 output columns with P
            from SMEM: warpgroup 0 columns [0, 256) after the hand-off, warpgroup 1 [256, 512), which then
            releases P (`p_free`) and the KV slot and issues the TMAs, so its P @ V of step k runs while
            warpgroup 0 computes the scores of step k + 1. Warpgroup 0 keeps the row sums and hands them
            over after the last step (x_smem[1]), once warpgroup 1 released it: from then on no warpgroup
            reads q or the KV ring."""
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
                v = kv_tile(slot).at[:, v_cols]
                return accumulate(acc, lambda acc_ref: pv_wgmma(acc_ref, v))

            # (overlap_dequant) the chunks of the next step each warpgroup converts: warpgroup 1 V's first half
            # while it waits for P, warpgroup 0 the rope under its own P @ V of this step, then V's second half (two
            # chunks each) once warpgroup 1's P @ V is done
            ov_early = [KV_LORA_RANK // 64] if w == 0 else [0, 1, 2, 3]
            ov_late = [4, 5] if w == 0 else [6, 7]

            def overlap_release(k, chunks, wait: bool):
                """(overlap_dequant) chunks of step k converted, fenced, this warpgroup's part of step k's copy
                done (`deq_ready`) and its ring slot released (then refilled, by the producer)."""
                overlap_convert(k, begin, kv_len, chunks, wait=wait)
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
                    pv_wgmma(acc_ref, deq_half(k, half))
                    if chunks:
                        pl.when(k + 1 < end)(lambda: overlap_convert(k + 1, begin, kv_len, chunks))

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
                pl.when(end > begin)(lambda: dequantize(w, begin, begin, kv_len))
            scale = scale_log2 * k_scale() if fp8 else scale_log2  # scores -> log2 units

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
                    convert_q(0, q_rows * Q_GROUPS)
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
                        kv_c, q_c = None if overlap_dequant else kv_tile(slot), q_smem
                        if c is not None:
                            q_c = q_c.at[:, pl.ds(c * 64, 64)]
                            kv_c = deq_chunk(k, c) if overlap_dequant else kv_c.at[:, pl.ds(c * 64, 64)]
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
                            keep = rows_below(kv_len - kv_start) if masked else None
                            chunks = fused_chunks(0)  # the rope chunk alone, then the V half FUSED_GROUP at a time
                            groups = [chunks[:1]] + [chunks[i:i + FUSED_GROUP]
                                                     for i in range(1, len(chunks), FUSED_GROUP)]
                            for group in groups:
                                for c in group:
                                    convert_chunk(slot, c, keep)
                                plgpu.commit_smem()  # visible to the wgmmas (async proxy)
                                for c in group:
                                    qk_chunk(s_ref, c)
                        plgpu.barrier_arrive(kv_consumed.at[slot])  # this warpgroup is done with the fp8 step
                        plgpu.barrier_arrive(deq_ready)
                        with jax.named_scope("kv_wait"):
                            plgpu.barrier_wait(deq_ready)
                        for c in fused_chunks(1):
                            qk_chunk(s_ref, c)
                        return s_ref[...]

                    shape = (block_kv, n) if tr else (BLOCK_H, block_kv)
                    with jax.named_scope("qk"):
                        s = pl.run_scoped(qk, plgpu.ACC(shape, jnp.float32))
                    if masked:
                        s = mask_scores(s, kv_start, first_pos, kv_len, scale, row_ax, key_ax)
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
                        zero_v_tail(slot, kv_start, kv_len, 0, KV_LORA_RANK)

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
                finish(0, acc, l_rows, lse, first_tok, ntok)
            else:
                half = 1

                def step(k, acc):
                    slot = lax.rem(k - begin, jnp.int32(stages))
                    if overlap_dequant:
                        # step k's copy is whole: warpgroup 0 is past its P @ V of step k - 1, so V's first half of
                        # step k + 1 (that P @ V's buffer) converts while P of step k is computed
                        with jax.named_scope("kv_wait"):
                            plgpu.barrier_wait(deq_ready)
                        pl.when(k + 1 < end)(lambda: overlap_convert(k + 1, begin, kv_len, ov_early))
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
                        pl.when(k + 1 < end)(lambda: dequantize(1, k + 1, begin, kv_len))
                    return acc

                acc = lax.fori_loop(begin, end, step, zeros_acc())
                plgpu.barrier_wait(sync_a)
                finish(half, acc, load_vec(sums_row), None, first_tok, ntok)

        def transpose_out(half: int, o_t, l_tot):
            """(transposed_pv) o_t [256, n] fp32 (WGMMA layout) -> its transpose padded to [64, 256] (rows past n 0):
            o_t as two bf16 parts (hi, and lo = the rest: ~16 bits), each multiplied by an identity [64, n] (their
            transposed view the wgmma's right operand; Mosaic GPU stores no WGMMA-layout array transposed).
            A row whose sum l_tot [n] is NaN (a non-finite q entry of that head: its scores, P and output NaN) is
            zeroed before the identity (0 x NaN would spread it to every row) and set to NaN after it, from the
            row sums in x_smem: the other rows stay right, as without transposed_pv."""
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

        def finish(half, acc, l_tot, lse, first_tok, ntok):
            """Writes the output columns [256 half, 256 half + 256) normalized by l_tot (half None: none)
            and the lse (None: not this warpgroup) for the tile's tokens: the final out / lse, or with
            split-KV this split's fp32 partials. Every warpgroup is past its last read of q and of the
            KV ring (the stage aliases them)."""
            if half is not None:
                inv = 1.0 / jnp.maximum(l_tot, 1e-30)
                if fp8:  # V was read unscaled
                    inv = inv * k_scale()
                if transposed_pv:  # O^T [256, rows in use] -> O [64, 256]
                    out = transpose_out(half, acc * lax.broadcast_in_dim(inv, acc.shape, [1]), l_tot)
                else:
                    out = acc * lax.broadcast_in_dim(inv, acc.shape, [0])
                stage[half] = out.astype(stage_dtype)
            if lse is not None:
                if lse.shape[0] == BLOCK_H:
                    x_smem[0] = lse
                else:  # transposed scores: the rows in use
                    x_smem.at[0, pl.ds(0, lse.shape[0])][...] = lse
            plgpu.commit_smem()
            o_dst = out_ref.at[split] if split_out else out_ref
            l_dst = lse_ref.at[split] if split_out else lse_ref
            v_cols = pl.ds((half or 0) * V_HALF, V_HALF)
            if tpt == 1:
                if half is not None:
                    plgpu.copy_smem_to_gmem(stage.at[half], o_dst.at[first_tok, pl.ds(hb * BLOCK_H, BLOCK_H), v_cols])
                if lse is not None:
                    plgpu.copy_smem_to_gmem(x_smem.at[0], l_dst.at[first_tok, pl.ds(hb * BLOCK_H, BLOCK_H)])
            else:
                for j in range(tpt):  # the tile's tokens, straight into out [T, H, 512] and lse [T, H]

                    @pl.when(j < ntok)
                    def _():
                        if half is not None:
                            plgpu.copy_smem_to_gmem(stage.at[half, pl.ds(j * hp, hp)],
                                                    o_dst.at[first_tok + j, :, v_cols])
                        if lse is not None:
                            plgpu.copy_smem_to_gmem(x_smem.at[0, pl.ds(j * hp, hp)], l_dst.at[first_tok + j])
            plgpu.wait_smem_to_gmem(0)

        def store_tiled(ref, x, layout, transforms, transpose: bool = False):
            """ref[...] = x (transpose: ref.T[...] = x; ref 2-D, tiled and swizzled by `transforms`) without Pallas's
            swap, whose lowering first loads the old value (for the WGMMA layout an ldmatrix that stays in the
            kernel, its result unused: 8 KiB of shared-memory reads a 64 x 64 f16 chunk) between two warpgroup
            barriers."""
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

        # ---------------------------------------------------------------- kv_halves
        def col_reduce(x, op: str, w: int):
            """(kv_halves) x [64, n] fp32 (WGMMA layout) reduced down its columns ("max" or "add") -> [n] (the column
            layout), across the warpgroup's 4 warps through warpgroup w's own scratch red_smem[w]: Pallas's reductions
            use one scratch (reduction_scratch_bytes) for every warpgroup, which two running at once would share."""
            if interpret:  # (the interpreter has no rule for inline Mosaic GPU; its reductions need no scratch)
                return x.max(axis=0) if op == "max" else x.sum(axis=0)

            @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()),
                               return_type=plgpu.ShapeDtypeStruct((x.shape[1],), jnp.float32,
                                                                  layout=plgpu.Layout.WGMMA.reduce(0)))
            def reduce(ctx, fa, scratch):
                del ctx
                return fa.reduce(op, 0, scratch=scratch)

            return reduce(x, red_smem.at[w])

        def half_slot(w: int, k):
            """(kv_halves) Warpgroup w's ring slot of step k: w (pv_registers: 2 w + k % 2, two a warpgroup)."""
            return 2 * w + lax.rem(k, jnp.int32(2)) if pv_registers else w

        def stage_half_bt(w: int, k, prev_k):
            """(kv_halves) Warpgroup w's block-table buffer restaged when step k's chunk differs from the one there:
            prev_k's (the step before k in this warpgroup's range; -1: none yet, where warpgroup 0's buffer holds chunk
            0, loaded with the info, and 1's nothing). Returns (step k's first page's index, its block-table chunk)."""
            bar = bt_bar if w == 0 else bt_bar_wg1
            base = INFO_WORDS + w * bt_chunk
            lp0 = first_page(k)
            chunk = lax.div(lp0, jnp.int32(bt_chunk))
            staged = jnp.where(prev_k >= 0, lax.div(first_page(jnp.maximum(prev_k, 0)), jnp.int32(bt_chunk)),
                               jnp.int32(0 if w == 0 else -1))

            @pl.when(chunk != staged)
            def _():
                plgpu.copy_gmem_to_smem(sched_ref.at[req, pl.ds(INFO_WORDS + chunk * bt_chunk, bt_chunk)],
                                        i_smem.at[pl.ds(base, bt_chunk)], bar)
                plgpu.barrier_wait(bar)

            return lp0, chunk

        def half_pages(w: int, lp0, chunk, last_page):
            """(kv_halves) The cache pages of the step whose first page is lp0 (in block-table chunk `chunk`, staged in
            warpgroup w's buffer: stage_half_bt), pages_per_step of them: pages past the request's last, the last
            (its rows past kv_len)."""
            base = INFO_WORDS + w * bt_chunk

            def page_at(lp):
                return i_smem[base + lp - chunk * bt_chunk]

            if pages_per_step == 1:
                return [page_at(lp0)]
            return [page_at(jnp.minimum(lp0 + j, last_page)) for j in range(pages_per_step)]

        def issue_half_step(w: int, k, prev_k, last_page):
            """(kv_halves) TMA of KV step k into warpgroup w's ring slot (half_slot; kv_ready's). Its block-table
            buffer (w) is restaged first when step k's chunk differs from the one there (stage_half_bt)."""
            lp0, chunk = stage_half_bt(w, k, prev_k)
            slot = half_slot(w, k)

            def copy(src, rows=None):  # (src: [rows, 576] of the cache (pair_ring: [rows, 1152] of its pairs); rows:
                # the slot's rows it fills)
                at = (slot,) if rows is None else (slot, rows)
                plgpu.copy_gmem_to_smem(src, kv_smem.at[at], kv_ready.at[slot])

            if pages_per_step == 1:
                [page] = half_pages(w, lp0, chunk, last_page)
                copy(step_rows(k, page))
            else:
                rows = page_size // 2 if pair_ring else page_size  # (the slot's rows a page fills)
                for j, page in enumerate(half_pages(w, lp0, chunk, last_page)):
                    copy(step_rows(k, page), pl.ds(j * rows, rows))

        def compute_wg_halves(w: int):
            """(kv_halves) Warpgroup w: the tile's info (1 loads it, and q), then its half of the split's steps."""
            if w == 1:
                load_info()
            first_tok, ntok, first_pos, kv_len, last_page, begin, end = tile_info()

            @pl.when(ntok > 0)
            def _():
                if w == 1:
                    load_q(first_tok)
                # warpgroup 0 the first ceil(n / 2) steps (as ceil(n x 50 / 100): session 26's wg0_share, removed)
                mid = begin + lax.div((end - begin) * 50 + 99, jnp.int32(100))
                b, e = (begin, mid) if w == 0 else (mid, end)
                pl.when(e > b)(lambda: issue_half_step(w, b, jnp.int32(-1), last_page))
                if pv_registers:  # (its second slot)
                    pl.when(e > b + 1)(lambda: issue_half_step(w, b + 1, b, last_page))
                compute_tile_halves(w, first_tok, ntok, first_pos, kv_len, b, e, last_page)

        def compute_tile_halves(w, first_tok, ntok, first_pos, kv_len, b, e, last_page):
            """(kv_halves) Warpgroup w runs steps [b, e) alone: per step it converts V (fp8 -> its f16 copy, 8 chunks)
            and the rope columns (into registers), refills its ring slot with its next step at once, computes
            S^T = K Q^T (9 wgmmas, the rope's left operand in registers), the softmax down the columns, P^T (its P
            buffer) and O^T += V^T P^T ([512, n], 8 wgmmas of M = 64) (qk_registers: the scores' left operands from
            registers as each chunk is converted, scores_from_registers). Then the two warpgroups merge their partials
            (max m, sums l, O^T) through shared memory: each writes its max, sums and the O^T half the other one
            writes out, and finishes its own half (`finish`, transposed_pv's)."""
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

            scale = scale_log2 * k_scale()
            plgpu.barrier_wait(q_bar)
            if q_bits:  # each warpgroup half the tile's rows, then both wait for the other's (both read all of q)
                per_wg = q_rows * Q_GROUPS // NUM_COMPUTE_WGS
                convert_q(w * per_wg, per_wg)
                plgpu.barrier_arrive(sync_a)
                plgpu.barrier_wait(sync_a)

            def softmax_store(s, m_i, l_i):
                """A step's online softmax down the columns of its scaled (and masked) scores s [64, n]: (alpha, the
                new column max, the sums), P^T stored into this warpgroup's P buffer and fenced for its P @ V
                (the sums kept [64, n], reduced down their columns after the last step)."""
                m_new = jnp.maximum(m_i, col_reduce(s, "max", w))
                alpha = jnp.exp2(m_i - m_new)
                p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [1]))
                l_i = l_i * lax.broadcast_in_dim(alpha, p.shape, [1]) + p
                # (this warpgroup's P @ V of the step before, P's reader, is done)
                store_tiled(p_w(), p.astype(dtype), wg_layout, transforms, transpose=True)
                plgpu.commit_smem()
                return alpha, m_new, l_i

            def step(k, carry, masked: bool):
                acc, m_i, l_i = carry
                kv_start = k * block_kv
                slot = half_slot(w, k)
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
                    s = mask_scores(s, kv_start, first_pos, kv_len, scale, row_ax=1, key_ax=0)
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
                    ones = jnp.where(rows_below(valid, ld_layout), jnp.int32(-1), jnp.int32(0)).astype(jnp.int8)

                    if pair_ring:  # (each chunk's bytes from its window, masked and stored back by the same threads)
                        for c in range(HEAD_DIM // 64):
                            x = lax.bitcast_convert_type(load_pair_chunk(slot, c // 2, c % 2), jnp.int8) & ones
                            store_pair_chunk(lax.bitcast_convert_type(x, jnp.float8_e4m3fn), slot, c // 2, c % 2)
                    else:
                        @pl.loop(0, HEAD_DIM // 64)
                        def _(c):
                            ref = kv_smem.at[slot, :, pl.ds(pl.multiple_of(c * 64, 64), 64)]
                            x = lax.bitcast_convert_type(plgpu.load(ref, layout=ld_layout), jnp.int8) & ones
                            store_tiled(ref, lax.bitcast_convert_type(x, jnp.float8_e4m3fn), ld_layout, FP8_RING_TILES)

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
                pl.when(k + 2 < e)(lambda: issue_half_step(w, k + 2, k + 1, last_page))

            def rope_rows(slot, kv_start, masked: bool):
                """The step's rope columns [block_kv, 64] in registers (WGMMA layout), rows past kv_len 0
                (qk_permuted: as_operand's view)."""
                rope = plgpu.load(kv_smem.at[slot, :, pl.ds(KV_LORA_RANK, QK_ROPE_HEAD_DIM)], layout=ld_layout)
                return rope_operand(rope, kv_start, masked)

            def rope_operand(rope, kv_start, masked: bool):
                """rope_rows's conversion of the loaded rope columns."""
                rope = rope.astype(dtype)
                if masked:
                    rope = jnp.where(rows_below(kv_len - kv_start, ld_layout), rope, jnp.zeros_like(rope))
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
                """(qk_registers) S^T = K Q^T with every left operand in registers: each 64-column chunk of V is
                loaded from the fp8 slot in the WGMMA layout, converted, stored to V's f16 copy (for P @ V; not with
                pv_registers, whose P @ V loads V^T from the slot) and
                handed to its scores' wgmma as it is, so the scores never read the copy back from shared memory.
                Then the slot is refilled."""
                keep = rows_below(kv_len - kv_start, ld_layout) if masked else None

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
                            store_tiled(v_w().at[:, cols], x, ld_layout, F16_TILES)
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
                        pl.when(k + 1 < e)(lambda: issue_half_step(w, k + 1, k, last_page))
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
            l_i = col_reduce(l_i, "add", w)

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
            finish(w, o_t, l_tot, lse, first_tok, ntok)

        for w in range(NUM_COMPUTE_WGS):
            pl.when(wg == w)(functools.partial(compute_wg_halves if kv_halves else compute_wg, w))

    # wgmma needs one swizzle for both operands: P is [64, block_kv], so every operand (Q, the KV ring, P) is tiled
    # (8, 64) with a 128-byte swizzle.
    p_cols = block_kv
    transforms = (plgpu.TilingTransform((8, p_cols)), plgpu.SwizzleTransform(p_cols * 2))
    stage_dtype = jnp.float32 if split_out else out_dtype
    stage_cols = 128 // jnp.dtype(stage_dtype).itemsize  # one 128-byte swizzle row
    stage_transforms = (plgpu.TilingTransform((8, stage_cols)), plgpu.SwizzleTransform(128))
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
            (plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, V_HALF), stage_dtype, transforms=stage_transforms),
             plgpu.SMEM((NUM_COMPUTE_WGS, 2, V_HALF, score_rows), jnp.bfloat16, transforms=t_transforms),
             plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, score_rows), jnp.bfloat16, transforms=t_transforms)),
            # the partials' O^T halves, written and read after the steps, before the stage is written (over q and
            # the ring: 32 KiB at 16 rows, 64 at 32, where its rows of 128 bytes are tiled and swizzled: untiled,
            # its WGMMA-layout load has no conflict-free transfer)
            (plgpu.SMEM((NUM_COMPUTE_WGS, V_HALF, score_rows), jnp.float32,
                        transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
                        if score_rows == 32 else ()),),
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
                (plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, V_HALF), stage_dtype, transforms=stage_transforms),
                 # transposed_pv: per warpgroup O^T's two bf16 parts and the identity (after the stage)
                 plgpu.SMEM((NUM_COMPUTE_WGS, 2, V_HALF, score_rows), jnp.bfloat16, transforms=t_transforms),
                 plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, score_rows), jnp.bfloat16, transforms=t_transforms))
                if transposed_pv else
                plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, V_HALF), stage_dtype, transforms=stage_transforms),
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
    num_ctas_tiles = num_reqs * q_tiles
    # the body finds its CTA by axis name; the last axis is CUDA's x, the launch order's fastest
    axes = (("h", num_h_tiles), ("split", num_splits), ("tile", num_ctas_tiles))
    grid_names, grid = zip(*(axes[::-1] if heads_fastest else axes))
    lead = (num_splits,) if split_out else ()  # split-KV: fp32 partials of each split, per token
    out_type = (
        jax.ShapeDtypeStruct(lead + (num_tokens, heads, KV_LORA_RANK), stage_dtype),
        jax.ShapeDtypeStruct(lead + (num_tokens, heads), jnp.float32),
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


# --------------------------------------------------------------------------------------
# The wrapper: one small schedule array, the kernel, and (split-KV only) the combine.


def _kernel_heads(num_heads: int) -> int:
    """Heads the kernel runs: 8, 16, 32 or a multiple of 64 (q is padded to it otherwise)."""
    if num_heads <= BLOCK_H:
        return max(8, 1 << (num_heads - 1).bit_length())
    return -(-num_heads // BLOCK_H) * BLOCK_H


def _sched(metadata: DecodeMetadata, width: int, k_scale=None):
    """[R, INFO_WORDS + width] int32: per request (q_start, q_len, seq_len, k_scale's float32 bits
    (fp8; else 0), 0 (fp8: the dequantized step's index, see kv_tile), 0...) then its block table,
    padded with zeros to `width` columns (never read: pages past the last are clamped in the kernel).
    One small XLA fusion."""
    qsl = metadata.query_start_loc.astype(jnp.int32)
    seq = metadata.seq_lens.astype(jnp.int32)
    bt = metadata.block_table.astype(jnp.int32)
    num_reqs = seq.shape[0]
    info = jnp.zeros((num_reqs, INFO_WORDS), jnp.int32)
    info = info.at[:, 0].set(qsl[:-1]).at[:, 1].set(qsl[1:] - qsl[:-1]).at[:, 2].set(seq)
    if k_scale is not None:
        info = info.at[:, 3].set(lax.bitcast_convert_type(jnp.asarray(k_scale, jnp.float32), jnp.int32))
    return jnp.concatenate([info, jnp.pad(bt, ((0, 0), (0, width - bt.shape[1])))], axis=1)


def _kv_halves_runs(tuning: MosaicConfig, fp8: bool, num_heads: int, max_query_len: int,
                    interpret: bool) -> tuple[bool, int]:
    """(kv_halves runs, the tile's rows in use: score_rows, BLOCK_H without transposed scores) for `tuning`: an fp8
    cache, transposed_pv at 16 or 32 rows (at 32 only where pv_registers runs, compiled: V's f16 copies do not fit
    beside q's 32 rows; interpret mode, with no shared-memory limit, runs it with the copies)."""
    _, hp, tpt = _tile_geometry(num_heads)
    score_rows = hp * min(tpt, max(1, max_query_len)) if tuning.transpose != "none" else BLOCK_H
    kv_halves = (tuning.warpgroup_halves and fp8 and tuning.transpose == "scores_and_pv"
                 and score_rows in TRANSPOSED_PV_ROWS
                 and (score_rows == TRANSPOSED_PV_ROWS[0] or interpret or tuning.v_from_ring))
    return bool(kv_halves), score_rows


def _q_in_kernel_runs(tuning: MosaicConfig, fp8: bool, q_dtype, interpret: bool) -> bool:
    """Where MosaicConfig.q_in_kernel runs: an fp8 cache and a bf16 q, compiled."""
    return bool(fp8 and tuning.q_in_kernel and jnp.dtype(q_dtype) == jnp.bfloat16 and not interpret)


def _mla_decode(q, kv_cache, k_scale, metadata: DecodeMetadata, config: MLAConfig, tuning: MosaicConfig,
                interpret: bool, out_dtype=None):
    num_tokens, num_heads, _ = q.shape
    fp8 = config.is_fp8_kv_cache
    out_dtype = q.dtype if out_dtype is None else out_dtype  # (fp8: q is f16 here, the output q's dtype)
    # (q_in_kernel: a bf16 q reaches the fp8 kernel as it is, converted inside)
    q_bits = fp8 and q.dtype == jnp.bfloat16
    if q_bits and not _q_in_kernel_runs(tuning, fp8, q.dtype, interpret):
        raise ValueError(f"an fp8 cache runs the wgmmas in float16: a bf16 q is converted before the kernel unless "
                         f"q_in_kernel runs (compiled), got q_in_kernel={tuning.q_in_kernel}, {interpret=}")
    page_size = config.page_size
    heads, hp, tpt = _tile_geometry(num_heads)
    if heads != num_heads:
        q = jnp.pad(q, ((0, 0), (0, heads - num_heads), (0, 0)))
    num_h_tiles = heads // hp
    num_reqs = metadata.seq_lens.shape[0]
    q_tiles = -(-max(1, metadata.max_query_len) // tpt)
    block_kv = BLOCK_KV
    if not supported_page_size(page_size, block_kv):
        raise NotImplementedError(f"page_size={page_size} is not supported with block_kv={block_kv}")
    num_splits = tuning.num_splits
    if metadata.max_num_splits > 0:
        num_splits = min(num_splits, metadata.max_num_splits)
    heads_fastest = tuning.launch_order == "heads_first"
    if heads_fastest and num_reqs * q_tiles > MAX_GRID_YZ:
        raise NotImplementedError(f"launch_order='heads_first' puts the requests x query tiles on CUDA's z axis (at most "
                                  f"{MAX_GRID_YZ}), got {num_reqs} x {q_tiles} = {num_reqs * q_tiles}")

    # transposed scores: the tile's rows in use (hp heads x the tokens a tile can hold), when fewer than 64
    kv_halves, score_rows = _kv_halves_runs(tuning, fp8, num_heads, metadata.max_query_len, interpret)
    pages_per_step = max(1, block_kv // page_size)
    bt_chunk = BT_CHUNK
    # kv_halves where it applies (_kv_halves_runs): two block-table chunk buffers (a warpgroup each) of at most
    # KV_HALVES_BT_CHUNK entries, within the shared memory left
    if kv_halves:
        bt_chunk = min(bt_chunk, KV_HALVES_BT_CHUNK)
    bt_chunk -= bt_chunk % pages_per_step
    width = -(-metadata.block_table.shape[1] // bt_chunk) * bt_chunk
    # (interpret mode runs kv_halves's registers path unpermuted, with V's f16 copies: the interpreter has no rule for
    # inline_mgpu, the registers' view, nor for a wgmma's left operand in registers)
    qk_permuted = kv_halves and not interpret
    pv_registers = qk_permuted and tuning.v_from_ring
    # (pair_ring: the cache two tokens a row, a free reshape; pages of a multiple of 16 rows, else the default ring)
    pair_ring = pv_registers and tuning.ring_pairs and pair_ring_fits(page_size)
    if qk_permuted and not q_bits:  # (the scores' wgmmas see K's columns permuted: q's the same way; fused with q's
        # f16 conversion; q_bits: in the kernel's conversion)
        q = q[..., QK_PERM]
    kernel = _build_kernel(
        dtype=jnp.float16 if q_bits else q.dtype, out_dtype=out_dtype, page_size=page_size, num_tokens=num_tokens,
        heads=heads, hp=hp, num_h_tiles=num_h_tiles, q_tiles=q_tiles, num_reqs=num_reqs, num_splits=num_splits,
        bt_chunk=bt_chunk, scale_log2=config.softmax_scale * LOG2E,
        score_rows=score_rows if score_rows < BLOCK_H else 0, fp8=fp8, interpret=interpret,
        transposed_pv=tuning.transpose == "scores_and_pv" and score_rows in TRANSPOSED_PV_ROWS,
        heads_fastest=heads_fastest, kv_halves=kv_halves, pv_registers=pv_registers, pv_wait=tuning.pv_in_flight,
        pair_ring=pair_ring, q_bits=q_bits,
    )
    if pair_ring:
        kv_cache = kv_cache.reshape(kv_cache.shape[0], page_size // 2, 2 * kv_cache.shape[2])
    out, lse = kernel(q, kv_cache, _sched(metadata, width, k_scale if fp8 else None))
    # (pv_registers) the kernel's output columns permuted by PV_PERM within each 16: put back by the combine's gather
    # with split-KV, else by a gather of their own
    order = jnp.asarray(PV_UNPERM, jnp.int32) if pv_registers else None
    if num_splits > 1:
        # split partials per token [S, T, heads, 512] -> out, lse: one Pallas Triton kernel on the GPU
        # (mla_jax.combine); in Mosaic GPU interpret mode its jnp formula
        out, lse = (combine_ref(out, lse, out_dtype, order) if interpret
                    else combine(out, lse, out_dtype, col_order=order))
    elif pv_registers:
        out = out[..., order]
    return out[:, :num_heads], lse[:, :num_heads]


@functools.partial(jax.jit, static_argnames=("config", "tuning", "interpret", "out_dtype"))
def _mla_decode_jit(q, kv_cache, k_scale, metadata, config, tuning, interpret, out_dtype=None):
    if interpret:
        # The context manager must be active while the kernel is traced (it sets a
        # trace-context config); inside this jitted function it is.
        params = interpret if isinstance(interpret, plgpu.InterpretGPUParams) else plgpu.InterpretGPUParams()
        with plgpu.force_gpu_interpret_mode(params):
            return _mla_decode(q, kv_cache, k_scale, metadata, config, tuning, True, out_dtype)
    return _mla_decode(q, kv_cache, k_scale, metadata, config, tuning, False, out_dtype)


def mla_decode(q_nope, q_pe, kv_cache, metadata: DecodeMetadata, config: MLAConfig, *,
               tuning: MosaicConfig | None = None, interpret=False, k_scale=1.0):
    """Returns `(out [T, H, 512] in q's dtype, lse [T, H] float32)`.

    q_nope [T, H, 512] and q_pe [T, H, 64]; or q_nope the packed q [T, H, 576] and q_pe None
    (the kernel reads q [T, H, 576] by TMA: a packed q is not copied, a pair is concatenated).
    `metadata` holds jnp int32 arrays (a pytree, see mla_jax.api). jit-compatible.
    `interpret=True` (or a `plgpu.InterpretGPUParams`, e.g. with `detect_races=True`)
    runs the kernel in Mosaic GPU interpret mode (CPU).
    With kv_cache_dtype="fp8_e4m3" the cache is float8_e4m3fn and k_scale its per-tensor scale (real
    value = fp8 value x k_scale; a float or a 0-d float32 array, traced under jit). The wgmmas then run
    in f16: a bf16 q is converted (exact for |q| in [2^-14, 65504]; larger entries become inf and the
    output NaN, never a silent clamp).
    """
    reason = unsupported_reason(config)
    if reason is not None:
        raise NotImplementedError(f"pallas_mosaic_gpu cannot run this problem: {reason}")
    q = q_nope if q_pe is None else jnp.concatenate([q_nope, q_pe.astype(q_nope.dtype)], axis=-1)
    if q.ndim != 3 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"q must be [T, H, {HEAD_DIM}] (or q_nope, q_pe), got q.shape={tuple(q.shape)}")
    if tuning is None:
        tuning = heuristic_config(config, q.shape[0], metadata.max_blocks, metadata.num_reqs,
                                  max_query_len=metadata.max_query_len)
    elif not isinstance(tuning, MosaicConfig):
        raise ValueError(f"tuning must be a MosaicConfig, got tuning={tuning!r}")
    if not isinstance(interpret, plgpu.InterpretGPUParams):
        interpret = bool(interpret)
    out_dtype = None
    fp8 = config.is_fp8_kv_cache
    if fp8 and q.dtype != jnp.float16:
        # The fp8 path runs its wgmmas in f16 (see _build_kernel): bf16 q converts exactly for |q| in
        # [2^-14, 65504] (f16 has 3 more mantissa bits); larger values become inf (the output NaN). q_in_kernel: the
        # same conversion inside the kernel.
        out_dtype = jnp.dtype(q.dtype)
        if not _q_in_kernel_runs(tuning, fp8, q.dtype, bool(interpret)):
            q = q.astype(jnp.float16)
    return _mla_decode_jit(q, kv_cache, jnp.asarray(k_scale, jnp.float32), metadata, config, tuning, interpret,
                           out_dtype)
