"""The Mosaic GPU kernel's tuning (MosaicConfig), the heuristic that picks it, and the plan: the code paths that run
for a problem, decided once (make_plan) and read by every building block. Also the kernel's fixed geometry: 64-row
query tiles (the wgmma M), 64-token KV steps, a ring of two stages, two compute warpgroups of 256 output columns."""

from __future__ import annotations

import dataclasses
import jax.numpy as jnp
import math
from jax.experimental.pallas import mosaic_gpu as plgpu
from mla_spec import MLAConfig
from mla_spec.config import check_config
from mla_jax.schedule import num_slots_bound


KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576
BLOCK_H = 64  # wgmma M
NUM_COMPUTE_WGS = 2
V_HALF = KV_LORA_RANK // NUM_COMPUTE_WGS  # 256 latent columns per compute warpgroup
INFO_WORDS = 32  # per-tile int32 metadata row (TMA copies must be multiples of 128 bytes)
# a piece's info row: words 0-4 its request's (q_start, q_len, seq_len, k_scale bits, 0: the fp8 paths' scratch),
# then the piece's first step, one past its last, its request, whether it is the request's only piece, and its slot
INFO_BEGIN, INFO_END, INFO_REQ, INFO_SINGLE, INFO_SLOT = 5, 6, 7, 8, 9
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


# the one-chain fp8 overlap (the next step converted under this one's P @ V): the most rows of a tile in use
# (transposed scores) for which the two f16 copies of V's first half fit in shared memory beside q (32 rows:
# 36 KiB), the fp8 ring (72), V (3 x 32) and the rope (8)
OVERLAP_MAX_ROWS = 32


# transposed P @ V: the rows in use it runs at (its transpose back: rows of 32 or 64 bytes, a swizzle each;
# the identity's K a multiple of 16)
TRANSPOSED_PV_ROWS = (16, 32)


# the warpgroup-halves path: each warpgroup's block-table chunk (2 x 96 entries fit the shared memory left)
KV_HALVES_BT_CHUNK = 96


def pair_ring_fits(page_size: int) -> bool:
    """(pair_ring) whether a page is whole 8-row tiles of pair rows (a multiple of 16 tokens); elsewhere the default
    ring runs."""
    return page_size % 16 == 0


