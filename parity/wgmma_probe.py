"""python -m parity.wgmma_probe: how fast a CTA runs the H = 128 step's matmuls, alone and side by side, and whole
steps without their memory (a diagnosis of the Mosaic GPU kernel's compute-bound step, not a test).

Each CTA (one per SM) holds the kernel's operands in shared memory, in its layouts (8 x 64 tiles, 128-byte swizzle):
a query tile Q [64, 576] and two KV steps K [2 x 64, 576] (the ring: the two slots adjacent, so that 128 rows read
as one operand); P of a slot is its 64 rope columns (as with p_in_kv). Each iteration a warpgroup runs one of:

* "qk": the kernel's scores, S [64, 64] = Q @ K_slot^T (wgmma N = 64, K = 576: 36 instructions of k = 16, both
  operands from shared memory), then waits for them;
* "qk_n128": the scores of both slots in one, S [64, 128] (N = 128; its time is reported per 64 keys);
* "qk_rs": the scores with Q from registers (loaded once: only K from shared memory);
* "pv": one warpgroup's P @ V, acc [64, 256] += P_slot [64, 64] @ V_slot [64, 256] (the slot's columns
  [256, 512)); "pv0" the same on the other half, columns [0, 256);
* "qk32", "pv32", "pv32_0": the same over 32 keys (wgmma N = 32 for the scores, K = 32 for P @ V, P [64, 32]), a
  step of block_kv = 32 (every buffer then with a 64-byte swizzle: a [64, 32] P needs it, and Mosaic GPU's wgmma
  wants one swizzle for both operands); their times are reported per 64 keys too;
* "qk_sm", "qk32_sm": the scores, then the kernel's online softmax on them (scale, row max, exp2, row sums, P
  stored as bf16 into a P buffer, the fence of `commit_smem`): warpgroup 0's chain without P @ V.

Probes (warpgroup 0's work / warpgroup 1's [/ warpgroup 2's]): qk / -, qk_n128 / -, qk_rs / -, - / pv, qk / pv (the
kernel's overlap: is a P @ V beside the scores free?), qk / qk (two warpgroups' scores at once), pv0 / pv (the two
P @ V halves at once, as "flashmla" runs them after the softmax), qk / pv / pv0 and qk_rs / pv / pv0 (three
warpgroups: the scores beside both halves, the step of the removed schedule="three_wg", with Q from shared memory or
registers);
the 32-key forms of these; the softmax forms (qk_sm alone and beside both P @ V halves). Where one warpgroup's
iterations are longer than another's, the slope is the longest one's, partly alone.

The step probes run a schedule's whole step, its hand-offs included, over one KV step held in shared memory and read
every iteration (P and the rescale factor double-buffered, as with p_in_kv, unless said): what the step costs the
tensor cores, the softmax and the barriers alone, to set beside the kernel's step (the difference is the ring's
loads and waits):
* "step_flashmla": warpgroup 0 computes the scores and the online softmax, writes P and alpha, says so
  (`p_ready`), rescales its accumulator and does its P @ V half; warpgroup 1 waits, rescales, does its half
  and releases P (`p_free`, awaited before P's buffer is written again two steps later);
* "step_flashmla_1p": the same with one P buffer (and alpha), as the kernel's default (p_in_kv=False): warpgroup 0
  writes P of step i once warpgroup 1 has released step i - 1's;
* "step_flashmla_1p_tma": step_flashmla_1p with the memory's traffic but none of its waits: warpgroup 1 also loads
  V's 512 columns of a KV step (64 KiB from L2; the rope's 8 KiB do not fit) each iteration into a spare slot that
  nothing reads, after its P @ V as the kernel's refill (awaiting the one before first): what the TMA's
  shared-memory writes cost the step;
* "step_flashmla_1p_hbm": the same loads from a 1 GiB buffer (HBM_ROWS) that the CTAs walk through in pairs, each
  pair loading the same step at about the same time (one from HBM, one mostly from L2), as the kernel's two head
  tiles of a request do with heads_fastest: the traffic with HBM's bandwidth and latency, still without the waits;
* "step_flashmla_1p_l2x2", "step_flashmla_1p_hbmx2": the refill's loads two in flight, as the kernel's two-stage ring
  (load i awaited before load i + 2 is issued), from a 10 MiB window of the large buffer (L2_BLOCKS: distinct
  lines for each CTA pair, L2-resident; _tma's every CTA reads the same two steps' lines) and from all of it (HBM).
  Session 17 measured _tma and _hbm at 3.3 and 3.8 us a step: with one load in flight, awaited after one step, the
  step is a load's latency under the whole chip's loads, which the two-stage forms hide as the kernel's ring does;
* "step_flashmla_1p_ring": step_flashmla_1p over the kernel's two-stage ring: two K slots, step i in slot i % 2,
  loaded from the large buffer (CTA pairs as _hbm) and awaited by warpgroup 0's scores (`kv_ready`); the slot is
  released after both P @ V halves (`kv_consumed`, both warpgroups), then refilled whole with step i + 2 by
  warpgroup 1: the kernel's loads and waits without its block table, masks, prologue and epilogue;
  "_ring_scattered": the steps in a scattered order (step x of the walk is x * SCATTER mod 2^14: as the bench's
  random pages, where _ring walks the buffer in order); "_pf1", "_pf2": with each refill, the step one or two after
  it prefetched into L2 (`plgpu.async_prefetch` a TMA box at a time, as MosaicConfig.l2_prefetch did, removed in
  session 29);
* "step_flashmla_1p_late", "step_flashmla_1p_ring_late": warpgroup 0 adds up its row sums under its P @ V (as
  MosaicConfig.late_row_sums did, removed in session 29) instead of before P's hand-over;
* "stream_pairs_x2", "stream_pairs_x3", "stream_hbm_x3", "stream_l2_x3" (STREAMS): loads alone, 64 KiB an
  iteration into two or three slots, from the large buffer in CTA pairs, each CTA its own steps (HBM), or the 10 MiB
  window (L2): the SMs' intake of TMA bytes without compute (`sm_ingress_tb_per_s`);
* "step_deferred": step_flashmla with warpgroup 1's P @ V of step i waiting for warpgroup 0's scores of step i + 1
  (`qk_done`, as MosaicConfig.deferred_pv did, removed in session 37);
* "step_three_wg": warpgroup 0 the scores and softmax only, warpgroups 1 and 2 a P @ V half each
  (the kernel's schedule="three_wg", removed in session 29).

An iteration's time is the slope of the kernel's time over the iteration count (the launch and set-up cancel).
Every result is checked against numpy: the row sums of the last scores and of the accumulated P @ V (small integers,
exact in fp32), the softmax's row sums to 1e-4, the step probes' P @ V to one bf16 ulp of P an element
(`expected_step`). `--random`: q and K normal instead of small integers (the tensor cores' power, and so the clock,
depends on the operands' bits; the step probes' check holds with them, the matmul probes' exact one does not).
"""

