"""Paged MLA decode on Hopper: a Pallas Mosaic GPU (`plgpu`) kernel.

Work split. One CTA takes one 64-row query tile (the wgmma M) x one piece of the batch's work schedule. For H < 64 a
tile packs 64 // H consecutive query tokens of one request x H heads (row = token * H + head); for H >= 64 one token's
heads fill H // 64 tiles; other head counts are padded to 8, 16, 32 or a multiple of 64. The schedule
(mla_jax.schedule, computed in the call from the traced lengths: new lengths reuse the compiled call) cuts the KV steps
of all requests, request after request, into num_reqs x num_splits parts of equal steps; a piece is a part's run of
steps inside one request, so a long request among short ones takes many CTAs and each short one one (num_splits comes
from a cost model of the H200, heuristic_config). The grid is (head tile, piece x query tile), sized by the static slot
count, the pieces longest first (the block scheduler then places them as a longest-first list schedule); its
fastest axis (CUDA's x) is the pieces, or with launch_order="heads_first" the head tiles, so a request's
head tiles run together and the second reads each KV step from L2 (1.06-1.11x at H = 128). A CTA reads its piece's
row in one TMA (its request's (q_start, q_len, seq_len), the piece's steps and the block-table chunk of its first
step), TMA-loads its q rows from q [T, H, 576] and writes its fp32 partials to its slot, which
mla_jax.combine.combine_slots merges per token; a request's only piece writes out [T, H, 512] and lse [T, H] directly
(except with pv_registers, whose output columns come out permuted). Rows see the request's KV with a bottom-right
causal mask; steps every row sees entirely skip the mask; cache slots past a request's length may hold NaN and never
reach the output.

Warpgroups. Two compute warpgroups, each owning 256 of the 512 latent output columns (a 64 x 256 fp32 accumulator);
warpgroup 1 also issues the TMAs into a two-stage ring (q and two 72 KiB stages fill the 227 KiB of shared memory).
A third, memory warpgroup is not used: its threads would cap every thread at 168 registers, and the compute
warpgroups spill there.

Code paths (heuristic_config picks one per problem by the rows of a tile in use; make_plan decides what runs):
* one chain, plain scores (one_chain.py; H >= 64, or more than 32 rows in use): warpgroup 0 computes S = Q K^T of a
  step (wgmma N = 64), the online softmax (exp2, fp32) and P, and hands P and the rescale factor over; both do their
  P @ V half, so warpgroup 1's P @ V of step k runs under warpgroup 0's scores of step k + 1 (FlashMLA's split,
  1.09-1.31x faster than splitting each step's scores between the warpgroups).
* one chain, transposed (transpose="scores" / "scores_and_pv"; at most 32 rows in use, e.g. H = 16 at q_len 1):
  warpgroup 0 computes S^T = K Q^T over the rows in use only (4x less tensor work at 16 rows) and the softmax down
  the columns; with "scores_and_pv" (16 and 32 rows) each warpgroup accumulates O^T = V^T P^T [256, rows] and
  transposes it back once a tile by two wgmmas with an identity (1.03-1.13x over transposed scores alone).
* fp8 cache (kv_cache_dtype="fp8_e4m3"): the TMAs fill a ring of fp8 steps (half the bytes), converted exactly to
  f16 (one cvt a value pair) for f16 wgmmas; the per-tensor k_scale scales the scores and the output. On the one
  chain with plain scores warpgroup 0 converts its columns inside its scores, four chunks between two fences
  (1.04-1.06x over converting before them); with transposed scores the next step converts under this step's P @ V
  (1.11-1.12x), warpgroup 1 taking V's first half while it waits for P (1.03-1.07x more).
* warpgroup halves (halves.py; fp8, both transposed at 16 rows, or at 32 rows where a split has 32 steps or more):
  each warpgroup runs whole steps alone on its own half of the split's steps, two step chains a CTA (1.19-1.20x at
  H = 16, q_len 1); the scores' left operands come from registers as each chunk is converted (1.20x), viewed with q's
  columns permuted (QK_PERM, 1.06x), the softmax sums reduced across warps once at the end (1.05x). With v_from_ring
  (a split of 32 steps or more) P @ V's V^T is loaded from the ring into registers too (1.07x), the masked step's
  tail zeroed in the ring (1.10-1.11x where a step is masked) and each chunk loaded a chunk ahead of its conversion
  (1.10-1.13x); ring_pairs holds two tokens a ring row (1.01-1.02x at 16 rows).

The phases of a step are `jax.named_scope` regions (kv_wait, qk, p_free_wait, pv, p_ready_wait, deq_wait, dequant,
zero_tail): with the Mosaic GPU profiler on each warpgroup's time in them is traced; off, they cost nothing.
Interpret mode (`interpret=True`) runs the same kernel on CPU through `plgpu.force_gpu_interpret_mode`; the paths
that need inline Mosaic GPU (registers views, ldmatrix, in-kernel q conversion) run their shared-memory forms there.
"""