LAUNCH_ORDERS = ("requests_first", "heads_first")
TRANSPOSES = ("none", "scores", "scores_and_pv")


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Tuning of the Mosaic GPU kernel; heuristic_config picks it, and a field has no effect where its path cannot
    run (the wrapper decides which paths run for the problem: _plan)."""

    num_splits: int = 1
    """Parts of the work schedule per request: the batch's KV steps, all requests together, are cut into
    num_reqs x num_splits parts of equal steps (mla_jax.schedule), so a uniform batch's requests take num_splits
    pieces each and a ragged batch's long requests more, its short ones one. Each piece is a CTA; a request of
    several pieces has its fp32 partials merged by mla_jax.combine.combine_slots."""
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


# The split heuristic's cost model, in microseconds, from H200 timings: a 64-token step takes ~2.2 us (H128 B64
# S16384: 554 us / 256 steps; H16 B128 S16384: 655 / 256), a CTA ~3 us more (info, q and first pages in flight, the
# output out), and the split combine reads and writes the fp32 partials (~3 TB/s) after one more launch.
STEP_US = 2.2
CTA_US = 3.0
COMBINE_LAUNCH_US = 2.0
COMBINE_BYTES_PER_US = 3e6
MAX_SPLITS = 128
# Transposed scores alone where a tile uses at most this many rows: 1.12x faster than the plain scores at 16 rows,
# 1.04-1.12x slower at 32 and 1.35x at 48 (with P @ V transposed too they win at 32 rows as well)
TRANSPOSED_MAX_ROWS = 16
# v_from_ring where a split has at least this many steps (64 and 256 steps faster, 4 slower)
PV_REGISTERS_MIN_STEPS = 32
# q_in_kernel where the batch has at most this many query tokens (1.02-1.07x at 1-8 requests; 0.97x, within noise,
# at 128 tokens)
Q_IN_KERNEL_MAX_TOKENS = 32


def heuristic_config(config: MLAConfig, num_tokens: int, max_blocks: int, num_reqs: int | None = None,
                     num_sms: int = NUM_SMS_H200, max_query_len: int | None = None) -> MosaicConfig:
    """The tuning for a problem: the split count with the least modelled time (waves of CTAs, one CTA an SM since
    q and two KV stages fill its shared memory, x the longest split's steps and a CTA's fixed cost, plus the
    combine of the fp32 partials; splits of one 64-token step allowed), and the code path by the rows of a tile in
    use. With max_query_len the CTA count is the grid's (requests x query tiles x head tiles); without, a bound
    from the token and request counts."""
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
    # the rows of a tile in use (without max_query_len: one token a request where num_tokens <= num_reqs)
    q_len = max_query_len if max_query_len is not None else 1 if num_tokens <= num_reqs else tpt
    rows = hp * min(tpt, max(1, q_len))
    steps_per_split = -(-max_steps // num_splits)
    fp8 = config.is_fp8_kv_cache
    # fp8: each warpgroup its own half of a split's steps at 16 rows where a split has two steps or more (1.19-1.20x
    # at H16 B128 / B32 S16384, 1.07x at B8 S4096; 1.03x slower with 16 splits of one step), and at 32 rows (where
    # only v_from_ring fits) where a split has 32 steps or more (1.06-1.58x; 1.09-1.58x slower with 4-16 steps)
    kv_halves = fp8 and (rows == TRANSPOSED_PV_ROWS[0] and steps_per_split >= NUM_COMPUTE_WGS
                         or rows == TRANSPOSED_PV_ROWS[1] and steps_per_split >= PV_REGISTERS_MIN_STEPS)
    # P @ V transposed with the scores at 16 and 32 rows (1.03-1.13x over transposed scores alone); with an fp8 cache
    # at 32 rows only on the warpgroup-halves path (the one-chain fused path is 1.01-1.06x faster there)
    transposed_pv = rows in TRANSPOSED_PV_ROWS and (not fp8 or rows == TRANSPOSED_PV_ROWS[0] or kv_halves)
    # a request's head tiles launched together wherever there are several and the requests x query tiles fit CUDA's
    # z axis (1.06-1.11x at H = 128: the second head tile reads each KV step from L2)
    heads_fastest = (heads // hp > 1
                     and num_slots_bound(num_reqs, num_reqs * num_splits) * (tpt if q_tiles is None else q_tiles)
                     <= MAX_GRID_YZ)
    # V^T from the fp8 ring in registers where a split has 32 steps or more (1.07x at H16 B128 S16384, 1.12x slower
    # at 4 steps a split); one P @ V chunk in flight at 32 rows (registers bind there), four at 16
    pv_registers = kv_halves and steps_per_split >= PV_REGISTERS_MIN_STEPS  # (at 32 rows: always)
    pv_wait = 1 if pv_registers and rows == TRANSPOSED_PV_ROWS[1] else 4
    # two tokens a ring row at 16 rows (1.01-1.02x on the H100; 0.93x at 32 rows, more spills)
    pair_ring = pv_registers and rows == TRANSPOSED_PV_ROWS[0] and pair_ring_fits(config.page_size)
    transposed_scores = rows <= TRANSPOSED_MAX_ROWS or transposed_pv
    return MosaicConfig(num_splits=num_splits,
                        launch_order="heads_first" if heads_fastest else "requests_first",
                        transpose="scores_and_pv" if transposed_pv else "scores" if transposed_scores else "none",
                        warpgroup_halves=kv_halves, v_from_ring=pv_registers, pv_in_flight=pv_wait,
                        ring_pairs=pair_ring, q_in_kernel=fp8 and num_tokens <= Q_IN_KERNEL_MAX_TOKENS)


def supported_page_size(page_size: int, block_kv: int = 64) -> bool:
    if page_size >= block_kv:
        return page_size % block_kv == 0
    return page_size % 8 == 0 and block_kv % page_size == 0


def unsupported_reason(config: MLAConfig, device=None) -> str | None:
    """Why this kernel cannot run `config` (on `device`, when given); None when it can."""
    check_config(config)
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


def _kernel_heads(num_heads: int) -> int:
    """Heads the kernel runs: 8, 16, 32 or a multiple of 64 (q is padded to it otherwise)."""
    if num_heads <= BLOCK_H:
        return max(8, 1 << (num_heads - 1).bit_length())
    return -(-num_heads // BLOCK_H) * BLOCK_H


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
    """Where q_in_kernel runs: an fp8 cache and a bf16 q, compiled."""
    return bool(fp8 and tuning.q_in_kernel and jnp.dtype(q_dtype) == jnp.bfloat16 and not interpret)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The kernel's decided paths and geometry (make_plan): what _build_kernel builds, and the constants every
    building block reads. The path flags are MosaicConfig's where they run for the problem: kv_halves is
    warpgroup_halves, pv_registers v_from_ring (with zero_tail and load_ahead), pv_wait pv_in_flight, pair_ring
    ring_pairs, q_bits q_in_kernel, transposed_pv transpose="scores_and_pv" and score_rows > 0 a transposed layout."""

    # the problem and the tile
    dtype: object  # q's and the wgmma operands' dtype (float16 with an fp8 cache)
    stage_dtype: object  # the output stage's dtype: float32 partials with slot_out, else the output's
    page_size: int
    num_tokens: int
    out_dtype: object  # the output's dtype
    slot_out: bool  # the CTA is a piece of the work schedule: fp32 partials to its slot (combine_slots merges them)
    direct_single: bool  # (slot_out) a request's only piece writes out and lse directly (its slot is not read)
    hp: int  # heads a tile row group (min(heads, 64))
    tpt: int  # query tokens a tile
    q_rows: int  # rows of q in shared memory (score_rows or 64)
    q_toks: int  # tokens of q loaded a tile
    scale_log2: float  # softmax_scale * log2(e)
    interpret: bool
    # the ring
    block_kv: int
    stages: int
    bt_chunk: int
    pages_per_step: int
    steps_per_page: int
    producer_wg: int  # the compute warpgroup that issues the TMAs
    transforms: tuple  # q's, the ring's and P's tiling and swizzle
    # the paths
    score_rows: int  # the rows in use where the scores are transposed, else 0
    transposed_pv: bool
    fp8: bool
    fused_dequant: bool  # fp8, plain scores: warpgroup 0 converts inside its scores
    overlap_dequant: bool  # fp8, transposed scores: the next step converts under this step's P @ V
    deq_layout: object  # the fp8 chunks' register layout (WGMMA_8BIT)
    q_bits: bool
    qk_permuted: bool
    pv_registers: bool
    zero_tail: bool
    load_ahead: bool
    pv_wait: int
    pair_ring: bool
    sums_row: int  # the row of x_smem with the row sums


