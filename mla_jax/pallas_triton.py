"""Paged MLA decode as a Pallas kernel with the Triton lowering (portable GPUs).

A program computes, for a tile of `block_q` query tokens of one request times `block_h`
query heads (M = block_q * block_h rows), the attention over a range of the request's KV
steps. It streams `block_kv` cache rows per step straight out of the paged cache, through
the block table, and keeps an online softmax in float32:

    s   = softmax_scale * (q_nope @ kv_c.T + q_pe @ k_pe.T)     [M, block_kv]
    acc = sum_kv softmax(s) @ kv_c                              [M, kv_lora_rank]

All M rows share each KV load: several heads (and, for speculative decode, several
query tokens of the same request) per page read, which is the point of MLA decode.
The 512 (kv_c) and 64 (k_pe) parts are loaded and multiplied apart: the Triton
lowering only takes power-of-two array sizes, and 576 is not one.

Work layout: the split-KV schedule of mla_jax.schedule (FlashMLA's get_mla_metadata).
Inside the jitted call, `mla_schedule` turns the traced seq_lens and query lengths into a
table of `num_parts` parts: the steps of all requests, request after request, cut into
num_parts ranges of equal cost (steps plus a fixed overhead per piece). The grid is
(query tiles x head blocks, num_parts); program (tile, p) reads row p of the table and walks
its pieces, two nested dynamic loops: for each request r from BEGIN_REQ to END_REQ, its
steps of the part (cut at multiples of chunk_steps in chunk mode), the online softmax over
them, and the piece's partial (out normalized over the piece in float32, and its lse)
written to the piece's slot of [num_slots, max_query_len, H, L]. `combine.combine_slots` merges each
request's slots by LSE into out (q's dtype) and lse (natural log); a request without slots
(seq_len 0 or q_len 0: padding) gives out 0, lse -inf. The table and the buffers take their
shapes from the number of requests, the tokens, the block table's width and the static
tuning, never from the lengths: new lengths reuse the compiled call. `with_schedule` builds
the schedule ahead instead, once a batch (as FA3's scheduler_metadata and FlashMLA's
get_mla_metadata are built once a decode step and shared by every layer), into
metadata.scheduler_metadata, where the call finds it: the few dozen small XLA ops of the
construction (tens of microseconds on the GPU, more than the kernel on small batches) then
run once a batch, not once a layer. Both paths build it with the same function (`_schedule`).

Why parts and not one program per request split: a ragged batch (one long request among
short ones) with a split count per request leaves the long request's programs running long
after the others finish. Parts have equal cost whatever the lengths (within the fixed
overhead of a piece: mla_jax.schedule's balance bound), so the programs finish together.
The grid is sized by parts, not by slots: a program per slot would run one piece each,
and pieces are as unequal as the requests (a short request is one short piece), so the
balance would be lost; the balance lives in the part, a list of pieces of equal total cost.

Paging: KV position p of request r is row `p % page_size` of page
`block_table[r, p // page_size]`. The kernel gathers each row by (page, slot), so
any page size >= 1 works (1, 3, 16, 48, 64, ...), and `block_kv` is independent of
the page size. Rows past the KV range are masked out of the load itself (they read
as 0, so NaN garbage in unused slots never reaches `p @ kv_c`), and block-table
entries past a request's last page are never read (the page index is clamped).

Causality (q_len > 1): query token i of a request sits at position
pos = seq_len - q_len + i and attends KV positions <= pos (bottom-right causal); masked
scores are set with a `where`. A piece whose positions a token does not see gives that
token's partial lse = -inf and out 0 (zero weight in the combine); steps that no row of the
tile sees are skipped.

FP8 KV cache (kv_cache_dtype="fp8_e4m3"): the cache is float8_e4m3fn and real values are
`fp8 value * k_scale` (one float32 scale, an input of the kernel: a new scale does not
recompile). The kernel loads fp8 rows (half the bytes of bf16) and converts them to q's dtype
for the dots; the conversion is exact (every e4m3 value is a bf16 and an fp16 value). The
scale is never applied to the rows: it is folded into the score scale,
s = softmax_scale * k_scale * (q . kv), and into the output, out = k_scale * (p @ kv_c) / l.
Compiled on a GPU, fp8 tiles of 64 rows x 64 KV rows do not fit Triton's shared memory on the H200
(RESOURCE_EXHAUSTED, see FP8_GPU_MAX_ROWS), so fp8_gpu_reason refuses tiles with
block_q * block_h * block_kv > 32 * 64, and the heuristic uses head blocks of up to 32 rows with an fp8
cache (H = 128: 4 head blocks), so every head count runs compiled.

Batch-invariant mode (config.batch_invariant): the schedule's chunk mode. Each request's
steps are cut at multiples of INVARIANT_CHUNK_STEPS of its own steps, whatever else is in the
batch; parts take whole chunks, so a chunk's partial is the same in every batch and every part
count. With block_q = 1 (a query tile that depends on the batch would change the rows that
share a program) and block_h, block_kv, num_warps and num_stages from the config alone, and
the slots of a request merged in slot order, a request's out and lse are bitwise the same in
any batch. A given tuning with chunk_steps 0 or block_q > 1 is refused.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from mla_jax import combine
from mla_jax.combine import _next_pow2
from mla_jax.schedule import (BEGIN_REQ, BEGIN_STEP, END_REQ, END_STEP, FIRST_SLOT, NUM_STEPS, TABLE_COLUMNS,
                              Schedule, mla_schedule, prebuilt_or_build)
from mla_spec import DecodeMetadata, MLAConfig, check_config_and_metadata
from mla_spec.config import check_config

NUM_SMS_H200 = 132
"""Streaming multiprocessors on the H200 (and H100 SXM): the occupancy target of the heuristic."""

MAX_ROWS = 64
"""Upper bound the heuristic puts on M = block_q * block_h: the float32 accumulator is
M x kv_lora_rank, and 64 x 512 already takes half of the register file of an SM."""

INVARIANT_CHUNK_STEPS = 16
"""Batch-invariant mode's chunk: a request's pieces are its steps cut at multiples of 16 (2048 KV positions at
block_kv 128), whatever else is in the batch."""

_NEG_BIG = -1e30  # finite start value of the running max, so that exp2(m_old - m_new) never sees inf - inf
_LN2 = math.log(2.0)
_LOG2E = math.log2(math.e)
_SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")


def _is_pow2(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1 and (x & (x - 1)) == 0


def _cdiv(a, b):
    return (a + b - 1) // b


@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """Tuning of the Pallas Triton kernel (static under jit).

    block_h: query heads per program (power of two; heads past num_heads are masked).
    block_kv: KV tokens per inner step (power of two, >= 16: Triton's dot needs 16); the
        schedule's step.
    num_parts: parts of the schedule (mla_jax.schedule), >= 1: the grid has num_parts programs
        per query tile and head block, each walking one part's pieces.
    chunk_steps: 0 for the balanced schedule (cuts anywhere, equal shares); >= 1 for chunk mode,
        pieces cut at multiples of chunk_steps steps of each request (batch-invariant mode needs it).
    num_warps, num_stages: Triton compiler parameters.
    block_q: query tokens of one request per program (power of two). Tokens of one
        request share each KV load; rows per program are M = block_q * block_h,
        which must be >= 16 (Triton's dot).
    """

    block_h: int = 16
    block_kv: int = 64
    num_parts: int = NUM_SMS_H200
    chunk_steps: int = 0
    num_warps: int = 4
    num_stages: int = 2
    block_q: int = 1

    def __post_init__(self):
        for name in ("block_h", "block_kv", "block_q"):
            value = getattr(self, name)
            if not _is_pow2(value):
                raise ValueError(f"{name} must be a power of two >= 1, got {name}={value!r}")
        block_kv, block_h, block_q = self.block_kv, self.block_h, self.block_q
        if block_kv < 16:
            raise ValueError(f"block_kv must be >= 16 (Triton's dot), got {block_kv=}")
        if block_h * block_q < 16:
            raise ValueError(
                f"block_h * block_q must be >= 16 rows (Triton's dot), got {block_h=}, {block_q=}"
            )
        for name, lo in (("num_parts", 1), ("chunk_steps", 0), ("num_stages", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {name}={value!r}")
        num_warps = self.num_warps
        if isinstance(num_warps, bool) or not isinstance(num_warps, int) or num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {num_warps=}")

    @property
    def rows(self) -> int:
        """M, the query rows (tokens x heads) of one program."""
        return self.block_q * self.block_h


def heuristic_config(
    config: MLAConfig,
    num_tokens: int,
    max_blocks: int,
    *,
    max_query_len: int = 1,
    num_reqs: int | None = None,
    max_num_splits: int = 0,
    num_sms: int = NUM_SMS_H200,
) -> TritonConfig:
    """Picks a TritonConfig from the problem shape.

    num_tokens: T; max_blocks: the block table's width (max KV length ~ max_blocks *
    page_size); max_query_len: tokens of one request are grouped (block_q).
    num_tokens and num_reqs do not change the pick: the schedule balances whatever batch runs.
    max_num_splits > 0 (metadata.max_num_splits) bounds the pieces of each request: chunk mode
    with chunk_steps = ceil(max steps / max_num_splits).
    With config.batch_invariant: block_q = 1 and chunk mode with INVARIANT_CHUNK_STEPS, whatever
    the batch.
    With an fp8 cache: tiles of at most FP8_GPU_MAX_ROWS (32) rows, which fit the shared memory
    with block_kv 64 (fp8_gpu_reason): block_h = all heads up to 32 (H = 128: 4 head blocks of
    32 rows), block_q * block_h <= 32.

    - block_h: all heads up to 64 (num_heads rounded up to a power of two, at least 16); up to
      32 with an fp8 cache.
    - block_q: the query tokens of a request, as long as block_q * block_h <= MAX_ROWS
      (FP8_GPU_MAX_ROWS with an fp8 cache).
    - num_parts: one program per SM: num_sms // (query tiles x head blocks), at least 1. The
      tiles it picks take 255 registers a thread and 104-224 KiB of shared memory (sm_90, by
      tools/triton_sass.py): one program an SM, except the 32-row bf16 tiles (4 warps, 112 KiB),
      which leave room for two (tools/sweep.py's num_parts=x2 times that).
    - block_kv / num_stages / num_warps from a sweep on the H200: M = 16: 128 / 2 / 4
      (the biggest loads in flight: 3.6 TB/s vs 2.7 at block_kv 64); M = 32: 64 / 3 / 4
      (1.4x over 2 stages); M = 64: 64 / 2 / 8 (1.35x over block_kv 32; 128 exceeds
      shared memory, 4 warps spill the 64 x 512 float32 accumulator). fp8: 8 warps at every M (the
      converted tile spills at 4).
    """
    del num_tokens, num_reqs  # the schedule balances whatever batch runs
    max_query_len = max(1, int(max_query_len))
    # fp8: M <= 32 rows (64 x 64-row KV steps exceed the shared memory: fp8_gpu_reason)
    max_rows = FP8_GPU_MAX_ROWS if config.is_fp8_kv_cache else MAX_ROWS
    block_h = min(max(_next_pow2(config.num_heads), 16), max_rows)
    block_q = max(1, min(_next_pow2(max_query_len), max_rows // block_h))
    if config.batch_invariant:
        block_q = 1  # tokens of a request never share a tile whose size depends on the batch
    rows = block_q * block_h
    head_blocks = _cdiv(config.num_heads, block_h)
    q_tiles = _cdiv(max_query_len, block_q)
    block_kv = 128 if rows <= 16 else 64
    # fp8: 8 warps (H200, H16 B128 S16384: 1470 us against 4190 with 4; the converted tile and the
    # accumulator spill at 4: ncu shows 255 registers a thread and local-memory traffic)
    num_warps = 4 if rows <= 32 and not config.is_fp8_kv_cache else 8
    num_stages = 3 if rows == 32 else 2
    if config.dtype == "float32":  # 4-byte tiles: smaller KV steps (the 16-bit ones exceed shared memory on the H200)
        block_kv, num_stages = (64 if rows <= 32 else 32), 2
    num_parts = max(1, num_sms // (q_tiles * head_blocks))
    chunk_steps = 0
    if config.batch_invariant:
        chunk_steps = INVARIANT_CHUNK_STEPS  # cuts that depend on the request alone
    elif max_num_splits > 0:
        max_steps = _cdiv(max(1, max_blocks) * config.page_size, block_kv)
        chunk_steps = _cdiv(max_steps, max_num_splits)
    return TritonConfig(
        block_h=block_h, block_kv=block_kv, num_parts=num_parts, chunk_steps=chunk_steps, num_warps=num_warps,
        num_stages=num_stages, block_q=block_q,
    )


def unsupported_reason(config: MLAConfig, device=None) -> str | None:
    """None if the kernel runs `config` (on `device`, or in interpret mode / on the
    current GPU when device is None); otherwise why not."""
    check_config(config)
    L, R = config.kv_lora_rank, config.qk_rope_head_dim
    if not _is_pow2(L) or L < 16:
        return f"kv_lora_rank must be a power of two >= 16 for the Triton lowering, got kv_lora_rank={L}"
    if not _is_pow2(R) or R < 16:
        return f"qk_rope_head_dim must be a power of two >= 16 for the Triton lowering, got qk_rope_head_dim={R}"
    if config.dtype not in _SUPPORTED_DTYPES:
        return f"dtype={config.dtype!r} is not supported; expected one of {_SUPPORTED_DTYPES}"
    if device is not None:
        platform = getattr(device, "platform", None)
        if platform != "gpu":
            return f"device {device} has platform={platform!r}; the Triton lowering needs a GPU (interpret mode aside)"
        cc = getattr(device, "compute_capability", None)  # "9.0" on CUDA; "gfx..." on ROCm
        try:
            major = int(str(cc).split(".")[0])
        except ValueError:
            major = None
        if major is not None and major < 8 and config.dtype == "bfloat16":
            return f"bfloat16 dots need compute capability >= 8.0 (Ampere), got compute_capability={cc!r}"
        if major is not None and config.is_fp8_kv_cache:
            minor = str(cc).split(".")[1] if "." in str(cc) else "0"
            if (major, int(minor) if minor.isdigit() else 0) < (8, 9):
                return (
                    f"an fp8 KV cache (kv_cache_dtype={config.kv_cache_dtype!r}) needs float8_e4m3fn conversions, "
                    f"compute capability >= 8.9, got compute_capability={cc!r}"
                )
    return None


def _mla_decode_kernel(
    # inputs
    table_ref,  # [num_parts * 8] int32: the schedule's table (mla_jax.schedule), row after row
    qsl_ref,  # [R+1] int32 query_start_loc
    seq_lens_ref,  # [R] int32, clamped to the block table (and max_seq_len)
    block_table_ref,  # [R * max_blocks] int32 (flattened)
    q_nope_ref,  # [T, H, L] (or the packed q [T, H, L + Rr])
    q_pe_ref,  # [T, H, Rr] (or the packed q again, read from column rope_offset = L)
    kv_cache_ref,  # [num_blocks, P, L + Rr] (q's dtype, or float8_e4m3fn)
    k_scale_ref,  # [1] float32, the fp8 cache's scale (read only for an fp8 cache)
    # outputs
    o_ref,  # [num_slots, max_query_len, H, L] float32: each piece's out, normalized over its KV steps
    lse_ref,  # [num_slots, max_query_len, H] float32: each piece's lse (natural log)
    *,
    num_heads: int,
    page_size: int,
    max_blocks: int,
    kv_lora_rank: int,
    rope_dim: int,
    softmax_scale: float,
    fp8: bool,
    tuning: TritonConfig,
    rope_offset: int = 0,
):
    L, Rr, P = kv_lora_rank, rope_dim, page_size
    block_h, block_q, block_kv, chunk = tuning.block_h, tuning.block_q, tuning.block_kv, tuning.chunk_steps
    M = block_q * block_h
    head_blocks = _cdiv(num_heads, block_h)
    num_slots, max_q = o_ref.shape[0], o_ref.shape[1]
    num_tokens, num_blocks = q_nope_ref.shape[0], kv_cache_ref.shape[0]

    tile = pl.program_id(0)  # query tile x head block: fastest, so programs that read the same KV run side by side
    part = pl.program_id(1)
    q_tile = tile // head_blocks
    head_block = tile % head_blocks
    row = part * TABLE_COLUMNS
    begin_req, begin_step = table_ref[row + BEGIN_REQ], table_ref[row + BEGIN_STEP]
    end_req, end_step = table_ref[row + END_REQ], table_ref[row + END_STEP]
    # An empty part (NUM_STEPS 0) walks no request.
    last_req = jnp.where(table_ref[row + NUM_STEPS] > 0, end_req, begin_req - 1)

    # Row m of the program: query token i = m // block_h of the tile, head j = m % block_h.
    m_idx = lax.broadcasted_iota(jnp.int32, (M,), 0)
    qi = q_tile * block_q + lax.div(m_idx, block_h)  # query index within the request
    head = head_block * block_h + lax.rem(m_idx, block_h)
    col_l = lax.broadcasted_iota(jnp.int32, (1, L), 1)
    col_r = lax.broadcasted_iota(jnp.int32, (1, Rr), 1)
    kv_iota = lax.broadcasted_iota(jnp.int32, (block_kv,), 0)

    kv_dtype = q_nope_ref.dtype  # the dots' operand dtype (an fp8 cache is converted to it)
    precision = lax.Precision.HIGHEST if kv_dtype == jnp.float32 else None
    qk_scale = softmax_scale * _LOG2E  # scores in log2 units: exp2 instead of exp
    if fp8:
        k_scale = k_scale_ref[0]
        qk_scale = qk_scale * k_scale  # s = softmax_scale * k_scale * (q . kv_fp8)
    # The value of masked-out cache rows: the Triton lowering casts an int `other` to the
    # cache dtype, and has no int -> float8 cast; a float 0 goes through fp_to_fp.
    kv_zero = 0.0 if fp8 else 0

    def request(r, slot):
        """Request r's pieces in this part: steps [lo, hi) of r, one piece (chunk mode: one a chunk)."""
        q_start = qsl_ref[r]
        q_len = qsl_ref[r + 1] - q_start
        # Metadata traced under jit is not validated (its values are not known there): bad values give a wrong
        # answer, never an out-of-bounds access. seq_len arrives clamped to what the block table holds (so the
        # table's entries read stay in this request's row), page ids are clamped to the cache (below), rows whose
        # token is outside q or the partial buffer are masked, and the table's slots are bounded by num_slots.
        seq_len = seq_lens_ref[r]
        steps = jnp.where((seq_len > 0) & (q_len > 0), _cdiv(seq_len, block_kv), 0)  # schedule.request_steps
        lo = jnp.where(r == begin_req, begin_step, 0)
        hi = jnp.where(r == end_req, end_step, steps)
        tok = q_start + qi
        row_ok = (qi < q_len) & (qi < max_q) & (head < num_heads) & (tok >= 0) & (tok < num_tokens)
        # Position of each row's token; -1 for padding rows (they attend nothing).
        row_pos = jnp.where(row_ok, seq_len - q_len + qi, -1)
        # One past the last position any row of the tile attends (bottom-right causal); 0 past the request's tokens.
        tile_rows = jnp.minimum(q_len - q_tile * block_q, block_q)
        tile_end = jnp.where(tile_rows > 0, seq_len - q_len + q_tile * block_q + tile_rows, 0)
        # q rows: gathered by (token, head); padding rows read as 0.
        q_nope = plgpu_triton.load(
            q_nope_ref.at[tok[:, None], head[:, None], col_l], mask=row_ok[:, None], other=0
        )  # [M, L]
        q_pe = plgpu_triton.load(
            q_pe_ref.at[tok[:, None], head[:, None], rope_offset + col_r], mask=row_ok[:, None], other=0
        )  # [M, Rr]
        last_page = lax.div(jnp.maximum(seq_len - 1, 0), P)
        bt_row = r * max_blocks

        def kv_step(step, carry, kv_lo, kv_hi):
            acc, m_i, l_i = carry
            kv_pos = kv_lo + step * block_kv + kv_iota  # [block_kv]
            kv_ok = kv_pos < kv_hi
            # Page of each KV row; clamped so padding entries of the block table are never read.
            page_col = jnp.minimum(lax.div(kv_pos, P), last_page)
            page = plgpu_triton.load(block_table_ref.at[bt_row + page_col], mask=kv_ok, other=0)
            page = jnp.clip(page, 0, num_blocks - 1)  # a bad id (traced metadata) reads a valid page, not out of bounds
            slot_in_page = lax.rem(kv_pos, P)
            # Rows outside the KV range are not loaded: they read as 0, so NaN in unused
            # slots cannot leak through p @ kv_c (0 * NaN = NaN).
            kv_c = plgpu_triton.load(
                kv_cache_ref.at[page[:, None], slot_in_page[:, None], col_l], mask=kv_ok[:, None], other=kv_zero
            )  # [block_kv, L]
            k_pe = plgpu_triton.load(
                kv_cache_ref.at[page[:, None], slot_in_page[:, None], L + col_r], mask=kv_ok[:, None], other=kv_zero
            )  # [block_kv, Rr]
            if fp8:  # exact: every float8_e4m3fn value is a bf16 / fp16 value; k_scale is applied outside
                kv_c = kv_c.astype(kv_dtype)
                k_pe = k_pe.astype(kv_dtype)
            s = plgpu_triton.dot(q_nope, kv_c, trans_b=True, precision=precision)
            s += plgpu_triton.dot(q_pe, k_pe, trans_b=True, precision=precision)
            s *= qk_scale  # [M, block_kv] float32, log2 units
            visible = kv_ok[None, :] & (kv_pos[None, :] <= row_pos[:, None])
            s = jnp.where(visible, s, -jnp.inf)
            m_new = jnp.maximum(m_i, jnp.max(s, axis=1))  # finite: m_i starts at _NEG_BIG
            alpha = jnp.exp2(m_i - m_new)
            p = jnp.exp2(s - m_new[:, None])  # 0 where masked
            l_new = l_i * alpha + jnp.sum(p, axis=1)
            acc = acc * alpha[:, None] + plgpu_triton.dot(p.astype(kv_dtype), kv_c, precision=precision)
            return acc, m_new, l_new

        def piece(j, slot):
            """The j-th piece: steps [p_lo, p_hi) of r, online softmax, partial written to `slot`."""
            if chunk:  # cut at multiples of chunk_steps of the request's own steps
                first_chunk = lo // chunk
                p_lo = jnp.maximum(lo, (first_chunk + j) * chunk)
                p_hi = jnp.minimum(hi, (first_chunk + j + 1) * chunk)
            else:
                p_lo, p_hi = lo, hi
            kv_lo = p_lo * block_kv
            kv_hi = jnp.minimum(p_hi * block_kv, tile_end)  # steps no row of the tile attends are skipped
            num_iters = lax.div(jnp.maximum(kv_hi - kv_lo, 0) + (block_kv - 1), block_kv)
            carry = (jnp.zeros((M, L), jnp.float32), jnp.full((M,), _NEG_BIG, jnp.float32),
                     jnp.zeros((M,), jnp.float32))
            acc, m_i, l_i = lax.fori_loop(0, num_iters, functools.partial(kv_step, kv_lo=kv_lo, kv_hi=kv_hi), carry)
            # Rows that see none of the piece's positions (causal, a padding row: l = 0) get out = 0 and
            # lse = -inf, so that the combine gives them zero weight. A NaN that a row reads (l NaN) stays in its
            # out and lse, and the combine makes that token NaN rather than drop the piece.
            empty = l_i == 0
            inv_l = jnp.where(empty, 0.0, 1.0 / jnp.where(empty, 1.0, l_i))
            if fp8:
                inv_l = inv_l * k_scale  # out = k_scale * (p @ kv_c_fp8) / l
            out = acc * inv_l[:, None]
            lse = jnp.where(empty, -jnp.inf, (m_i + jnp.log2(jnp.where(empty, 1.0, l_i))) * _LN2)
            ok = row_ok & (slot < num_slots)
            plgpu_triton.store(o_ref.at[slot, qi[:, None], head[:, None], col_l], out, mask=ok[:, None])
            plgpu_triton.store(lse_ref.at[slot, qi, head], lse, mask=ok)
            return slot + 1

        if chunk:
            num_pieces = jnp.where(lo < hi, _cdiv(hi, chunk) - lo // chunk, 0)
        else:
            num_pieces = (lo < hi).astype(jnp.int32)
        return lax.fori_loop(0, num_pieces, piece, slot)

    lax.fori_loop(begin_req, last_req + 1, request, table_ref[row + FIRST_SLOT])


def _max_seq_len(metadata: DecodeMetadata, config: MLAConfig) -> int:
    """The bound on the lengths the schedule and the kernel see: max_seq_len, or what the block table holds."""
    return min(metadata.max_seq_len, metadata.block_table.shape[1] * config.page_size)


def _kernel_seq_lens(metadata: DecodeMetadata, config: MLAConfig):
    """The lengths the schedule and the kernel see: seq_lens clamped to [0, _max_seq_len]. Every valid seq_len is
    within; clamping keeps a bad traced one inside the block table's row, and the schedule and the kernel see the
    same lengths (so its steps and slots stay inside the buffers)."""
    return jnp.clip(metadata.seq_lens.astype(jnp.int32), 0, _max_seq_len(metadata, config))


def _schedule(metadata: DecodeMetadata, config: MLAConfig, tuning: TritonConfig, num_tokens: int) -> Schedule:
    """The work schedule the kernel walks for `tuning`, from the batch's (traced) lengths (mla_jax.schedule): parts
    of tuning.block_kv steps, chunk mode with tuning.chunk_steps (batch-invariant mode, metadata.max_num_splits),
    its slots sized by the clamped max_seq_len, with the combine's token_slots for num_tokens tokens. The one
    construction behind both the call's inline schedule and with_schedule's."""
    qsl = metadata.query_start_loc.astype(jnp.int32)
    chunk = tuning.chunk_steps
    max_steps = _cdiv(_max_seq_len(metadata, config), tuning.block_kv)
    schedule = mla_schedule(_kernel_seq_lens(metadata, config), qsl[1:] - qsl[:-1], num_parts=tuning.num_parts,
                            block_kv=tuning.block_kv, chunk_steps=chunk or None,
                            max_steps=max_steps if chunk else None)
    return schedule.with_token_slots(qsl, num_tokens)


_schedule_jit = jax.jit(_schedule, static_argnames=("config", "tuning", "num_tokens"))
"""_schedule as one compiled program (per shapes and static arguments; new lengths reuse it): with_schedule's
builder outside a jit, a single launch instead of a few dozen small ones."""


def _resolve_tuning(config: MLAConfig, metadata: DecodeMetadata, num_tokens: int,
                    tuning: TritonConfig | None) -> TritonConfig:
    """The tuning a call runs: the heuristic's for the batch's shapes when None (metadata.max_num_splits > 0: chunk
    mode; batch-invariant mode: INVARIANT_CHUNK_STEPS, block_q 1), else `tuning`, refused (ValueError) if it is
    not a TritonConfig or, with config.batch_invariant, depends on the batch."""
    if tuning is None:
        return heuristic_config(
            config,
            num_tokens=num_tokens,
            max_blocks=metadata.block_table.shape[1],
            max_query_len=metadata.max_query_len,
            num_reqs=metadata.seq_lens.shape[0],
            max_num_splits=metadata.max_num_splits,
        )
    if not isinstance(tuning, TritonConfig):
        raise ValueError(f"tuning must be a TritonConfig or None, got tuning={tuning!r}")
    if config.batch_invariant and (tuning.chunk_steps < 1 or tuning.block_q > 1):
        raise ValueError(
            "batch_invariant=True needs chunk_steps >= 1 and block_q=1 (balanced cuts or a query tile that depend on "
            f"the batch would change a request's bits), got tuning.chunk_steps={tuning.chunk_steps}, "
            f"tuning.block_q={tuning.block_q}"
        )
    return tuning


def with_schedule(metadata: DecodeMetadata, config: MLAConfig, *, num_tokens: int | None = None,
                  tuning: TritonConfig | None = None) -> DecodeMetadata:
    """`metadata` with its work schedule computed ahead in `scheduler_metadata`, as FA3's scheduler_metadata and
    FlashMLA's get_mla_metadata are: once a batch (a decode step), shared by every layer's call, instead of inside
    each call (a few dozen small XLA ops, tens of microseconds on the GPU, more than the kernel on small batches).

    The schedule is the one mla_decode would build for `tuning` (default: the heuristic's for this metadata and
    num_tokens query tokens, default metadata.num_decode_tokens; with metadata.max_num_splits and batch-invariant
    mode as mla_decode applies them), so a call with that tuning gives the same bits either way; a call whose
    tuning runs other parts, steps or chunks raises ValueError. jit-compatible: traced lengths give a traced
    schedule, and new lengths of the same shapes reuse the compiled calls. The metadata's shapes, dtypes and static
    ints are checked (`DecodeMetadata.validate` without its values, which may be traced): ValueError naming them."""
    check_config_and_metadata(config, metadata)
    metadata.validate(config, check_values=False)
    num_tokens = int(metadata.num_decode_tokens) if num_tokens is None else num_tokens
    tuning = _resolve_tuning(config, metadata, num_tokens, tuning)
    return metadata.replace(scheduler_metadata=_schedule_jit(metadata.replace(scheduler_metadata=None), config,
                                                             tuning, num_tokens))


def _mla_decode(q_nope, q_pe, kv_cache, k_scale, metadata: DecodeMetadata, config: MLAConfig, tuning: TritonConfig,
                interpret: bool):
    T, H = q_nope.shape[:2]
    L, Rr = config.kv_lora_rank, config.qk_rope_head_dim
    rope_offset = 0
    if q_pe is None:  # the packed q [T, H, L + Rr]: both refs are q, q_pe read from column L
        q_pe, rope_offset = q_nope, L
    max_blocks = metadata.block_table.shape[1]
    qsl = metadata.query_start_loc.astype(jnp.int32)
    seq_lens = _kernel_seq_lens(metadata, config)
    # (built ahead by with_schedule, once a batch, or here; the kernel cuts pieces by tuning.chunk_steps, so the
    # schedule's must be the same)
    schedule = prebuilt_or_build(metadata, lambda: _schedule_jit(metadata.replace(scheduler_metadata=None), config,
                                                                 tuning, T), num_parts=tuning.num_parts,
                                 block_kv=tuning.block_kv, chunk_steps=tuning.chunk_steps, num_tokens=T)
    max_q = metadata.max_query_len
    q_tiles = _cdiv(max_q, tuning.block_q)
    head_blocks = _cdiv(H, tuning.block_h)
    kernel = functools.partial(
        _mla_decode_kernel,
        num_heads=H,
        page_size=config.page_size,
        max_blocks=max_blocks,
        kv_lora_rank=L,
        rope_dim=Rr,
        softmax_scale=config.softmax_scale,
        fp8=config.is_fp8_kv_cache,
        tuning=tuning,
        rope_offset=rope_offset,
    )
    # No BlockSpecs: every ref is the whole array; the kernel computes its own
    # (gathered) addresses from the schedule and the metadata.
    o_part, lse_part = pl.pallas_call(
        kernel,
        grid=(q_tiles * head_blocks, tuning.num_parts),
        out_shape=(
            jax.ShapeDtypeStruct((schedule.num_slots, max_q, H, L), jnp.float32),
            jax.ShapeDtypeStruct((schedule.num_slots, max_q, H), jnp.float32),
        ),
        compiler_params=plgpu_triton.CompilerParams(num_warps=tuning.num_warps, num_stages=tuning.num_stages),
        interpret=interpret,
        name="mla_decode_paged",
    )(
        schedule.table.reshape(-1),
        qsl,
        seq_lens,
        metadata.block_table.astype(jnp.int32).reshape(-1),
        q_nope,
        q_pe,
        kv_cache,
        jnp.asarray(k_scale, jnp.float32).reshape(1),
    )
    # each token's slots merged in slot order (one Pallas Triton kernel): a request's bits depend on it alone
    return combine.combine_slots(o_part, lse_part, schedule.split_offsets, qsl, q_nope.dtype, num_tokens=T,
                                 token_slots=schedule.token_slots,
                                 interpret=interpret)


def mla_decode(q_nope, q_pe, kv_cache, metadata: DecodeMetadata, config: MLAConfig, *, tuning: TritonConfig | None = None,
               interpret: bool = False, k_scale=1.0):
    """Paged MLA decode with the Pallas Triton kernel.

    q_nope [T, H, L], q_pe [T, H, R] (config.dtype); or q_nope the packed q [T, H, L + R] and
    q_pe None (the kernel reads both parts from it: no slice copies). kv_cache [num_blocks, P, L + R]
    (config.dtype, or float8_e4m3fn with kv_cache_dtype="fp8_e4m3"); metadata with int32 jax
    arrays (inputs already validated by mla_jax.api). k_scale: the fp8 cache's scale, a float or
    a 0-d float32 array, traced under jit (read only for an fp8 cache).
    Returns `(out [T, H, L] in q's dtype, lse [T, H] float32, natural log)`.
    `tuning=None` picks `heuristic_config(...)`; `metadata.max_num_splits > 0` bounds the
    pieces of each request (chunk mode). Works under jax.jit (config and tuning static); the
    schedule is computed from the traced lengths, so new lengths reuse the compiled call.
    A Schedule in `metadata.scheduler_metadata` (with_schedule: built once a batch) is walked
    as it is instead; it must be for this tuning's num_parts, block_kv and chunk_steps
    (ValueError otherwise). `interpret` must be a bool.
    """
    from mla_jax.api import check_interpret

    check_config(config)
    check_interpret(interpret)
    tuning = _resolve_tuning(config, metadata, q_nope.shape[0], tuning)
    if config.is_fp8_kv_cache and not interpret:
        reason = fp8_gpu_reason(tuning)
        if reason is not None:
            raise NotImplementedError(reason)
    return _mla_decode(q_nope, q_pe, kv_cache, k_scale, metadata, config, tuning, interpret)


# fp8 compiled on a GPU (measured on the H200): every fp8 tile of 64 rows with 64-row KV steps stops with
# RESOURCE_EXHAUSTED (shared memory), with 4 or 8 warps; 64 rows with 32- or 16-row steps, and every
# tile of <= 32 rows (4 or 8 warps), run and match the reference. The bf16 kernel runs the same tiles.
FP8_GPU_MAX_ROWS = 32


def fp8_gpu_reason(tuning: TritonConfig) -> str | None:
    """Why this tuning may not run an fp8 cache compiled on a GPU (None: it may)."""
    rows = tuning.block_h * tuning.block_q
    if rows * tuning.block_kv > FP8_GPU_MAX_ROWS * 64:
        return (
            f"fp8 KV cache on a GPU: a tile of block_h * block_q = {rows} rows x block_kv={tuning.block_kv} "
            f"exceeds Triton's shared memory on the H200 (RESOURCE_EXHAUSTED); rows * block_kv must be <= "
            f"{FP8_GPU_MAX_ROWS * 64} (e.g. 32 rows x 64, or 64 rows x 32); the heuristic (tuning=None) keeps fp8 "
            f"to head blocks of at most {FP8_GPU_MAX_ROWS} rows"
        )
    return None


__all__ = ["TritonConfig", "fp8_gpu_reason", "heuristic_config", "mla_decode", "unsupported_reason", "with_schedule"]
