"""How fast does a CTA turn one fp8 KV step into f16 in shared memory, and is that conversion bound by the SM's
pipes or by one warpgroup's issue? A GPU diagnosis of the Mosaic GPU fp8 kernel's per-step conversion (not a test),
whose timer and helpers the TMA probe shares. On a Hopper GPU, from the checkout's root:
`python -m tools.convert_probe [--methods cvt,copy,cvt_wg0] [--json out.json]`.
"""

from __future__ import annotations

DETAILS = """Each CTA (two warpgroups, one per SM) holds two fp8 steps [64, 576] (the kernel's ring layout: 8 x 64 tiles,
64-byte swizzle) and two f16 steps (the wgmma layout: 8 x 64 tiles, 128-byte swizzle). Each iteration, each
warpgroup converts its columns of one fp8 step (as the kernel splits them: warpgroup 0 the rope chunk and the
first V half, 1 the second) into one f16 step, chunk by chunk (load in the WGMMA_8BIT layout, convert, store),
then fences (commit_smem), as the kernel's dequantization does. The time of an iteration is the slope of the
kernel's time over the iteration count (the launch and set-up cancel), one CTA per SM on every SM.

Methods: "cvt" (astype: cvt.rn.f16x2.e4m3x2), "copy" (the fp8 bytes stored unconverted into an fp8 buffer: the
loads and stores without a conversion, half the bytes stored); "cvt_wg0": warpgroup 0 converts all 9 chunks and
warpgroup 1 none (is one warpgroup's conversion bound by the SM's pipes, or by its own issue and latency?).
Each converted f16 step is checked bit for bit against numpy's conversion.
"""

import argparse
import json
import sys
import time

METHODS = ("cvt", "copy", "cvt_wg0")
BLOCK_KV, HEAD_DIM = 64, 576


def build(method: str, iters: int, num_ctas: int):
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    layout = plgpu.Layout.WGMMA_8BIT
    fp8_t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(64))
    f16_t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    out_dtype = jnp.float8_e4m3fn if method == "copy" else jnp.float16

    def body(x_ref, o_ref, x_smem, y_smem, bar, done):
        wg = lax.axis_index("wg")
        cta = lax.axis_index("cta")

        @pl.when(wg == 0)
        def _():
            for s in range(2):
                plgpu.copy_gmem_to_smem(x_ref.at[s], x_smem.at[s], bar)

        plgpu.barrier_wait(bar)
        # warpgroup 0: rope, V half 0; 1: V half 1 (the *_wg0 methods: all of them warpgroup 0's)
        chunks = [[8, 0, 1, 2, 3, 4, 5, 6, 7], []] if method.endswith("_wg0") else [[8, 0, 1, 2, 3], [4, 5, 6, 7]]
        kind = method.removesuffix("_wg0")

        def one(w, i):
            slot = lax.rem(i, jnp.int32(2))
            for c in chunks[w]:
                x = plgpu.load(x_smem.at[slot, :, pl.ds(c * 64, 64)], layout=layout)
                y = x.astype(jnp.float16) if kind == "cvt" else x
                y_smem.at[slot, :, pl.ds(c * 64, 64)][...] = y
            plgpu.commit_smem()

        for w in range(2):
            @pl.when(wg == w)
            def _(w=w):
                @pl.loop(0, iters)
                def _(i):
                    one(w, i)

                plgpu.barrier_arrive(done)

        @pl.when((wg == 0) & (cta == 0))
        def _():
            plgpu.barrier_wait(done)
            for s in range(2):
                plgpu.copy_smem_to_gmem(y_smem.at[s], o_ref.at[s])
            plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((2, BLOCK_KV, HEAD_DIM), out_dtype),
        scratch_types=[
            plgpu.SMEM((2, BLOCK_KV, HEAD_DIM), jnp.float8_e4m3fn, transforms=fp8_t),
            plgpu.SMEM((2, BLOCK_KV, HEAD_DIM), out_dtype, transforms=fp8_t if method == "copy" else f16_t),
            plgpu.Barrier(num_arrivals=2),  # bar: the two fp8 steps loaded
            plgpu.Barrier(num_arrivals=2),  # done: both warpgroups' last iteration stored
        ],
        grid=(num_ctas,),
        grid_names=("cta",),
        num_threads=2,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
    )
    return jax.jit(kernel)