def make_plan(*, dtype, page_size: int, num_tokens: int, heads: int, hp: int, num_h_tiles: int, q_tiles: int,
                  num_reqs: int, bt_chunk: int, scale_log2: float, slot_out: bool = False,
                  direct_single: bool = False, score_rows: int = 0,
                  fp8: bool = False, transposed_pv: bool = False, heads_fastest: bool = False,
                  kv_halves: bool = False, pv_registers: bool = False, pv_wait: int = 4, q_bits: bool = False,
                  pair_ring: bool = False, out_dtype=None, interpret: bool = False):
    """The decided paths of the kernel for `heads` query heads, checked (ValueError naming the value).

    score_rows > 0 (a multiple of hp below 64): the tile's rows in use, whose scores warpgroup 0 computes
    transposed; q holds only those rows. transposed_pv: P @ V transposed too (16 or 32 rows). kv_halves: the
    warpgroup-halves path (an fp8 cache, transposed_pv; compiled with q's columns permuted by QK_PERM, the
    caller's). pv_registers: v_from_ring (kv_halves, compiled: V^T from the fp8 ring, two slots a warpgroup, each
    chunk's loads a chunk ahead, the masked step's tail zeroed in the ring; the output's columns permuted by PV_PERM,
    the caller undoes it); pv_wait: its P @ V chunks in flight. pair_ring: ring_pairs (with pv_registers; pages of a
    multiple of 16 rows): kv_cache comes as [N, P / 2, 1152]. q_bits: q_in_kernel (an fp8 cache, compiled): q is
    bfloat16, converted to f16 in shared memory by the warpgroups that read it. fp8: the cache is float8_e4m3fn,
    converted to `dtype` (float16) by the compute warpgroups: fused into warpgroup 0's scores with plain scores,
    overlapped with the previous step's P @ V with transposed scores of at most OVERLAP_MAX_ROWS rows; the per-tensor
    k_scale (info word 3, float32 bits) scales the scores and the output. out_dtype: the final output's dtype
    (default `dtype`). slot_out: each CTA is a piece of the work schedule and writes fp32 partials to its slot;
    direct_single (with slot_out; not with pv_registers, whose columns come out permuted): a request's only piece
    writes out and lse directly instead.
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
    if direct_single and not slot_out:
        raise ValueError(f"direct_single chooses between out and a slot: it needs slot_out=True, got {slot_out=}")
    if direct_single and pv_registers:
        raise ValueError("direct_single writes out's columns as the kernel holds them; pv_registers permutes them "
                         f"(the combine puts them back): got {direct_single=}, {pv_registers=}")
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
    sums_row = 1  # the row of x_smem with warpgroup 0's row sums
    # the registers' layout of an fp8 chunk: WGMMA_8BIT (4 fp8 values a thread and load)
    deq_layout = plgpu.Layout.WGMMA_8BIT
    # wgmma needs one swizzle for both operands: P is [64, block_kv], so every operand (Q, the KV ring, P) is tiled
    # (8, 64) with a 128-byte swizzle.
    p_cols = block_kv
    transforms = (plgpu.TilingTransform((8, p_cols)), plgpu.SwizzleTransform(p_cols * 2))
    stage_dtype = jnp.float32 if slot_out else out_dtype

    return Plan(block_kv=block_kv, bt_chunk=bt_chunk, deq_layout=deq_layout, dtype=dtype, fp8=fp8,
                fused_dequant=fused_dequant, hp=hp, interpret=interpret, load_ahead=load_ahead,
                direct_single=direct_single, num_tokens=num_tokens, out_dtype=out_dtype, slot_out=slot_out,
                overlap_dequant=overlap_dequant, page_size=page_size,
                pages_per_step=pages_per_step, pair_ring=pair_ring, producer_wg=producer_wg, pv_registers=pv_registers,
                pv_wait=pv_wait, q_bits=q_bits, q_rows=q_rows, q_toks=q_toks, qk_permuted=qk_permuted,
                scale_log2=scale_log2, score_rows=score_rows, stage_dtype=stage_dtype,
                stages=stages, steps_per_page=steps_per_page, sums_row=sums_row, tpt=tpt, transforms=transforms,
                transposed_pv=transposed_pv, zero_tail=zero_tail)
