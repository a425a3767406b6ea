"""How fast do the SMs take in KV steps by TMA, by the width and pitch of the boxes' rows: would the L2 cap the fp8
kernel before HBM does, and which ring layout loads fastest? A GPU diagnosis of the fp8 kernel's memory side (not a
test): each CTA streams KV steps of a large buffer into shared-memory slots in one of PROBES' layouts, and the TB/s
is the slope over two iteration counts. On a Hopper GPU, from the checkout's root:
`python -m tools.tma_probe [--probes fp8_64_x4,bf16_128_x2] [--json out.json]`.
"""

from __future__ import annotations

DETAILS = """An ncu report of the 16-row fp8 kernel (H16 B128 S16384) has the L2 at 88% of its peak with DRAM at 73%:
the fp8 ring (8 x 64 fp8 tiles, a 64-byte swizzle) has the TMA bring each KV step as 9 boxes of 64-byte rows, as
many L2 requests (18.9M) as the bf16 kernel's 128-byte rows bring twice the bytes in (L2 tag requests 60% of their
peak, bf16's 44%). Would the L2 cap the fp8 kernel before HBM does? Here each CTA (one per SM) has one warpgroup
stream 64-row KV steps of a large buffer [HBM_ROWS, 576] (fp8: 604 MB, bf16: 1.2 GB; the H200's L2 is 50 MB), each
CTA its own steps, into `depth` shared-memory slots (a load awaited `depth` iterations after its issue), and nothing
else; the SMs' intake is the TB/s reported (the slope over two iteration counts, tools/convert_probe.py's timer).

* "fp8_64_xD": the fp8 kernel's ring layout: 9 boxes of [64, 64] fp8 a step (64-byte rows), rows 576 bytes apart
  as in the cache;
* "fp8_64p_xD": the same from a buffer whose rows are 640 bytes apart (each row's 576 bytes loaded);
* "fp8_128p_xD": the step's 512 latent columns in 8 x 128 tiles with a 128-byte swizzle (4 boxes of [64, 128]:
  128-byte rows) and its 64 rope columns as fp8_64's (1 box), from the 640-byte rows: what a ring of wider boxes
  would load (Mosaic GPU's TMA wants the buffer's row a multiple of the box's 128 columns: 576 is not; the kernel
  would need a descriptor of the first 512 columns, mgpu's TileTransform with Rounding.DOWN, which Pallas does not
  expose);
* "fp8_flat_xD": the cache's own rows (576 bytes apart) seen as a flat array of 128-byte rows (a free reshape of
  the cache, [rows x 576 / 128, 128]): a 64-row step is 288 such rows, 2 boxes of 128-byte rows ([256, 128] and
  [32, 128], 128-byte swizzle), the step's bytes in shared memory in their order in the cache (a ring of this layout
  would address a token's columns at byte 576 t + c, its own ldmatrix addresses);
* "bf16_128_xD": the bf16 kernel's ring (8 x 64 bf16 tiles, 128-byte swizzle: 9 boxes, 128-byte rows), the bf16
  reference;
* "fp8_64_pfA_xD": fp8_64's loads, each step's bytes first prefetched into the L2 through the flat view
  (`cp.async.bulk.prefetch.tensor`, 2 boxes of 128-byte rows: plgpu.async_prefetch), the step A iterations ahead of
  the one loaded (A = 0: just before its own loads). One H200 run had fp8_64 at 3.60 TB/s and fp8_flat at
  4.70: if the 64-byte boxes' L2 misses (half lines, no L2 promotion in Mosaic GPU's descriptors) are what caps the
  intake, a prefetch of whole lines lifts it with the ring's layout unchanged (another H200 run: fp8_64 3.49, pf0
  3.67, pf4 3.58, flat 4.26; in the kernel, MosaicConfig.prefetch_lines, 0.95-0.97x: removed);
* "fp8_128r_xD": fp8_128p's boxes (the latent columns in 128-byte rows, the rope in 64-byte ones) from
  the cache's own 576-byte rows: the latent's TMA descriptor covers the first 512 columns of each row (Mosaic GPU's
  TileTransform((8, 128), rounding=Rounding.DOWN)), which Pallas does not expose: `_round_down_tiling()` here, a
  TilingTransform whose copies lower to that rounding. The layout of a ring tried in the kernel and dropped
  (its shim lives here); odd tokens' rows start 64 bytes into an L2 line.
* "fp8_pair_xD": the cache's rows two tokens a row, a free reshape to [rows / 2, 1152] (1152 bytes:
  9 L2 lines), a 64-row step its 32 pair rows in one copy of 8 x 128 tiles with a 128-byte swizzle (Mosaic GPU
  issues it as 9 boxes of [32, 128]): every box row a whole line, the bf16 ring's boxes and pitch (bf16_128) at half
  the rows. A ring of this layout would hold token 2 p + h's column c at pair row p, byte 576 h + c.
D is the slots in flight: the 16-row fp8 kernel keeps 4 (two a warpgroup), the bf16 one 2 (the same bytes).
fp8_64p against fp8_128p is the boxes' width alone; fp8_64 against fp8_64p the rows' pitch.
After the last load each CTA copies its last slot back out, and the result is checked against the buffer's step
(every step of the buffer holds the same values).
"""