from __future__ import annotations

import argparse
import sys

from parity.convert_probe import add_probe_args, gpu_missing, parse_iters, parse_names, slope_time, write_rows

BLOCK_H, BLOCK_KV, HEAD_DIM, V_HALF = 64, 64, 576, 256
# probe -> (warpgroup 0's work, warpgroup 1's work); None: that warpgroup idles
PROBES = {"qk": ("qk", None), "qk_n128": ("qk_n128", None), "qk_rs": ("qk_rs", None), "pv": (None, "pv"),
          "qk+pv": ("qk", "pv"), "qk+qk": ("qk", "qk"), "pv+pv": ("pv0", "pv"), "qk+pv+pv": ("qk", "pv", "pv0"),
          "qk_rs+pv+pv": ("qk_rs", "pv", "pv0"), "qk32": ("qk32", None), "pv32+pv32": ("pv32_0", "pv32"),
          "qk32+pv32+pv32": ("qk32", "pv32", "pv32_0"), "qk_sm": ("qk_sm", None), "qk32_sm": ("qk32_sm", None),
          "qk_sm+pv+pv": ("qk_sm", "pv", "pv0"), "qk32_sm+pv32+pv32": ("qk32_sm", "pv32", "pv32_0")}
# step probes with the refill's loads -> (where from, loads in flight): "hot" the same two KV steps for every CTA
# (k's rows), "l2" a window of L2_BLOCKS steps of the large buffer (distinct lines for each CTA pair, L2-resident after
# the first pass), "hbm" the whole large buffer
LOADS = {"step_flashmla_1p_tma": ("hot", 1), "step_flashmla_1p_hbm": ("hbm", 1), "step_flashmla_1p_l2x2": ("l2", 2),
         "step_flashmla_1p_hbmx2": ("hbm", 2)}
RING = "step_flashmla_1p_ring"  # the kernel's two-stage ring: loads into the slots the step reads, awaited by it
# ring probes -> (KV steps in a scattered order, as random pages: else in order; L2 prefetch distance: 0 off)
RINGS = {RING: (False, 0), "step_flashmla_1p_ring_scattered": (True, 0),
         "step_flashmla_1p_ring_scattered_pf1": (True, 1), "step_flashmla_1p_ring_scattered_pf2": (True, 2),
         "step_flashmla_1p_ring_late": (False, 0)}
# warpgroup 0's row sums under its P @ V (as the removed MosaicConfig.late_row_sums), not before P's hand-over
LATE = ("step_flashmla_1p_late", "step_flashmla_1p_ring_late")
SCATTER = 40503  # odd: x -> x * SCATTER mod 2^14 permutes the large buffer's 2^14 steps
STEPS = {"step_flashmla": 2, "step_flashmla_1p": 2, "step_flashmla_1p_late": 2, **{name: 2 for name in LOADS},
         **{name: 2 for name in RINGS},
         "step_deferred": 2, "step_three_wg": 3}  # -> warpgroups