from __future__ import annotations

import dataclasses
import functools
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_jax.combine import combine_slots
from mla_jax.combine import combine_slots_ref
from mla_jax.reference import mask_padding
from mla_jax.schedule import Schedule, mla_schedule, prebuilt_or_build, slot_pieces
from mla_spec import DecodeMetadata, check_config_and_metadata
from mla_spec import MLAConfig
from mla_spec.config import check_config
from mla_jax.api import default_interpret
from mla_jax.pallas_mosaic_gpu.config import (
    BLOCK_H, BLOCK_KV, BT_CHUNK, HEAD_DIM, INFO_BEGIN, INFO_END, INFO_REQ, INFO_SINGLE, INFO_SLOT, INFO_WORDS,
    KV_HALVES_BT_CHUNK, LOG2E, MAX_GRID_YZ, MosaicConfig,
    TRANSPOSED_PV_ROWS, _kv_halves_runs, _q_in_kernel_runs, _tile_geometry, heuristic_config, pair_ring_fits,
    supported_page_size, unsupported_reason,
)
from mla_jax.pallas_mosaic_gpu.layouts import PV_UNPERM, QK_PERM
from mla_jax.pallas_mosaic_gpu.kernel import _build_kernel


def _sched(metadata: DecodeMetadata, width: int):
    """[R, INFO_WORDS + width] int32: per request (q_start, q_len, seq_len, 0...) then its block table, padded with
    zeros to `width` columns (never read: pages past the last are clamped in the kernel). The kernel reads the block
    table from here (a piece's first chunk comes in its own row, `_piece_rows`, with the info words)."""
    qsl = metadata.query_start_loc.astype(jnp.int32)
    seq = metadata.seq_lens.astype(jnp.int32)
    bt = metadata.block_table.astype(jnp.int32)
    num_reqs = seq.shape[0]
    info = jnp.zeros((num_reqs, INFO_WORDS), jnp.int32)
    info = info.at[:, 0].set(qsl[:-1]).at[:, 1].set(qsl[1:] - qsl[:-1]).at[:, 2].set(seq)
    return jnp.concatenate([info, jnp.pad(bt, ((0, 0), (0, width - bt.shape[1])))], axis=1)


def _num_splits(metadata: DecodeMetadata, tuning: MosaicConfig) -> int:
    """The schedule's parts per request: tuning.num_splits, at most metadata.max_num_splits where that is > 0."""
    if metadata.max_num_splits > 0:
        return min(tuning.num_splits, metadata.max_num_splits)
    return tuning.num_splits


