"""Paged MLA decode on Hopper: a Pallas Mosaic GPU (`plgpu`) kernel.

Design (one CTA = one 64-row query tile x one KV split; 3 warpgroups):

* Query tiles. The wgmma M dimension is 64 rows. Heads are padded to `Hp`, a power
  of two <= 64 or a multiple of 64. For `H <= 64`, a tile packs `64 // Hp`
  consecutive query tokens *of one request* x `Hp` heads (row = token * Hp + head);
  for `H >= 64`, one token's heads fill `H // 64` tiles. The tile schedule is
  computed on device from `query_start_loc` (static upper bound on the number of
  tiles), and the wrapper gathers q into `[num_tiles, H // 64 or 1, 64, 576]`.
  Every row of a tile sees the same KV (the request's), with bottom-right causal
  masking per row: row i of a tile whose first token sits at position `first_pos`
  sees KV positions `p <= first_pos + i // Hp`.
* Warp specialization. Warpgroup 2 is the memory warpgroup: it TMA-loads the
  query tile and, per KV step of `block_kv` (64) tokens, the pages of that step
  from `kv_cache.at[page]` (page ids read as scalars from a chunk of the block
  table staged in SMEM) into a `max_concurrent_steps`-deep ring of swizzled SMEM
  stages, signalling `kv_ready[slot]` and waiting `kv_consumed[slot]` before it
  reuses a slot. Warpgroups 0 and 1 compute.
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
* Rows past seq_len. The cache slots past a request's `seq_len` may hold anything
  (NaN in tests). Scores of masked positions are replaced by a finite -1e30 with
  `where` (so NaN scores never propagate), and on the (single) step of a split
  that runs past the tile's KV end, each compute warpgroup zeroes the invalid
  rows of its own V half in SMEM before its P @ V (P = 0 times V = NaN would be
  NaN). Pages past the last page of a request are never fetched: the wrapper
  clamps the block table to the request's last page.
* Split-KV. Grid = (head tiles, num_splits, query tiles). Each split takes a
  contiguous range of KV steps; with num_splits > 1 the kernel writes fp32
  partial outputs and per-split lse, and a jnp combine produces out and lse.
  With num_splits == 1 the kernel writes the final output (in q's dtype) and lse.

SMEM: Q tile 72 KiB + 2 stages x 72 KiB + P 8 KiB + 2 KiB of small buffers =
226 KiB, inside the 227 KiB a Hopper CTA can have (so 2 stages at most).

Interpret mode (`interpret=True`) runs the same kernel on CPU through
`plgpu.force_gpu_interpret_mode`; P is staged through SMEM for the P @ V wgmma,
which both the interpreter and the GPU accept.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from mla_spec import DecodeMetadata, MLAConfig

KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576
BLOCK_H = 64  # wgmma M
NUM_COMPUTE_WGS = 2
V_HALF = KV_LORA_RANK // NUM_COMPUTE_WGS  # 256 latent columns per compute warpgroup
INFO_WORDS = 32  # per-tile int32 metadata row (TMA copies must be multiples of 128 bytes)
SMEM_LIMIT_BYTES = 227 * 1024  # Hopper opt-in shared memory per CTA
SMEM_ALIGNMENT = 1024  # Mosaic GPU aligns each scratch allocation to 1 KiB
NUM_SMS_H200 = 132
MASK_VALUE = -1e30  # finite: a fully masked row stays NaN-free
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
SUPPORTED_DTYPES = ("bfloat16", "float16")


def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Tuning of the Mosaic GPU kernel.

    block_kv: KV tokens per pipeline step (64). Pages larger than block_kv are
        fetched in block_kv-row pieces; smaller pages (8, 16, 32) several per step.
    num_splits: split-KV factor (flash-decoding); 1 writes the output directly.
    max_concurrent_steps: SMEM stages of the KV ring (the memory warpgroup runs
        up to this many steps ahead). Q (72 KiB) + 2 stages (144 KiB) fill the 227 KiB.
    block_h: rows of a query tile (the wgmma M dimension); only 64.
    bt_chunk: block-table entries staged in SMEM at a time (multiple of 32).
    """

    block_kv: int = 64
    num_splits: int = 1
    max_concurrent_steps: int = 2
    block_h: int = BLOCK_H
    bt_chunk: int = 224

    def __post_init__(self):
        for name in ("block_kv", "num_splits", "max_concurrent_steps", "block_h", "bt_chunk"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"{name} must be an int, got {name}={x!r}")
        block_kv, num_splits = self.block_kv, self.num_splits
        max_concurrent_steps, block_h, bt_chunk = self.max_concurrent_steps, self.block_h, self.bt_chunk
        if block_kv != 64:
            # 64 = two 32-row score tiles, one per compute warpgroup. (32 would need
            # a zero-fill of 16-row V tiles, which the WGMMA register layout cannot hold.)
            raise ValueError(f"block_kv must be 64, got {block_kv=}")
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits=}")
        if max_concurrent_steps < 1:
            raise ValueError(f"max_concurrent_steps must be >= 1, got {max_concurrent_steps=}")
        if block_h != BLOCK_H:
            raise ValueError(f"block_h must be {BLOCK_H} (the wgmma M dimension), got {block_h=}")
        if bt_chunk < 32 or bt_chunk % 32:
            raise ValueError(f"bt_chunk must be a positive multiple of 32, got {bt_chunk=}")
        smem = self.smem_bytes()
        if smem > SMEM_LIMIT_BYTES:
            raise ValueError(
                f"config needs {smem} bytes of shared memory > {SMEM_LIMIT_BYTES} (Hopper's 227 KiB): "
                f"{block_kv=}, {max_concurrent_steps=}, {bt_chunk=}; use at most 2 stages"
            )

    def smem_bytes(self, dtype_bytes: int = 2) -> int:
        """Shared memory the kernel allocates (each allocation rounded up to 1 KiB, as Mosaic GPU does)."""

        def alloc(n):
            return -(-n // SMEM_ALIGNMENT) * SMEM_ALIGNMENT

        q = alloc(BLOCK_H * HEAD_DIM * dtype_bytes)
        kv = alloc(self.max_concurrent_steps * self.block_kv * HEAD_DIM * dtype_bytes)
        p = alloc(BLOCK_H * self.block_kv * dtype_bytes)
        f32_misc = alloc(NUM_COMPUTE_WGS * BLOCK_H * 4)
        i32_misc = alloc((INFO_WORDS + self.bt_chunk) * 4)
        barriers = 8 * (2 + 2 * self.max_concurrent_steps + 3)
        return q + kv + p + f32_misc + i32_misc + barriers


def _padded_heads(num_heads: int) -> int:
    if num_heads <= BLOCK_H:
        return 1 << (num_heads - 1).bit_length()
    return -(-num_heads // BLOCK_H) * BLOCK_H


def _tile_geometry(num_heads: int) -> tuple[int, int, int]:
    """(padded heads, heads per tile Hp, tokens per tile)."""
    h_pad = _padded_heads(num_heads)
    hp = min(h_pad, BLOCK_H)
    return h_pad, hp, BLOCK_H // hp


def _num_tiles_bound(num_tokens: int, num_reqs: int, tokens_per_tile: int) -> int:
    # sum_r ceil(q_len_r / tpt) <= (T + R * (tpt - 1)) / tpt, and <= T.
    return max(1, min(num_tokens, (num_tokens + num_reqs * (tokens_per_tile - 1)) // tokens_per_tile))


def heuristic_config(config: MLAConfig, num_tokens: int, max_blocks: int, num_reqs: int | None = None,
                     num_sms: int = NUM_SMS_H200) -> MosaicConfig:
    """Picks the split count that fills the GPU (FlashAttention's wave-efficiency rule)."""
    _, _, tpt = _tile_geometry(config.num_heads)
    num_reqs = num_tokens if num_reqs is None else num_reqs
    h_tiles = _padded_heads(config.num_heads) // min(_padded_heads(config.num_heads), BLOCK_H)
    ctas = _num_tiles_bound(num_tokens, num_reqs, tpt) * h_tiles
    block_kv = 64
    max_steps = max(1, -(-max_blocks * config.page_size // block_kv))
    # At least 4 KV steps per split, at most 32 splits.
    max_splits = max(1, min(32, max_steps // 4))
    effs = []
    for s in range(1, max_splits + 1):
        waves = -(-ctas * s // num_sms)
        effs.append(ctas * s / (waves * num_sms))
    best = max(effs)
    num_splits = next(s for s, e in enumerate(effs, start=1) if e >= 0.85 * best)
    return MosaicConfig(block_kv=block_kv, num_splits=num_splits, max_concurrent_steps=2)


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
    if config.is_fp8_kv_cache:
        return f"fp8 KV cache is not supported, got kv_cache_dtype={config.kv_cache_dtype!r}"
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


def _build_kernel(*, dtype, page_size: int, hp: int, num_h_tiles: int, num_tiles: int, num_splits: int,
                  block_kv: int, stages: int, bt_chunk: int, scale_log2: float, interpret: bool):
    half = block_kv // 2  # KV rows of a step whose scores one compute warpgroup computes
    if page_size >= block_kv:
        pages_per_step, steps_per_page = 1, page_size // block_kv
    else:
        pages_per_step, steps_per_page = block_kv // page_size, 1
    if bt_chunk % pages_per_step:
        raise ValueError(f"bt_chunk={bt_chunk} must be a multiple of pages_per_step={pages_per_step}")
    split_out = num_splits > 1

    def body(q_ref, kv_ref, info_ref, bt_ref, out_ref, lse_ref,
             q_smem, kv_smem, p_smem, x_smem, i_smem,
             q_bar, info_bar, bt_bar, kv_ready, kv_consumed, sync_a, sync_b):
        hb = lax.axis_index("h")
        split = lax.axis_index("split")
        tile = lax.axis_index("tile")
        wg = lax.axis_index("wg")
        info_smem = i_smem.at[pl.ds(0, INFO_WORDS)]
        bt_smem = i_smem.at[pl.ds(INFO_WORDS, bt_chunk)]

        def tile_info():
            plgpu.barrier_wait(info_bar)
            req = info_smem[0]
            kv_len = info_smem[1]
            first_pos = info_smem[2]
            n_steps = lax.div(kv_len + (block_kv - 1), jnp.int32(block_kv))
            per_split = lax.div(n_steps + (num_splits - 1), jnp.int32(num_splits))
            begin = jnp.minimum(split * per_split, n_steps)
            end = jnp.minimum(begin + per_split, n_steps)
            return req, kv_len, first_pos, begin, end

        # ---------------------------------------------------------------- memory warpgroup
        @pl.when(wg == NUM_COMPUTE_WGS)
        def _memory_wg():
            plgpu.set_max_registers(40, action="decrease")
            plgpu.copy_gmem_to_smem(info_ref.at[tile], info_smem, info_bar)
            plgpu.copy_gmem_to_smem(q_ref.at[tile, hb], q_smem, q_bar)
            req, _, _, begin, end = tile_info()

            def step(i, cur_chunk):
                k = begin + i
                slot = lax.rem(i, jnp.int32(stages))

                @pl.when(i >= stages)
                def _():
                    plgpu.barrier_wait(kv_consumed.at[slot])

                if pages_per_step == 1:
                    lp0 = lax.div(k, jnp.int32(steps_per_page))
                else:
                    lp0 = k * pages_per_step
                chunk = lax.div(lp0, jnp.int32(bt_chunk))

                @pl.when(chunk != cur_chunk)
                def _():
                    plgpu.copy_gmem_to_smem(bt_ref.at[req, pl.ds(chunk * bt_chunk, bt_chunk)], bt_smem, bt_bar)
                    plgpu.barrier_wait(bt_bar)

                base = lp0 - chunk * bt_chunk
                if pages_per_step == 1:
                    page = bt_smem[base]
                    if steps_per_page == 1:
                        src = kv_ref.at[page]
                    else:
                        off = lax.rem(k, jnp.int32(steps_per_page)) * block_kv
                        src = kv_ref.at[page, pl.ds(off, block_kv)]
                    plgpu.copy_gmem_to_smem(src, kv_smem.at[slot], kv_ready.at[slot])
                else:
                    for j in range(pages_per_step):
                        page = bt_smem[base + j]
                        plgpu.copy_gmem_to_smem(
                            kv_ref.at[page], kv_smem.at[slot, pl.ds(j * page_size, page_size)], kv_ready.at[slot]
                        )
                return chunk

            n = end - begin
            lax.fori_loop(0, n, step, jnp.int32(-1))

            # Drain: observe the last releases of every slot, so that each barrier
            # phase is awaited by its consumer (the interpreter checks this).
            @pl.loop(jnp.maximum(n - stages, 0), n)
            def _drain(i):
                plgpu.barrier_wait(kv_consumed.at[lax.rem(i, jnp.int32(stages))])

        # ---------------------------------------------------------------- compute warpgroups
        def compute_wg(w: int):  # w is static: all SMEM slices below are static
            plgpu.set_max_registers(232, action="increase")
            _, kv_len, first_pos, begin, end = tile_info()
            plgpu.barrier_wait(q_bar)
            v_cols = pl.ds(w * V_HALF, V_HALF)

            m_i = plgpu.layout_cast(jnp.full((BLOCK_H,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
            l_i = plgpu.layout_cast(jnp.full((BLOCK_H,), 0.0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
            acc = plgpu.layout_cast(jnp.full((BLOCK_H, V_HALF), 0.0, jnp.float32), plgpu.Layout.WGMMA)

            def kv_step(k, carry):
                acc, m_i, l_i = carry
                slot = lax.rem(k - begin, jnp.int32(stages))
                kv_start = k * block_kv
                plgpu.barrier_wait(kv_ready.at[slot])

                def qk(s_ref):
                    plgpu.wgmma(s_ref, q_smem, kv_smem.at[slot, pl.ds(w * half, half)].transpose((1, 0)))
                    return s_ref[...]

                s = pl.run_scoped(qk, plgpu.ACC((BLOCK_H, half), jnp.float32))
                row = plgpu.broadcasted_iota(jnp.int32, (BLOCK_H, half), 0, layout=plgpu.Layout.WGMMA)
                col = plgpu.broadcasted_iota(jnp.int32, (BLOCK_H, half), 1, layout=plgpu.Layout.WGMMA)
                kv_pos = col + (kv_start + w * half)
                # Row i holds token i // hp of the tile, at position first_pos + i // hp:
                # kv_pos <= first_pos + i // hp  <=>  (kv_pos - first_pos) * hp <= i.
                visible = ((kv_pos - first_pos) * hp <= row) & (kv_pos < kv_len)
                s = jnp.where(visible, s * scale_log2, MASK_VALUE)

                # Row max shared by the two compute warpgroups.
                m_own = s.max(axis=1)
                x_smem[w] = m_own
                plgpu.barrier_arrive(sync_a)
                plgpu.barrier_wait(sync_a)
                m_other = plgpu.load(x_smem.at[1 - w], layout=plgpu.Layout.WGMMA.reduce(1))
                m_new = jnp.maximum(m_i, jnp.maximum(m_own, m_other))
                alpha = jnp.exp2(m_i - m_new)
                p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
                l_i = l_i * alpha + p.sum(axis=1)
                acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
                p_smem[w] = p.astype(dtype)

                # The step that runs past kv_len: zero this warpgroup's V half of the
                # invalid rows (their cache slots may hold NaN; 0 * NaN = NaN).
                # Both warpgroups finished reading K of this slot before sync_a.
                @pl.when(kv_start + block_kv > kv_len)
                def _zero_tail():
                    n_valid = kv_len - kv_start
                    for c in range(V_HALF // 64):
                        ref = kv_smem.at[slot, :, pl.ds(w * V_HALF + c * 64, 64)]
                        rows = plgpu.broadcasted_iota(jnp.int32, (block_kv, 64), 0, layout=plgpu.Layout.WGMMA)
                        ref[...] = jnp.where(rows < n_valid, ref[...], jnp.zeros((), dtype))

                plgpu.commit_smem()
                plgpu.barrier_arrive(sync_b)
                plgpu.barrier_wait(sync_b)

                def pv(acc_ref):
                    for h in range(NUM_COMPUTE_WGS):
                        plgpu.wgmma(acc_ref, p_smem.at[h], kv_smem.at[slot, pl.ds(h * half, half), v_cols])

                if interpret:
                    # The interpreter has no rule for run_state over an accumulator
                    # (nor for storing into one): compute P @ V into a fresh
                    # accumulator and add it. Same math, one more fp32 add per element.
                    def pv_fresh(acc_ref):
                        pv(acc_ref)
                        return acc_ref[...]

                    acc = acc + pl.run_scoped(pv_fresh, plgpu.ACC((BLOCK_H, V_HALF), jnp.float32))
                else:
                    acc = pl.run_state(pv)(plgpu.ACC.init(acc))  # accumulates in the tensor core
                plgpu.barrier_arrive(kv_consumed.at[slot])
                return acc, m_new, l_i

            acc, m_i, l_i = lax.fori_loop(begin, end, kv_step, (acc, m_i, l_i))

            # Row sums: each warpgroup summed its own columns.
            x_smem[w] = l_i
            plgpu.barrier_arrive(sync_a)
            plgpu.barrier_wait(sync_a)
            l_tot = l_i + plgpu.load(x_smem.at[1 - w], layout=plgpu.Layout.WGMMA.reduce(1))
            plgpu.barrier_arrive(sync_b)
            plgpu.barrier_wait(sync_b)  # both read x_smem before it is reused for lse
            out = acc * lax.broadcast_in_dim(1.0 / jnp.maximum(l_tot, 1e-30), acc.shape, [0])
            if split_out:
                out_ref.at[split, tile, hb, :, v_cols][...] = out
            else:
                q_smem.at[:, v_cols][...] = out.astype(dtype)
            if w == 0:
                x_smem[0] = (m_i + jnp.log(l_tot) * (1.0 / LN2)) * LN2
            plgpu.commit_smem()
            if not split_out:
                # One TMA per 8-row tile: a column half of the tiled SMEM is only
                # contiguous within a row of tiles.
                for r in range(BLOCK_H // 8):
                    rows = pl.ds(r * 8, 8)
                    plgpu.copy_smem_to_gmem(q_smem.at[rows, v_cols], out_ref.at[tile, hb, rows, v_cols])
            if w == 0:
                lse_dst = lse_ref.at[split, tile, hb] if split_out else lse_ref.at[tile, hb]
                plgpu.copy_smem_to_gmem(x_smem.at[0], lse_dst)
            plgpu.wait_smem_to_gmem(0)

        for w in range(NUM_COMPUTE_WGS):
            pl.when(wg == w)(functools.partial(compute_wg, w))

    # wgmma needs one swizzle for both operands, and a P half is `half` columns
    # wide: every wgmma operand (Q, the KV ring, P) is tiled (8, half) with a
    # (half * 2)-byte swizzle (64 bytes for block_kv=64).
    transforms = (plgpu.TilingTransform((8, half)), plgpu.SwizzleTransform(half * 2))
    scratch = [
        plgpu.SMEM((BLOCK_H, HEAD_DIM), dtype, transforms=transforms),  # q (and the output stage)
        plgpu.SMEM((stages, block_kv, HEAD_DIM), dtype, transforms=transforms),  # KV ring
        plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H, half), dtype, transforms=transforms),  # P halves
        plgpu.SMEM((NUM_COMPUTE_WGS, BLOCK_H), jnp.float32),  # row max / row sum exchange, lse
        plgpu.SMEM((INFO_WORDS + bt_chunk,), jnp.int32),  # tile info + block-table chunk
        plgpu.Barrier(),  # q_bar
        plgpu.Barrier(),  # info_bar
        plgpu.Barrier(),  # bt_bar
        plgpu.Barrier(num_arrivals=pages_per_step, num_barriers=stages),  # kv_ready
        plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS, num_barriers=stages),  # kv_consumed
        plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS),  # sync_a
        plgpu.Barrier(num_arrivals=NUM_COMPUTE_WGS),  # sync_b
    ]
    if split_out:
        out_type = (
            jax.ShapeDtypeStruct((num_splits, num_tiles, num_h_tiles, BLOCK_H, KV_LORA_RANK), jnp.float32),
            jax.ShapeDtypeStruct((num_splits, num_tiles, num_h_tiles, BLOCK_H), jnp.float32),
        )
    else:
        out_type = (
            jax.ShapeDtypeStruct((num_tiles, num_h_tiles, BLOCK_H, KV_LORA_RANK), dtype),
            jax.ShapeDtypeStruct((num_tiles, num_h_tiles, BLOCK_H), jnp.float32),
        )
    return plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=scratch,
        grid=(num_h_tiles, num_splits, num_tiles),
        grid_names=("h", "split", "tile"),
        num_threads=NUM_COMPUTE_WGS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True, reduction_scratch_bytes=0, lowering_semantics=plgpu.LoweringSemantics.Lane),
    )


# --------------------------------------------------------------------------------------
# The wrapper: tile schedule, q packing, output unpacking, split combine.


def _schedule(metadata: DecodeMetadata, num_tokens: int, tpt: int, num_tiles: int):
    qsl = metadata.query_start_loc.astype(jnp.int32)
    seq = metadata.seq_lens.astype(jnp.int32)
    num_reqs = seq.shape[0]
    q_len = qsl[1:] - qsl[:-1]
    tiles_per_req = (q_len + tpt - 1) // tpt
    tile_end = jnp.cumsum(tiles_per_req).astype(jnp.int32)
    tile_start = tile_end - tiles_per_req
    j = jnp.arange(num_tiles, dtype=jnp.int32)
    r = jnp.minimum(jnp.searchsorted(tile_end, j, side="right").astype(jnp.int32), num_reqs - 1)
    valid = j < tile_end[-1]
    local = j - tile_start[r]
    first_tok = qsl[r] + local * tpt
    ntok = jnp.clip(q_len[r] - local * tpt, 0, tpt)
    first_pos = seq[r] - q_len[r] + local * tpt
    kv_len = jnp.where(valid, first_pos + ntok, 0)  # KV the tile's last token sees
    info = jnp.zeros((num_tiles, INFO_WORDS), jnp.int32)
    info = info.at[:, 0].set(r).at[:, 1].set(kv_len).at[:, 2].set(first_pos)
    tok_idx = jnp.clip(first_tok[:, None] + jnp.arange(tpt, dtype=jnp.int32)[None, :], 0, num_tokens - 1)
    # Where each query token lands: (tile, slot within the tile).
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    rt = jnp.searchsorted(qsl[1:], t, side="right").astype(jnp.int32)
    li = t - qsl[rt]
    return info, tok_idx, tile_start[rt] + li // tpt, li % tpt


def _clamped_block_table(metadata: DecodeMetadata, page_size: int, width: int):
    """Block table padded to `width` columns; entries past a request's last page repeat it."""
    bt = metadata.block_table.astype(jnp.int32)
    n_pages = jnp.maximum((metadata.seq_lens.astype(jnp.int32) + page_size - 1) // page_size, 1)
    cols = jnp.minimum(jnp.arange(width, dtype=jnp.int32)[None, :], n_pages[:, None] - 1)
    cols = jnp.minimum(cols, bt.shape[1] - 1)
    return jnp.take_along_axis(bt, cols, axis=1)


def _mla_decode(q_nope, q_pe, kv_cache, metadata: DecodeMetadata, config: MLAConfig, tuning: MosaicConfig,
                interpret: bool):
    num_tokens, num_heads, _ = q_nope.shape
    dtype = q_nope.dtype
    page_size = config.page_size
    h_pad, hp, tpt = _tile_geometry(num_heads)
    num_h_tiles = h_pad // hp
    num_tiles = _num_tiles_bound(num_tokens, metadata.num_reqs, tpt)
    block_kv = tuning.block_kv
    if not supported_page_size(page_size, block_kv):
        raise NotImplementedError(f"page_size={page_size} is not supported with block_kv={block_kv}")
    num_splits = tuning.num_splits
    if metadata.max_num_splits > 0:
        num_splits = min(num_splits, metadata.max_num_splits)

    info, tok_idx, tile_of_tok, slot_of_tok = _schedule(metadata, num_tokens, tpt, num_tiles)

    q = jnp.concatenate([q_nope, q_pe.astype(dtype)], axis=-1)
    if h_pad != num_heads:
        q = jnp.pad(q, ((0, 0), (0, h_pad - num_heads), (0, 0)))
    q = q.reshape(num_tokens, num_h_tiles, hp, HEAD_DIM)[tok_idx]  # [N, tpt, nh, hp, D]
    q_tiles = q.transpose(0, 2, 1, 3, 4).reshape(num_tiles, num_h_tiles, BLOCK_H, HEAD_DIM)

    pages_per_step = max(1, block_kv // page_size)
    bt_chunk = tuning.bt_chunk - tuning.bt_chunk % pages_per_step
    width = -(-metadata.max_blocks // bt_chunk) * bt_chunk
    bt = _clamped_block_table(metadata, page_size, width)

    kernel = _build_kernel(
        dtype=dtype, page_size=page_size, hp=hp, num_h_tiles=num_h_tiles, num_tiles=num_tiles,
        num_splits=num_splits, block_kv=block_kv, stages=tuning.max_concurrent_steps, bt_chunk=bt_chunk,
        scale_log2=config.softmax_scale * LOG2E, interpret=interpret,
    )
    out_t, lse_t = kernel(q_tiles, kv_cache, info, bt)

    if num_splits == 1:
        out = _unpack(out_t, num_tiles, num_h_tiles, tpt, hp, tile_of_tok, slot_of_tok)
        lse = _unpack(lse_t, num_tiles, num_h_tiles, tpt, hp, tile_of_tok, slot_of_tok)
    else:
        o = jax.vmap(lambda x: _unpack(x, num_tiles, num_h_tiles, tpt, hp, tile_of_tok, slot_of_tok))(out_t)
        l = jax.vmap(lambda x: _unpack(x, num_tiles, num_h_tiles, tpt, hp, tile_of_tok, slot_of_tok))(lse_t)
        m = jnp.max(l, axis=0)
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        w = jnp.exp(l - m[None])
        denom = jnp.sum(w, axis=0)
        out = jnp.sum(w[..., None] * o, axis=0) / jnp.maximum(denom, 1e-30)[..., None]
        lse = m + jnp.log(denom)
    return out[:, :num_heads].astype(dtype), lse[:, :num_heads].astype(jnp.float32)


def _unpack(x, num_tiles, num_h_tiles, tpt, hp, tile_of_tok, slot_of_tok):
    """[N, nh, 64, *rest] -> [T, nh * hp, *rest]."""
    rest = x.shape[3:]
    x = x.reshape(num_tiles, num_h_tiles, tpt, hp, *rest)
    x = x[tile_of_tok, :, slot_of_tok]  # [T, nh, hp, *rest]
    return x.reshape(x.shape[0], num_h_tiles * hp, *rest)


@functools.partial(jax.jit, static_argnames=("config", "tuning", "interpret"))
def _mla_decode_jit(q_nope, q_pe, kv_cache, metadata, config, tuning, interpret):
    if interpret:
        # The context manager must be active while the kernel is traced (it sets a
        # trace-context config); inside this jitted function it is.
        params = interpret if isinstance(interpret, plgpu.InterpretGPUParams) else plgpu.InterpretGPUParams()
        with plgpu.force_gpu_interpret_mode(params):
            return _mla_decode(q_nope, q_pe, kv_cache, metadata, config, tuning, True)
    return _mla_decode(q_nope, q_pe, kv_cache, metadata, config, tuning, False)


def mla_decode(q_nope, q_pe, kv_cache, metadata: DecodeMetadata, config: MLAConfig, *,
               tuning: MosaicConfig | None = None, interpret=False):
    """Returns `(out [T, H, 512] in q's dtype, lse [T, H] float32)`.

    `metadata` holds jnp int32 arrays (a pytree, see mla_jax.api). jit-compatible.
    `interpret=True` (or a `plgpu.InterpretGPUParams`, e.g. with `detect_races=True`)
    runs the kernel in Mosaic GPU interpret mode (CPU).
    """
    reason = unsupported_reason(config)
    if reason is not None:
        raise NotImplementedError(f"pallas_mosaic_gpu cannot run this problem: {reason}")
    if tuning is None:
        tuning = heuristic_config(config, q_nope.shape[0], metadata.max_blocks, metadata.num_reqs)
    elif not isinstance(tuning, MosaicConfig):
        raise ValueError(f"tuning must be a MosaicConfig, got tuning={tuning!r}")
    if not isinstance(interpret, plgpu.InterpretGPUParams):
        interpret = bool(interpret)
    return _mla_decode_jit(q_nope, q_pe, kv_cache, metadata, config, tuning, interpret)