import argparse
import sys

from tools.convert_probe import (add_probe_args, gpu_missing, parse_iters, parse_names, random_e4m3_bits, slope_time,
                                  write_rows)

BLOCK_KV, HEAD_DIM, KV_LORA_RANK = 64, 576, 512
HBM_ROWS = 1 << 20  # the large buffer's rows
PADDED = 640  # the padded buffers' row (a multiple of 128 columns)
FLAT = 128  # (fp8_flat) the flat view's row, in fp8 values
# probe -> (dtype name, box row bytes, slots in flight, the buffer's row in elements, view: the step loaded as rows of
# the cache's view [rows x 576 / view, view] (0: the cache's own rows; fp8_flat's 128, fp8_pair's 1152), prefetch:
# how many iterations ahead each step is prefetched into the L2 (None: not))
PAIR = 2 * HEAD_DIM  # (fp8_pair) the pair view's row: two tokens
PROBES = {"fp8_64_x4": ("float8_e4m3fn", 64, 4, HEAD_DIM, 0, None),
          "fp8_64p_x4": ("float8_e4m3fn", 64, 4, PADDED, 0, None),
          "fp8_128p_x4": ("float8_e4m3fn", 128, 4, PADDED, 0, None),
          "fp8_flat_x4": ("float8_e4m3fn", 128, 4, HEAD_DIM, FLAT, None),
          "fp8_64p_x2": ("float8_e4m3fn", 64, 2, PADDED, 0, None),
          "fp8_128p_x2": ("float8_e4m3fn", 128, 2, PADDED, 0, None),
          "fp8_flat_x2": ("float8_e4m3fn", 128, 2, HEAD_DIM, FLAT, None),
          "bf16_128_x2": ("bfloat16", 128, 2, HEAD_DIM, 0, None),
          "fp8_64_pf0_x4": ("float8_e4m3fn", 64, 4, HEAD_DIM, 0, 0),
          "fp8_64_pf4_x4": ("float8_e4m3fn", 64, 4, HEAD_DIM, 0, 4),
          "fp8_64_pf0_x2": ("float8_e4m3fn", 64, 2, HEAD_DIM, 0, 0),
          "fp8_128r_x4": ("float8_e4m3fn", 128, 4, HEAD_DIM, 0, None),
          "fp8_128r_x2": ("float8_e4m3fn", 128, 2, HEAD_DIM, 0, None),
          "fp8_pair_x4": ("float8_e4m3fn", 128, 4, HEAD_DIM, PAIR, None),
          "fp8_pair_x2": ("float8_e4m3fn", 128, 2, HEAD_DIM, PAIR, None)}
FLAT_STEP_ROWS = BLOCK_KV * HEAD_DIM // FLAT  # a 64-row step's rows of the flat view: 288


def step_bytes(probe: str) -> int:
    """The bytes of one 64-row KV step of the probe's dtype."""
    return BLOCK_KV * HEAD_DIM * (1 if PROBES[probe][0].startswith("float8") else 2)


_ROUND_DOWN_TILING = []


def _round_down_tiling():
    """(fp8_128r) A plgpu.TilingTransform subclass whose TMA copies tile the GMEM ref with Mosaic GPU's
    TileTransform(tiling, rounding=Rounding.DOWN): a descriptor of each row's first whole tiles, the cache's first 512
    of its 576 columns in tiles of 128 (the probe's; the layout of a ring tried in the kernel and dropped). Pallas maps every TilingTransform to TileTransform(tiling) without rounding
    (jax/_src/pallas/mosaic_gpu/core.py's to_gpu_transform, which the copy lowering looks up at each call) and refuses
    a row that is not a multiple of the tile; this wraps that function once, for the subclass alone (its Untiling twin
    keeps the class through Pallas's undo of the ref's transforms). Made on first use; written against jax 0.11.2's
    internals."""
    if _ROUND_DOWN_TILING:
        return _ROUND_DOWN_TILING[0]
    import dataclasses

    from jax import tree_util
    from jax._src.pallas.mosaic_gpu import core as gpu_core
    from jax.experimental.mosaic.gpu import launch_context
    from jax.experimental.pallas import mosaic_gpu as plgpu

    @dataclasses.dataclass(frozen=True)
    class RoundDownTiling(plgpu.TilingTransform):
        def undo(self, x):
            return RoundDownUntiling(self.tiling)

    @tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class RoundDownUntiling(gpu_core.UntilingTransform):
        def undo(self, x):
            return RoundDownTiling(self.tiling)

    base = gpu_core.to_gpu_transform

    def to_gpu_transform(t):
        if isinstance(t, RoundDownTiling):
            return launch_context.TileTransform(t.tiling, rounding=launch_context.Rounding.DOWN)
        return base(t)

    gpu_core.to_gpu_transform = to_gpu_transform
    _ROUND_DOWN_TILING.append(RoundDownTiling)
    return RoundDownTiling