def median_time(fn, args: tuple, reps: int) -> float:
    """Median wall time of fn(*args) over `reps` calls, after one warm-up call (the probes' timer)."""
    fn(*args).block_until_ready()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args).block_until_ready()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def slope_time(f_lo, f_hi, args: tuple, lo: int, hi: int, reps: int) -> tuple[float, float, float]:
    """(us an iteration, t_lo, t_hi): the slope of the median times (seconds) of f_lo and f_hi, the same kernel at
    lo and hi iterations (the launch and set-up cancel)."""
    t_lo, t_hi = median_time(f_lo, args, reps), median_time(f_hi, args, reps)
    return (t_hi - t_lo) / (hi - lo) * 1e6, t_lo, t_hi


def add_probe_args(p: argparse.ArgumentParser):
    """The probes' shared options: --iters, --ctas, --reps, --json."""
    p.add_argument("--iters", default="200,2200", help="two iteration counts; the slope between them is timed")
    p.add_argument("--ctas", type=int, default=132, help="CTAs (one per SM on the H200)")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--json", default=None)


def write_rows(path: str | None, rows: list):
    """A probe's rows, with the device's kind, as JSON at `path` (None: nowhere)."""
    if path:
        import jax

        with open(path, "w") as f:
            json.dump(dict(device=str(jax.devices()[0].device_kind), rows=rows), f, indent=1)


def random_e4m3_bits(shape):
    """Random e4m3 bit patterns (uint8) of `shape`, seeded (0), with no NaN (0x7F / 0xFF become 0x3C, 1.5): the
    probes check their results bit for bit, where NaN differs by design."""
    import numpy as np

    bits = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0x3C
    return bits


def parse_names(text: str, known, flag: str) -> list[str]:
    """--probes / --methods 'a,b': the names, each one of `known` (else a ValueError naming it)."""
    names = text.split(",")
    for name in names:
        if name not in known:
            raise ValueError(f"{flag}: {name!r} is not one of {tuple(known)}")
    return names


def gpu_missing(prog: str) -> bool:
    """True, said on stderr, where JAX has no GPU (a probe's main then returns 2)."""
    import jax

    if jax.default_backend() == "gpu":
        return False
    print(f"{prog}: needs a GPU (JAX's default backend is {jax.default_backend()!r})", file=sys.stderr)
    return True


def parse_iters(text: str) -> tuple[int, int]:
    """--iters 'lo,hi': the two iteration counts whose time difference the probes divide by hi - lo."""
    lo, hi = (int(x) for x in text.split(","))
    if not 0 < lo < hi:
        raise ValueError(f"--iters must be two counts 0 < lo < hi, got {text!r}")
    return lo, hi


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.convert_probe", description=__doc__,
                                epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=",".join(METHODS))
    add_probe_args(p)
    args = p.parse_args(argv)
    methods = parse_names(args.methods, METHODS, "--methods")
    lo, hi = parse_iters(args.iters)

    import jax
    import ml_dtypes
    import numpy as np

    if gpu_missing("convert_probe"):
        return 2

    bits = random_e4m3_bits((2, BLOCK_KV, HEAD_DIM))
    fp8 = bits.view(ml_dtypes.float8_e4m3fn)
    x = jax.numpy.asarray(fp8)
    cvt = fp8.astype(np.float16)
    want = {"cvt": cvt, "copy": fp8, "cvt_wg0": cvt}
    rows = []
    for m in methods:
        f_lo, f_hi = build(m, lo, args.ctas), build(m, hi, args.ctas)
        got = np.asarray(f_hi(x))
        exact = bool((got.view(np.uint8) == want[m].view(np.uint8)).all())
        us, t_lo, t_hi = slope_time(f_lo, f_hi, (x,), lo, hi, args.reps)
        rows.append(dict(method=m, us_per_step=us, exact=exact, t_lo_ms=t_lo * 1e3, t_hi_ms=t_hi * 1e3,
                         iters=[lo, hi], ctas=args.ctas))
    print(f"{'method':<9} {'us/step':>8} {'exact':>6}  (one [64, 576] fp8 step a CTA, {args.ctas} CTAs)")
    for r in rows:
        print(f"{r['method']:<9} {r['us_per_step']:8.3f} {str(r['exact']):>6}")
    write_rows(args.json, rows)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