# loads alone, no compute (one warpgroup streaming V's 512 columns of a KV step, 64 KiB, into `depth` slots, each
# load awaited `depth` iterations after its issue) -> (where from, depth): "pairs" the CTA pairs as _hbm, "hbm" every
# CTA its own steps, "l2" the 10 MiB window
STREAMS = {"stream_pairs_x2": ("pairs", 2), "stream_pairs_x3": ("pairs", 3), "stream_hbm_x3": ("hbm", 3),
           "stream_l2_x3": ("l2", 3)}
# the probes that take the large buffer: copies of K's first KV step (so that every load brings the same values)
HBM_PROBES = tuple(n for n, (src, _) in LOADS.items() if src != "hot") + tuple(RINGS) + tuple(STREAMS)
HBM_ROWS = 1 << 20  # its rows (1.1 GiB of bf16 [HBM_ROWS, 576]; the H200's L2 is 50 MB)
L2_BLOCKS = 160  # the "l2" window: 160 KV steps of 64 KiB (10 MiB)
PROBES.update({name: tuple(f"step{w}" for w in range(n)) for name, n in STEPS.items()})
PROBES.update({name: ("stream",) for name in STREAMS})
V_COLS = {"pv": V_HALF, "pv0": 0, "pv32": V_HALF, "pv32_0": 0}  # the first column of each P @ V kind's half
SCALE = 0.0625  # the softmax probes' score scale (log2 units)


def keys_of(kind: str | None) -> int:
    """Keys of one iteration of a warpgroup's work."""
    return 0 if kind is None else 2 * BLOCK_KV if kind == "qk_n128" else 32 if "32" in kind else BLOCK_KV


def big_step(big_ref, cta, i, num_ctas: int, *, paired: bool = True, window: int | None = None,
             scattered: bool = False):
    """The large buffer's KV step (64 rows) that CTA `cta` loads at iteration i. paired: the CTA pairs walk the
    buffer together (pair c // 2 takes step c // 2 + i * pairs, as heads_fastest's head tiles); else each CTA its
    own (c + i * num_ctas). window: within its first `window` steps (L2-resident). scattered: step x of the walk is
    x * SCATTER mod the steps (a permutation when they are 2^14: main's buffer)."""
    from jax import lax
    from jax.experimental import pallas as pl

    first, stride = (lax.div(cta, 2), max(1, num_ctas // 2)) if paired else (cta, num_ctas)
    blocks = big_ref.shape[0] // BLOCK_KV
    blocks = min(blocks, window) if window else blocks
    blk = lax.rem(first + i * stride, blocks)
    if scattered:
        blk = lax.rem(blk * SCATTER, blocks)
    return big_ref.at[pl.ds(pl.multiple_of(blk * BLOCK_KV, BLOCK_KV), BLOCK_KV)]


def operands(random: bool = False):
    """(q [64, 576], k [128, 576]) as numpy float32: small integers (-1, 0, 1), or normal values rounded to bf16
    (random: so that numpy sees what the GPU does)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = ((BLOCK_H, HEAD_DIM), (2 * BLOCK_KV, HEAD_DIM))
    if random:
        return tuple(np.asarray(jnp.asarray(rng.standard_normal(s), jnp.bfloat16).astype(jnp.float32))
                     for s in shapes)
    return tuple(rng.integers(-1, 2, size=s).astype(np.float32) for s in shapes)


def online_softmax(s, m_i, l_i):
    """The kernel's online softmax step on scaled scores s [64, keys] (log2 units) -> (P, alpha, new row max, new row
    sums)."""
    import jax.numpy as jnp
    from jax import lax

    m_new = jnp.maximum(m_i, s.max(axis=1))
    alpha = jnp.exp2(m_i - m_new)
    p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
    return p, alpha, m_new, l_i * alpha + p.sum(axis=1)


def probe_kernel(body, rows: int, scratch: list, num_ctas: int, num_threads: int):
    """A probe's jitted kernel: `num_ctas` CTAs of `num_threads` warpgroups, writing [rows, 64] fp32, with the
    kernel's compiler parameters (Lane semantics, approximate exp2 as the kernel's approx_math=True, no reduction
    scratch)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((rows, BLOCK_H), jnp.float32),
        scratch_types=scratch,
        grid=(num_ctas,),
        grid_names=("cta",),
        num_threads=num_threads,
        thread_name="wg",
        # (no reduction scratch, as the kernel's plain scores: their row reductions stay within a warp)
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane, approx_math=True,
                                             reduction_scratch_bytes=0),
    )
    return jax.jit(kernel)