def build(probe: str, iters: int, num_ctas: int):
    """The probe's jitted kernel: big [rows, pitch] -> the last step each CTA loaded, [num_ctas, 64, pitch] (its
    first 576 columns; the rest unwritten)."""
    if PROBES[probe][4]:
        return _build_flat(probe, iters, num_ctas)
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from mla_jax.pallas_mosaic_gpu import prefetch_to_l2

    dtype_name, row_bytes, depth, pitch, _, ahead = PROBES[probe]
    dtype = jnp.dtype(dtype_name)
    tiles = lambda cols, swizzle, tiling=plgpu.TilingTransform: (tiling((8, cols)), plgpu.SwizzleTransform(swizzle))
    # (fp8_128r: the latent's descriptor rounded down to its 512 columns, the dropped wide ring's slot)
    rounded = row_bytes == 128 and dtype.itemsize == 1 and pitch % 128
    tiles_128 = tiles(128, 128, _round_down_tiling() if rounded else plgpu.TilingTransform)
    # the slots: one [depth, 64, 576] ring, or (fp8_128) the latent columns and the rope columns apart (576 is not a
    # multiple of 128)
    if dtype.itemsize == 2:
        parts = [(0, HEAD_DIM, tiles(64, 128))]
    elif row_bytes == 64:
        parts = [(0, HEAD_DIM, tiles(64, 64))]
    else:
        parts = [(0, KV_LORA_RANK, tiles_128), (KV_LORA_RANK, HEAD_DIM - KV_LORA_RANK, tiles(64, 64))]

    def body(*refs):
        if ahead is None:
            big_ref, out_ref, *scratch = refs
        else:
            big_ref, flat_ref, out_ref, *scratch = refs
        *slots, bar = scratch
        cta = lax.axis_index("cta")
        blocks = big_ref.shape[0] // BLOCK_KV

        def step(i, carry):
            pl.when(i >= depth)(lambda: plgpu.barrier_wait(bar.at[lax.rem(i, depth)]))
            blk = lax.rem(cta + i * num_ctas, blocks)
            if ahead is not None:  # (the step `ahead` iterations on: its 288 flat rows, in boxes of 256 rows at most)
                first = pl.multiple_of(lax.rem(cta + (i + ahead) * num_ctas, blocks) * FLAT_STEP_ROWS, 32)
                prefetch_to_l2(flat_ref.at[pl.ds(first, FLAT_STEP_ROWS)])
            src = big_ref.at[pl.ds(pl.multiple_of(blk * BLOCK_KV, BLOCK_KV), BLOCK_KV)]
            for (c0, nc, _), slot in zip(parts, slots):
                plgpu.copy_gmem_to_smem(src.at[:, pl.ds(c0, nc)], slot.at[lax.rem(i, depth)],
                                        bar.at[lax.rem(i, depth)])
            return carry

        lax.fori_loop(0, iters, step, 0)
        for j in range(max(iters - depth, 0), iters):  # (the last loads)
            plgpu.barrier_wait(bar.at[j % depth])
        last = (iters - 1) % depth
        for (c0, nc, _), slot in zip(parts, slots):
            plgpu.copy_smem_to_gmem(slot.at[last], out_ref.at[cta, :, pl.ds(c0, nc)])
        plgpu.wait_smem_to_gmem(0)

    scratch = [plgpu.SMEM((depth, BLOCK_KV, nc), dtype, transforms=t) for _, nc, t in parts]
    scratch.append(plgpu.Barrier(num_arrivals=len(parts), num_barriers=depth))
    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((num_ctas, BLOCK_KV, pitch), dtype),
        scratch_types=scratch,
        grid=(num_ctas,),
        grid_names=("cta",),
        num_threads=1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
    )
    if ahead is None:
        return jax.jit(kernel)
    return jax.jit(lambda big: kernel(big, big.reshape(big.shape[0] * HEAD_DIM // FLAT, FLAT)))


def _build_flat(probe: str, iters: int, num_ctas: int):
    """(fp8_flat, fp8_pair) The probe's jitted kernel on the cache-shaped buffer [rows, 576], which it reshapes (free)
    to its view [rows x 576 / view, view]: fp8_flat's [rows x 4.5, 128], each step's 288 flat rows in two TMAs
    ([256, 128] and [32, 128]: a box has at most 256 rows); fp8_pair's [rows / 2, 1152], each step's 32 pair rows in
    one; the last step each CTA loaded back out, [num_ctas, 64, 576]."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    dtype_name, _, depth, _, view, _ = PROBES[probe]
    dtype = jnp.dtype(dtype_name)
    step_rows = BLOCK_KV * HEAD_DIM // view
    boxes = tuple((r0, min(256, step_rows - r0)) for r0 in range(0, step_rows, 256))

    def body(flat_ref, out_ref, slots, bar):
        cta = lax.axis_index("cta")
        blocks = flat_ref.shape[0] // step_rows

        def step(i, carry):
            pl.when(i >= depth)(lambda: plgpu.barrier_wait(bar.at[lax.rem(i, depth)]))
            blk = lax.rem(cta + i * num_ctas, blocks)
            first = pl.multiple_of(blk * step_rows, 32)  # (both views' steps: multiples of 32 rows)
            for r0, nr in boxes:
                plgpu.copy_gmem_to_smem(flat_ref.at[pl.ds(first + r0, nr)],
                                        slots.at[lax.rem(i, depth), pl.ds(r0, nr)], bar.at[lax.rem(i, depth)])
            return carry

        lax.fori_loop(0, iters, step, 0)
        for j in range(max(iters - depth, 0), iters):  # (the last loads)
            plgpu.barrier_wait(bar.at[j % depth])
        plgpu.copy_smem_to_gmem(slots.at[(iters - 1) % depth], out_ref.at[cta])
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((num_ctas, step_rows, view), dtype),
        scratch_types=[plgpu.SMEM((depth, step_rows, view), dtype,
                                  transforms=(plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))),
                       plgpu.Barrier(num_arrivals=len(boxes), num_barriers=depth)],
        grid=(num_ctas,),
        grid_names=("cta",),
        num_threads=1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
    )

    def run(big):
        out = kernel(big.reshape(big.shape[0] * HEAD_DIM // view, view))
        return out.reshape(num_ctas, BLOCK_KV, HEAD_DIM)

    return jax.jit(run)


def big_buffer(probe: str, rows: int = HBM_ROWS):
    """(the large buffer [rows, pitch] as a device array, its step [64, 576] as numpy): rows / 64 copies of one random
    64-row step (fp8: random finite e4m3 bits; bf16: normal values), padded with zeros to the probe's pitch."""
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    if PROBES[probe][0].startswith("float8"):
        step = random_e4m3_bits((BLOCK_KV, HEAD_DIM)).view(ml_dtypes.float8_e4m3fn)
    else:
        step = np.random.default_rng(0).standard_normal((BLOCK_KV, HEAD_DIM)).astype(ml_dtypes.bfloat16)
    pitch = PROBES[probe][3]
    padded = jnp.pad(jnp.asarray(step), ((0, 0), (0, pitch - HEAD_DIM)))
    return jnp.tile(padded, (rows // BLOCK_KV, 1)), step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.tma_probe", description=__doc__,
                                epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", default=",".join(PROBES))
    add_probe_args(p)
    args = p.parse_args(argv)
    probes = parse_names(args.probes, PROBES, "--probes")
    lo, hi = parse_iters(args.iters)

    import numpy as np

    if gpu_missing("tma_probe"):
        return 2
    rows = []
    for name in probes:
        big, step = big_buffer(name)
        f_lo, f_hi = build(name, lo, args.ctas), build(name, hi, args.ctas)
        got = np.ascontiguousarray(np.asarray(f_hi(big))[:, :, :HEAD_DIM])
        exact = bool((got.view(np.uint8) == np.broadcast_to(step, got.shape).view(np.uint8)).all())
        us, t_lo, t_hi = slope_time(f_lo, f_hi, (big,), lo, hi, args.reps)
        tb_s = args.ctas * step_bytes(name) / us * 1e-6
        rows.append(dict(probe=name, dtype=PROBES[name][0], box_row_bytes=PROBES[name][1], depth=PROBES[name][2],
                         pitch=PROBES[name][3], view=PROBES[name][4], prefetch_ahead=PROBES[name][5],
                         us_per_step=us, sm_ingress_tb_per_s=tb_s, exact=exact, t_lo_ms=t_lo * 1e3,
                         t_hi_ms=t_hi * 1e3, iters=[lo, hi], ctas=args.ctas))
        del big
    print(f"{'probe':<12} {'us/step':>8} {'TB/s':>6} {'exact':>6}  (a 64-row step a CTA an iteration, {args.ctas} CTAs)")
    for r in rows:
        print(f"{r['probe']:<12} {r['us_per_step']:8.3f} {r['sm_ingress_tb_per_s']:6.2f} {str(r['exact']):>6}")
    write_rows(args.json, rows)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