def _block_table_chunk(page_size: int, kv_halves: bool) -> int:
    """Block-table entries a CTA stages at a time: BT_CHUNK, or with kv_halves two buffers (a warpgroup each) of at
    most KV_HALVES_BT_CHUNK within the shared memory left; a multiple of the pages a step reads."""
    pages_per_step = max(1, BLOCK_KV // page_size)
    bt_chunk = min(BT_CHUNK, KV_HALVES_BT_CHUNK) if kv_halves else BT_CHUNK
    return bt_chunk - bt_chunk % pages_per_step


def _schedule(metadata: DecodeMetadata, num_splits: int, num_tokens: int, page_size: int, bt_chunk: int) -> Schedule:
    """The work schedule of the batch's (traced) lengths: num_reqs x num_splits parts of equal steps (no per-piece
    overhead: each piece is a CTA of its own, which the GPU's block scheduler places), with the combine's
    token_slots for num_tokens tokens, the pieces a row a slot and the kernel's rows (`kernel_rows`: the requests'
    block tables and the pieces' rows, for chunks of bt_chunk entries). The one construction behind both the call's
    inline schedule and with_schedule's."""
    qsl = metadata.query_start_loc.astype(jnp.int32)
    q_lens = qsl[1:] - qsl[:-1]
    num_reqs = metadata.seq_lens.shape[0]
    schedule = mla_schedule(metadata.seq_lens, q_lens, num_parts=num_reqs * num_splits, block_kv=BLOCK_KV,
                            fixed_overhead=0)
    schedule = schedule.with_token_slots(qsl, num_tokens)  # (at fixed_overhead 0 mla_schedule gives the pieces)
    return dataclasses.replace(schedule, kernel_rows=_kernel_rows(metadata, schedule, schedule.pieces, page_size,
                                                                  bt_chunk))


def _kernel_rows(metadata: DecodeMetadata, schedule: Schedule, pieces, page_size: int, bt_chunk: int):
    """(the requests' rows [R, INFO_WORDS + width] (_sched, no k_scale), the pieces' rows [S, INFO_WORDS + bt_chunk]
    (_piece_rows)): what the kernel reads of the batch, for block-table chunks of bt_chunk entries."""
    sched = _sched(metadata, -(-metadata.block_table.shape[1] // bt_chunk) * bt_chunk)
    pages_per_step, steps_per_page = max(1, BLOCK_KV // page_size), max(1, page_size // BLOCK_KV)
    return sched, _piece_rows(sched, pieces, schedule.split_offsets, bt_chunk, pages_per_step, steps_per_page)


_schedule_jit = jax.jit(_schedule, static_argnames=("num_splits", "num_tokens", "page_size", "bt_chunk"))
"""_schedule as one compiled program (new lengths of the same shapes reuse it): with_schedule's builder outside a
jit, one launch instead of a few dozen small ones."""


def with_schedule(metadata: DecodeMetadata, config: MLAConfig, *, num_tokens: int | None = None,
                  tuning: MosaicConfig | None = None) -> DecodeMetadata:
    """`metadata` with its work schedule computed ahead in `scheduler_metadata`, as FA3's scheduler_metadata and
    FlashMLA's get_mla_metadata are: once a batch (a decode step), shared by every layer's call, instead of inside
    each call (a few dozen small XLA ops).

    The schedule is the one mla_decode builds for `tuning` (default: the heuristic's for this metadata and
    num_tokens query tokens, default metadata.num_decode_tokens), so a call with that tuning gives the same bits
    either way; a call whose tuning runs another split count raises ValueError. jit-compatible: traced lengths give
    a traced schedule. The metadata's shapes, dtypes and static ints are checked (`DecodeMetadata.validate` without
    its values, which may be traced): ValueError naming them."""
    check_config_and_metadata(config, metadata)
    metadata.validate(config, check_values=False)
    num_tokens = int(metadata.num_decode_tokens) if num_tokens is None else num_tokens
    if tuning is None:
        tuning = heuristic_config(config, num_tokens, metadata.max_blocks, metadata.num_reqs,
                                  max_query_len=metadata.max_query_len)
    elif not isinstance(tuning, MosaicConfig):
        raise ValueError(f"tuning must be a MosaicConfig or None, got tuning={tuning!r}")
    # (the block-table chunk of the compiled kernel, or of interpret mode where JAX has no GPU)
    kv_halves, _ = _kv_halves_runs(tuning, config.is_fp8_kv_cache, config.num_heads, metadata.max_query_len,
                                   default_interpret())
    md = metadata.replace(scheduler_metadata=None)
    return metadata.replace(scheduler_metadata=_schedule_jit(md, _num_splits(metadata, tuning), num_tokens,
                                                             config.page_size,
                                                             _block_table_chunk(config.page_size, kv_halves)))


def _piece_rows(sched, pieces, split_offsets, bt_chunk: int, pages_per_step: int, steps_per_page: int):
    """[S, INFO_WORDS + bt_chunk] int32, a row a CTA: the schedule's pieces (`pieces`: schedule.slot_pieces), the
    longest first, so that the GPU's block scheduler, which hands out CTAs in grid order, places them as the
    longest-first list schedule (a ragged batch's request-boundary fragments run last, filling the gaps). A row holds
    its request's info (sched's first INFO_WORDS words) with the piece's first step, one past its last, its request,
    whether it is the request's only piece and its slot in words INFO_BEGIN..INFO_SLOT, then the block-table chunk of
    its first step (the CTA's one TMA brings all of it). Zeros for slots past the batch's pieces (last): q_len 0,
    the CTAs return. A sort of the slots and one gather fusion."""
    steps = pieces[:, 2] - pieces[:, 1]
    slot = jnp.argsort(-steps, stable=True).astype(jnp.int32)  # (equal pieces, a uniform batch's: in slot order)
    req, begin, end = pieces[slot, 0], pieces[slot, 1], pieces[slot, 2]
    only = split_offsets[req + 1] - split_offsets[req] == 1
    page = begin // steps_per_page if pages_per_step == 1 else begin * pages_per_step
    cols = INFO_WORDS + (page // bt_chunk)[:, None] * bt_chunk + jnp.arange(bt_chunk, dtype=jnp.int32)[None, :]
    info = (sched[req, :INFO_WORDS].at[:, INFO_BEGIN].set(begin).at[:, INFO_END].set(end)
            .at[:, INFO_REQ].set(req).at[:, INFO_SINGLE].set(only.astype(jnp.int32)).at[:, INFO_SLOT].set(slot))
    rows = jnp.concatenate([info, sched[req[:, None], cols]], axis=1)
    return jnp.where((end > begin)[:, None], rows, 0)


def _mla_decode(q, kv_cache, k_scale, metadata: DecodeMetadata, config: MLAConfig, tuning: MosaicConfig,
                interpret: bool, out_dtype=None, detect_races: bool = False):
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
    num_splits = _num_splits(metadata, tuning)
    # transposed scores: the tile's rows in use (hp heads x the tokens a tile can hold), when fewer than 64
    kv_halves, score_rows = _kv_halves_runs(tuning, fp8, num_heads, metadata.max_query_len, interpret)
    bt_chunk = _block_table_chunk(page_size, kv_halves)
    # the work schedule and the kernel's rows (built ahead by with_schedule, once a batch, or here from the traced
    # lengths: new lengths reuse the compiled call), a slot a piece
    qsl = metadata.query_start_loc.astype(jnp.int32)

    def build():
        return _schedule(metadata.replace(scheduler_metadata=None), num_splits, num_tokens, page_size, bt_chunk)

    schedule = prebuilt_or_build(metadata, build, num_parts=num_reqs * num_splits, block_kv=BLOCK_KV,
                                 fixed_overhead=0, num_tokens=num_tokens)
    sched, rows = schedule.kernel_rows or (None, None)
    if rows is None or rows.shape[1] != INFO_WORDS + bt_chunk:
        # (a schedule built ahead without them, or for another block-table chunk: with_schedule takes the compiled
        # kernel's where JAX has a GPU, and interpret mode's chunk where it has none)
        pieces = schedule.pieces
        if pieces is None:
            pieces = slot_pieces(schedule, metadata.seq_lens, qsl[1:] - qsl[:-1])
        sched, rows = _kernel_rows(metadata, schedule, pieces, page_size, bt_chunk)
    if fp8:  # k_scale's float32 bits in every piece's info word 3 (the kernel scales the scores and output by it)
        rows = rows.at[:, 3].set(lax.bitcast_convert_type(jnp.asarray(k_scale, jnp.float32), jnp.int32))
    num_slots = schedule.num_slots
    heads_fastest = tuning.launch_order == "heads_first"
    if heads_fastest and num_slots * q_tiles > MAX_GRID_YZ:
        raise NotImplementedError(f"launch_order='heads_first' puts the pieces x query tiles on CUDA's z axis "
                                  f"(at most {MAX_GRID_YZ}), got {num_slots} x {q_tiles} = {num_slots * q_tiles}")

    # (interpret mode runs kv_halves's registers path unpermuted, with V's f16 copies: the interpreter has no rule for
    # inline_mgpu, the registers' view, nor for a wgmma's left operand in registers)
    qk_permuted = kv_halves and not interpret
    pv_registers = qk_permuted and tuning.v_from_ring
    # (pair_ring: the cache two tokens a row, a free reshape; pages of a multiple of 16 rows, else the default ring)
    pair_ring = pv_registers and tuning.ring_pairs and pair_ring_fits(page_size)
    if qk_permuted and not q_bits:  # (the scores' wgmmas see K's columns permuted: q's the same way; fused with q's
        # f16 conversion; q_bits: in the kernel's conversion)
        q = q[..., QK_PERM]
    transposed_pv = tuning.transpose == "scores_and_pv" and score_rows in TRANSPOSED_PV_ROWS
    # a request's only piece writes out and lse directly (its rows skip the fp32 slot and the combine), except:
    # pv_registers's output columns are permuted (the combine's gather puts them back); and transposed P @ V under
    # the interpreter's race detector, which takes the output-dtype stage (the union's bytes [0, 64 KiB), warpgroup
    # w's half at w x 32 KiB) and O^T's parts (past the 128 KiB fp32 stage) for one buffer, though their bytes do
    # not overlap
    direct_single = not pv_registers and not (transposed_pv and detect_races)
    kernel = _build_kernel(
        dtype=jnp.float16 if q_bits else q.dtype, out_dtype=out_dtype, page_size=page_size, num_tokens=num_tokens,
        heads=heads, hp=hp, num_h_tiles=num_h_tiles, q_tiles=q_tiles, num_reqs=num_reqs, num_slots=num_slots,
        direct_single=direct_single, bt_chunk=bt_chunk, scale_log2=config.softmax_scale * LOG2E,
        score_rows=score_rows if score_rows < BLOCK_H else 0, fp8=fp8, interpret=interpret,
        transposed_pv=transposed_pv,
        heads_fastest=heads_fastest, kv_halves=kv_halves, pv_registers=pv_registers, pv_wait=tuning.pv_in_flight,
        pair_ring=pair_ring, q_bits=q_bits,
    )
    if pair_ring:
        kv_cache = kv_cache.reshape(kv_cache.shape[0], page_size // 2, 2 * kv_cache.shape[2])
    out, lse, o_part, l_part = kernel(q, kv_cache, sched, rows)
    # the slots' partials [S, query tiles x tpt, heads, 512] -> out, lse: one Pallas Triton kernel on the GPU
    # (combine_slots); in Mosaic GPU interpret mode its jnp formula. Where the kernel wrote a request's only piece
    # to out and lse (direct_single), the combine keeps those rows (they alias its result). (pv_registers) the
    # kernel's output columns are permuted by PV_PERM within each 16, and the combine's gather puts them back.
    order = jnp.asarray(PV_UNPERM, jnp.int32) if pv_registers else None
    direct = {"out": out, "lse": lse} if direct_single else {}
    out, lse = (combine_slots_ref if interpret else combine_slots)(
        o_part, l_part, schedule.split_offsets, qsl, out_dtype, num_tokens=num_tokens, col_order=order,
        token_slots=schedule.token_slots, **direct)
    out, lse = out[:, :num_heads], lse[:, :num_heads]
    # a padded bucket's token rows past query_start_loc[-1]: no CTA writes them
    return mask_padding(out, lse, metadata) if metadata.padded else (out, lse)


@functools.partial(jax.jit, static_argnames=("config", "tuning", "interpret", "out_dtype"))
def _mla_decode_jit(q, kv_cache, k_scale, metadata, config, tuning, interpret, out_dtype=None):
    if interpret:
        # The context manager must be active while the kernel is traced (it sets a
        # trace-context config); inside this jitted function it is.
        params = interpret if isinstance(interpret, plgpu.InterpretGPUParams) else plgpu.InterpretGPUParams()
        with plgpu.force_gpu_interpret_mode(params):
            return _mla_decode(q, kv_cache, k_scale, metadata, config, tuning, True, out_dtype,
                               detect_races=bool(params.detect_races))
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
    from mla_jax.api import check_interpret

    check_config(config)
    check_interpret(interpret, allow_params=True)
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

__all__ = ["MosaicConfig", "heuristic_config", "mla_decode", "supported_page_size", "unsupported_reason",
           "with_schedule"]

# (the names the tests and tools read)
from mla_jax.pallas_mosaic_gpu.config import MAX_SPLITS, TMA_MAX_BOX  # noqa: E402,F401
from mla_jax.pallas_mosaic_gpu.layouts import (  # noqa: E402,F401
    PV_PERM, PV_PERM_16, Q_GROUPS, Q_WORD_PERM, QK_PERM_64, _k_pair_lane_offset, _q_unit_offsets, _vt_lane_offset,
    _vt_pair_lane_offset,
)
from mla_jax.pallas_mosaic_gpu.ring import prefetch_to_l2, tma_windows  # noqa: E402,F401
from mla_jax.pallas_mosaic_gpu.softmax import accumulate_wgmma  # noqa: E402,F401