def build(probe: str, iters: int, num_ctas: int, interpret: bool = False):
    """The probe's jitted kernel; interpret: (step probes) accumulate as the interpreter can (see build_step)."""
    if probe in STEPS:
        return build_step(probe, iters, num_ctas, interpret)
    if probe in STREAMS:
        return build_stream(probe, iters, num_ctas)
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    work = PROBES[probe]
    # the 32-key probes: every buffer with a 64-byte swizzle (8 x 32 tiles), since a [64, 32] P needs it and the
    # wgmma's operands must share one swizzle; the others the kernel's 128 bytes (8 x 64 tiles)
    sw = 64 if any(w and "32" in w for w in work) else 128
    t = (plgpu.TilingTransform((8, sw // 2)), plgpu.SwizzleTransform(sw))

    def body(q_ref, k_ref, o_ref, q_smem, k_smem, p_smem, bar):
        wg = lax.axis_index("wg")
        cta = lax.axis_index("cta")

        @pl.when(wg == 0)
        def _():
            plgpu.copy_gmem_to_smem(q_ref, q_smem, bar)
            plgpu.copy_gmem_to_smem(k_ref, k_smem, bar)

        plgpu.barrier_wait(bar)

        def rows_of(kind, i):
            n = keys_of(kind)
            if n == 2 * BLOCK_KV:
                return pl.ds(0, n)
            slots = 2 * BLOCK_KV // n
            return pl.ds(pl.multiple_of(lax.rem(i, jnp.int32(slots)) * n, n), n)

        def scores(kind, i, q_regs):
            rows, n = rows_of(kind, i), keys_of(kind)

            def qk(s_ref):
                plgpu.wgmma(s_ref, q_smem if q_regs is None else q_regs, k_smem.at[rows].transpose((1, 0)))
                return s_ref[...]

            return pl.run_scoped(qk, plgpu.ACC((BLOCK_H, n), jnp.float32))

        def pv(acc, i, kind):
            rows, c0 = rows_of(kind, i), V_COLS[kind]
            # P: the slot's rope columns (64 keys), or the 32-key P buffer
            p_slot = p_smem if keys_of(kind) == 32 else k_smem.at[rows, pl.ds(2 * V_HALF, BLOCK_KV)]
            return pl.run_state(lambda a_ref: plgpu.wgmma(a_ref, p_slot, k_smem.at[rows, pl.ds(c0, V_HALF)]))(
                plgpu.ACC.init(acc))

        def softmax(s, carry, kind):
            """The kernel's online softmax on scores s, P stored as bf16 into the P buffer."""
            p, _, m_new, l_i = online_softmax(s * SCALE, *carry)
            p_smem[...] = p.astype(jnp.bfloat16)
            plgpu.commit_smem()
            return m_new, l_i

        for w, kind in enumerate(work):
            if kind is None:
                continue

            @pl.when(wg == w)
            def _(w=w, kind=kind):
                if kind in V_COLS:
                    if keys_of(kind) == 32:  # P: ones (the same values from every warpgroup that writes them)
                        p_smem[...] = plgpu.layout_cast(jnp.ones((BLOCK_H, 32), jnp.bfloat16), plgpu.Layout.WGMMA)
                        plgpu.commit_smem()
                    init = plgpu.layout_cast(jnp.zeros((BLOCK_H, V_HALF), jnp.float32), plgpu.Layout.WGMMA)
                    out = lax.fori_loop(0, iters, lambda i, acc: pv(acc, i, kind), init)
                elif kind.endswith("_sm"):
                    vec = plgpu.Layout.WGMMA.reduce(1)
                    init = (plgpu.layout_cast(jnp.full((BLOCK_H,), -jnp.inf, jnp.float32), vec),
                            plgpu.layout_cast(jnp.zeros((BLOCK_H,), jnp.float32), vec))
                    _, l_i = lax.fori_loop(0, iters, lambda i, c: softmax(scores(kind, i, None), c, kind), init)
                    out = l_i
                else:
                    q_regs = plgpu.load(q_smem, layout=plgpu.Layout.WGMMA) if kind == "qk_rs" else None
                    init = plgpu.layout_cast(jnp.zeros((BLOCK_H, keys_of(kind)), jnp.float32), plgpu.Layout.WGMMA)
                    out = lax.fori_loop(0, iters, lambda i, s: scores(kind, i, q_regs), init)
                if not kind.endswith("_sm"):
                    out = out.sum(axis=1)

                @pl.when(cta == 0)
                def _():
                    o_ref[w] = out  # (from registers: shared memory holds Q, two KV steps and P, no more)

    scratch = [
        plgpu.SMEM((BLOCK_H, HEAD_DIM), jnp.bfloat16, transforms=t),
        plgpu.SMEM((2 * BLOCK_KV, HEAD_DIM), jnp.bfloat16, transforms=t),
        # P of the softmax probes, [64, 64] (or [64, 32]: the 32-key P @ V's left operand, ones unless a softmax
        # probe writes it)
        plgpu.SMEM((BLOCK_H, 32 if sw == 64 else BLOCK_KV), jnp.bfloat16, transforms=t),
        plgpu.Barrier(num_arrivals=2),  # Q and K loaded
    ]
    return probe_kernel(body, len(work), scratch, num_ctas, len(work))


def build_step(probe: str, iters: int, num_ctas: int, interpret: bool = False):
    """A step probe (STEPS): the schedule's step over one KV step held in shared memory. interpret: each P @ V into a
    fresh accumulator, then added (the Mosaic GPU interpreter has no rule for run_state over an accumulator)."""
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from mla_jax.pallas_mosaic_gpu import accumulate_wgmma, prefetch_to_l2

    nwg = STEPS[probe]
    three, deferred = probe == "step_three_wg", probe == "step_deferred"
    bufs = 1 if probe.startswith("step_flashmla_1p") else 2  # P (and alpha) buffers, used by step parity
    tma = probe in LOADS  # (a spare slot, loaded every iteration)
    ring = probe in RINGS
    scattered, prefetch = RINGS.get(probe, (False, 0))
    late = probe in LATE
    source, depth = LOADS.get(probe, (None, 1))
    hbm = probe in HBM_PROBES
    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    row = plgpu.Layout.WGMMA.reduce(1)

    def body(q_ref, k_ref, *refs):
        # (hbm) a third input, the large buffer the spare slot's loads come from
        big_ref, refs = (refs[0], refs[1:]) if hbm else (None, refs)
        step_body(q_ref, k_ref, big_ref, *refs)

    def step_body(q_ref, k_ref, big_ref, o_ref, q_smem, k_smem, p_smem, x_smem, bar, p_ready, p_free, qk_done,
                  tma_bar, *extra):
        wg = lax.axis_index("wg")
        cta = lax.axis_index("cta")

        def pair_step(i):
            """The large buffer's KV step that CTA pair c // 2 loads at iteration i (big_step)."""
            return big_step(big_ref, cta, i, num_ctas, window=L2_BLOCKS if source == "l2" else None,
                            scattered=scattered)

        def k_slot(i):
            """The K slot of iteration i (ring: two, by parity; else the one)."""
            return k_smem.at[lax.rem(i, 2)] if ring else k_smem

        spare = extra[0] if tma else None  # (LOADS) the spare slot
        if ring:
            kv_ready, kv_consumed = extra

            def load(i):  # step i into its slot, once the slot is free
                plgpu.copy_gmem_to_smem(pair_step(i), k_slot(i), kv_ready.at[lax.rem(i, 2)])

        @pl.when(wg == 0)
        def _():
            plgpu.copy_gmem_to_smem(q_ref, q_smem, bar)
            if not ring:
                plgpu.copy_gmem_to_smem(k_ref.at[pl.ds(0, BLOCK_KV)], k_smem, bar)

        if ring:
            @pl.when(wg == 1)
            def _():
                for i in range(min(2, iters)):
                    load(i)

        plgpu.barrier_wait(bar)

        def pv(acc, i, c0, under=None):
            """acc + P @ V of iteration i's V half from column c0 (under: accumulate_wgmma's)."""
            def issue(a_ref):
                plgpu.wgmma(a_ref, p_smem.at[lax.rem(i, bufs)], k_slot(i).at[:, pl.ds(c0, V_HALF)])

            return accumulate_wgmma(acc, issue, under, interpret=interpret)

        def zeros_acc():
            return plgpu.layout_cast(jnp.zeros((BLOCK_H, V_HALF), jnp.float32), plgpu.Layout.WGMMA)

        def rescale(acc, alpha):
            return acc * lax.broadcast_in_dim(alpha, acc.shape, [0])

        @pl.when(wg == 0)
        def _():
            def step(i, carry):
                acc, m_i, l_i = carry

                def qk(s_ref):
                    plgpu.wgmma(s_ref, q_smem, k_slot(i).transpose((1, 0)))
                    return s_ref[...]

                if ring:
                    plgpu.barrier_wait(kv_ready.at[lax.rem(i, 2)])
                s = pl.run_scoped(qk, plgpu.ACC((BLOCK_H, BLOCK_KV), jnp.float32)) * SCALE
                if deferred:
                    pl.when(i > 0)(lambda: plgpu.barrier_arrive(qk_done.at[lax.rem(i, 2)]))  # step i - 1's P @ V may go
                p, alpha, m_new, l_new = online_softmax(s, m_i, l_i)
                # (late: the sums traced again under the P @ V; l_new, unused, is dropped)
                under = (l_i, lambda l_i=l_i, alpha=alpha, p=p: l_i * alpha + p.sum(axis=1)) if late else None
                l_i = l_i if late else l_new
                # step i - bufs released P's buffer
                pl.when(i >= bufs)(lambda: plgpu.barrier_wait(p_free.at[lax.rem(i - bufs, 2)]))
                p_smem[lax.rem(i, bufs)] = p.astype(jnp.bfloat16)
                x_smem[lax.rem(i, bufs)] = alpha
                plgpu.commit_smem()
                plgpu.barrier_arrive(p_ready.at[lax.rem(i, 2)])
                if not three:
                    out = pv(rescale(acc, alpha), i, 0, under)
                    acc, l_i = out if late else (out, l_i)
                if ring:
                    plgpu.barrier_arrive(kv_consumed.at[lax.rem(i, 2)])
                return acc, m_new, l_i

            init = (None if three else zeros_acc(), plgpu.layout_cast(jnp.full((BLOCK_H,), -jnp.inf, jnp.float32), row),
                    plgpu.layout_cast(jnp.zeros((BLOCK_H,), jnp.float32), row))
            acc, _, l_i = lax.fori_loop(0, iters, step, init)
            for j in range(max(iters - bufs, 0), iters):  # the last releases (every phase observed)
                plgpu.barrier_wait(p_free.at[j % 2])
            # (the row sums l are part of the output, or the compiler drops them: the kernel needs them, and
            # before session 18 the probes ran without them)
            out = l_i if three else acc.sum(axis=1) + l_i
            pl.when(cta == 0)(lambda: o_ref.__setitem__(0, out))

        for w in range(1, nwg):
            @pl.when(wg == w)
            def _(w=w):
                def step(i, acc):
                    plgpu.barrier_wait(p_ready.at[lax.rem(i, 2)])
                    if deferred:
                        pl.when(i + 1 < iters)(lambda: plgpu.barrier_wait(qk_done.at[lax.rem(i + 1, 2)]))
                    acc = pv(rescale(acc, plgpu.load(x_smem.at[lax.rem(i, bufs)], layout=row)), i,
                             V_HALF if w == 1 else 0)
                    plgpu.barrier_arrive(p_free.at[lax.rem(i, 2)])
                    if ring:  # the slot, once both halves are done with it: step i + 2
                        plgpu.barrier_arrive(kv_consumed.at[lax.rem(i, 2)])

                        @pl.when(i + 2 < iters)
                        def _():
                            plgpu.barrier_wait(kv_consumed.at[lax.rem(i, 2)])
                            load(i + 2)

                        if prefetch:  # the step `prefetch` after it into L2 (as l2_prefetch did)
                            pl.when(i + 2 + prefetch < iters)(
                                lambda: prefetch_to_l2(pair_step(i + 2 + prefetch)))
                    if tma:  # the refill's traffic: a KV step into the spare slot (once load i - depth landed)
                        slot = tma_bar.at[lax.rem(i, depth)]
                        pl.when(i >= depth)(lambda: plgpu.barrier_wait(slot))
                        if hbm:  # CTA pair c // 2's step of iteration i
                            src = pair_step(i).at[:, pl.ds(0, 2 * V_HALF)]
                        else:
                            rows = pl.ds(pl.multiple_of(lax.rem(i, 2) * BLOCK_KV, BLOCK_KV), BLOCK_KV)
                            src = k_ref.at[rows, pl.ds(0, 2 * V_HALF)]
                        # (with depth 2, two loads write the spare slot at once: nothing reads it)
                        plgpu.copy_gmem_to_smem(src, spare, slot)
                    return acc

                out = lax.fori_loop(0, iters, step, zeros_acc()).sum(axis=1)
                if ring:
                    for j in range(max(iters - 2, 0), iters):  # the last releases (every phase observed)
                        plgpu.barrier_wait(kv_consumed.at[j % 2])
                if tma:
                    for j in range(max(iters - depth, 0), iters):  # (the last loads)
                        plgpu.barrier_wait(tma_bar.at[j % depth])
                pl.when(cta == 0)(lambda: o_ref.__setitem__(w, out))

    scratch = [
        plgpu.SMEM((BLOCK_H, HEAD_DIM), jnp.bfloat16, transforms=t),
        plgpu.SMEM((2, BLOCK_KV, HEAD_DIM) if ring else (BLOCK_KV, HEAD_DIM), jnp.bfloat16, transforms=t),  # K
        plgpu.SMEM((bufs, BLOCK_H, BLOCK_KV), jnp.bfloat16, transforms=t),  # P, by step parity
        plgpu.SMEM((bufs, BLOCK_H), jnp.float32),  # alpha, by step parity
        plgpu.Barrier(num_arrivals=1 if ring else 2),  # Q and K loaded (ring: Q)
        # p_ready, p_free, qk_done: by step parity (no barrier is then ever two phases ahead of a waiter)
        plgpu.Barrier(num_arrivals=1, num_barriers=2),
        plgpu.Barrier(num_arrivals=nwg - 1, num_barriers=2),
        plgpu.Barrier(num_arrivals=1, num_barriers=2),
        plgpu.Barrier(num_arrivals=1, num_barriers=depth),  # tma_bar (LOADS), by load parity
        # (step_flashmla_1p_tma) the spare slot: V's 512 columns of a step (64 of the 72 KiB a step loads; the
        # rope's 8 do not fit beside the rest)
        *([plgpu.SMEM((BLOCK_KV, 2 * V_HALF), jnp.bfloat16, transforms=t)] if tma else []),
        # (ring) kv_ready, kv_consumed: by slot
        *([plgpu.Barrier(num_arrivals=1, num_barriers=2), plgpu.Barrier(num_arrivals=2, num_barriers=2)]
          if ring else []),
    ]
    return probe_kernel(body, nwg, scratch, num_ctas, nwg)


def build_stream(probe: str, iters: int, num_ctas: int):
    """A stream probe (STREAMS): one warpgroup loads 64 KiB a iteration from the large buffer into `depth` slots,
    nothing else; it writes zeros (nothing to check but that it ran)."""
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    source, depth = STREAMS[probe]
    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def body(q_ref, k_ref, big_ref, o_ref, slots, bar):
        cta = lax.axis_index("cta")

        def step(i, carry):
            pl.when(i >= depth)(lambda: plgpu.barrier_wait(bar.at[lax.rem(i, depth)]))
            src = big_step(big_ref, cta, i, num_ctas, paired=source == "pairs",
                           window=L2_BLOCKS if source == "l2" else None).at[:, pl.ds(0, 2 * V_HALF)]
            plgpu.copy_gmem_to_smem(src, slots.at[lax.rem(i, depth)], bar.at[lax.rem(i, depth)])
            return carry

        lax.fori_loop(0, iters, step, 0)
        for j in range(max(iters - depth, 0), iters):  # (the last loads)
            plgpu.barrier_wait(bar.at[j % depth])
        zeros = plgpu.layout_cast(jnp.zeros((BLOCK_H,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        pl.when(cta == 0)(lambda: o_ref.__setitem__(0, zeros))

    scratch = [plgpu.SMEM((depth, BLOCK_KV, 2 * V_HALF), jnp.bfloat16, transforms=t),
               plgpu.Barrier(num_arrivals=1, num_barriers=depth)]
    return probe_kernel(body, 1, scratch, num_ctas, 1)


def expected_step(probe: str, iters: int, q, k):
    """What a step probe's warpgroups write, each as (value, tolerance): warpgroup 0 its P @ V half's row sums plus
    the softmax's row sums l (three_wg: l alone), the others their halves' row sums. The same KV step every iteration, so the row max settles on the
    first and each P @ V adds P (rounded to bf16) @ V. The tolerance allows every element of P one bf16 ulp of
    difference (the GPU's exp2.approx against numpy's exp2, before the rounding), twice over: a row sum of P @ V may
    cancel to far less than its terms. (A timing probe's check: it catches a wrong step, not a race between steps,
    which all compute the same values; the interpreted tests check the barriers.)"""
    import numpy as np

    import ml_dtypes

    q, k = (np.asarray(x, np.float64) for x in (q, k))
    s = (q @ k[:BLOCK_KV].T) * SCALE
    p = np.exp2(s - s.max(axis=1, keepdims=True))
    pb = p.astype(ml_dtypes.bfloat16).astype(np.float64)
    halves = []
    for c in (0, V_HALF):
        v = k[:BLOCK_KV, c:c + V_HALF]
        halves.append(((pb @ v).sum(axis=1) * iters, 2.0 ** -7 * (pb @ np.abs(v)).sum(axis=1) * iters))
    l_sum = p.sum(axis=1) * iters
    if probe == "step_three_wg":
        return [(l_sum, 1e-4 * l_sum), halves[1], halves[0]]
    (pv0, tol0), pv1 = halves
    return [(pv0 + l_sum, tol0 + 1e-4 * l_sum), pv1]  # warpgroup 0: its P @ V half's row sums + l


def expected(probe: str, iters: int, q, k):
    """Row sums numpy says each warpgroup writes (the softmax probes: the row sums l; None where it idles, or where
    a softmax warpgroup rewrites the 32-key P that it reads)."""
    import numpy as np

    if probe in STEPS:
        return expected_step(probe, iters, q, k)
    if probe in STREAMS:
        return [np.zeros(BLOCK_H)]
    q, k = (np.asarray(x, np.float64) for x in (q, k))
    work = PROBES[probe]
    out = []
    for kind in work:
        if kind is None:
            out.append(None)
            continue
        n = keys_of(kind)
        slots = 2 * BLOCK_KV // n
        counts = [len(range(j, iters, slots)) for j in range(slots)]  # iterations on each n-key slot
        blocks = [slice(j * n, (j + 1) * n) for j in range(slots)]
        if kind in V_COLS:
            if n == 32 and "qk32_sm" in work:
                out.append(None)
                continue
            c = slice(V_COLS[kind], V_COLS[kind] + V_HALF)
            p = [np.ones((BLOCK_H, n)) if n == 32 else k[r, 2 * V_HALF:] for r in blocks]
            out.append(sum(cnt * (p[j] @ k[r, c]) for j, (cnt, r) in enumerate(zip(counts, blocks))).sum(axis=1))
        elif kind.endswith("_sm"):
            m, l = np.full(BLOCK_H, -np.inf), np.zeros(BLOCK_H)
            for i in range(iters):
                s = (q @ k[blocks[i % slots]].T) * SCALE
                m_new = np.maximum(m, s.max(axis=1))
                l = l * np.exp2(m - m_new) + np.exp2(s - m_new[:, None]).sum(axis=1)
                m = m_new
            out.append(l)
        else:
            out.append((q @ k[blocks[(iters - 1) % slots]].T).sum(axis=1))
    return out


def matches(kind: str | None, got, want) -> bool:
    """Exact for the matmuls (small integers in fp32), to 1e-4 for the softmax's row sums (exp2.approx), the step
    probes to their tolerance (expected_step)."""
    import numpy as np

    if want is None:
        return True
    if kind is not None and kind.startswith("step"):  # (value, tolerance): see expected_step
        value, tol = want
        return bool(np.all(np.abs(got - value) <= tol))
    if kind.endswith("_sm"):
        return bool(np.allclose(got, want, rtol=1e-4, atol=0))
    return bool(np.array_equal(got, want))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.wgmma_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--probes", default=",".join(PROBES))
    p.add_argument("--random", action="store_true",
                   help="q and K from a normal distribution (rounded to bf16) instead of small integers: the step "
                        "probes' check holds either way (their tolerance is one bf16 ulp of P), the matmul probes' "
                        "exact one only on integers")
    add_probe_args(p)
    args = p.parse_args(argv)
    probes = parse_names(args.probes, PROBES, "--probes")
    lo, hi = parse_iters(args.iters)

    import jax.numpy as jnp
    import numpy as np

    if gpu_missing("wgmma_probe"):
        return 2
    q, k = operands(args.random)
    args_dev = tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k))
    big = (jnp.tile(args_dev[1][:BLOCK_KV], (HBM_ROWS // BLOCK_KV, 1)) if any(n in HBM_PROBES for n in probes)
           else None)
    rows = []
    for name in probes:
        f_lo, f_hi = build(name, lo, args.ctas), build(name, hi, args.ctas)
        inputs = args_dev + ((big,) if name in HBM_PROBES else ())
        got = np.asarray(f_hi(*inputs))
        want = expected(name, hi, q, k)
        exact = all(matches(kind, got[i], w) for i, (kind, w) in enumerate(zip(PROBES[name], want)))
        if not exact:  # how far off (each warpgroup's largest difference, over its largest expected magnitude)
            vals = [w[0] if isinstance(w, tuple) else w for w in want]
            print(f"{name}: not as expected; max |got - want| / max |want| by warpgroup: " + ", ".join(
                "-" if w is None else f"{np.abs(got[i] - w).max() / np.abs(w).max():.2e}" for i, w in enumerate(vals)))
        us, t_lo, t_hi = slope_time(f_lo, f_hi, inputs, lo, hi, args.reps)
        keys = max(keys_of(w) for w in PROBES[name])
        if name in STEPS:  # the scores and both P @ V halves
            flops = 2 * BLOCK_H * BLOCK_KV * (HEAD_DIM + 2 * V_HALF)
        else:
            flops = sum(2 * BLOCK_H * keys_of(w) * HEAD_DIM if w and w.startswith("qk")
                        else 2 * BLOCK_H * keys_of(w) * V_HALF if w in V_COLS else 0 for w in PROBES[name])
        rows.append(dict(probe=name, work=PROBES[name], us_per_iter=us, us_per_64_keys=us * BLOCK_KV / keys,
                         tflops_per_sm=flops / us * 1e-6, exact=exact, t_lo_ms=t_lo * 1e3, t_hi_ms=t_hi * 1e3,
                         iters=[lo, hi], ctas=args.ctas, values="random" if args.random else "integers"))
        if name in STREAMS:  # the bytes the SMs take in (the pairs: about half of it from HBM)
            rows[-1]["sm_ingress_tb_per_s"] = args.ctas * BLOCK_KV * 2 * V_HALF * 2 / us * 1e-6
    print(f"{'probe':<18} {'us/iter':>8} {'us/64 keys':>10} {'TFLOP/s/SM':>10} {'exact':>6}  ({args.ctas} CTAs)")
    for r in rows:
        ingress = f"  SM ingress {r['sm_ingress_tb_per_s']:.2f} TB/s" if "sm_ingress_tb_per_s" in r else ""
        print(f"{r['probe']:<18} {r['us_per_iter']:8.3f} {r['us_per_64_keys']:10.3f} {r['tflops_per_sm']:10.2f} "
              f"{str(r['exact']):>6}{ingress}")
    write_rows(args.json, rows)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
