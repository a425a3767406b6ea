"""What do Nsight Compute's counters say about exactly one call (or the bench's timed loop) of an implementation on a
bench shape? It runs the call once to compile and warm up, then once inside a CUDA profiler range, for ncu's
--profile-from-start off. On a GPU, from the checkout's root: `ncu --clock-control none --profile-from-start off
--section SpeedOfLight ... python -m tools.profile --impl jax.pallas_mosaic_gpu --shape H128_B64_S16384_q1
[--loop N] [--set field=value,...]`.
"""

from __future__ import annotations

DETAILS = """    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python -m tools.profile --impl jax.pallas_mosaic_gpu --shape H128_B64_S16384_q1

The implementation runs once to compile and warm up (outside the range), then once inside
`cudaProfilerStart` / `cudaProfilerStop`, so ncu sees the kernels of exactly one call.
`--loop N` profiles the bench's timed loop of N calls instead (N a multiple of 4: FA3 replays a CUDA
graph of N calls, JAX runs N calls in one jitted loop), to see what the bench times, e.g. whether
calls that share metadata share its kernels. `--set f=v,...` (a jax.pallas_* impl): the heuristic's tuning for the
shape with those fields replaced (as tools/sweep.py's --set).
"""

import argparse
import sys

from parity.shapes import parse_shape


def main(argv=None) -> int:
    from parity import timing
    from tools.sweep import parse_overrides

    p = argparse.ArgumentParser(prog="python -m tools.profile", description=__doc__,
                                epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", required=True, choices=sorted(timing.RUNNERS))
    p.add_argument("--shape", required=True, type=parse_shape)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--loop", type=int, default=0, metavar="N",
                   help="profile the bench's timed loop of N calls (a multiple of 4) instead of one call")
    p.add_argument("--set", dest="overrides", type=parse_overrides, default={},
                   help="(jax.pallas_* impls) MosaicConfig / TritonConfig fields replaced in the heuristic's pick")
    args = p.parse_args(argv)
    if args.overrides and not args.impl.startswith("jax.pallas_"):
        p.error(f"--set applies to the jax.pallas_* impls, got --impl {args.impl}")
    if args.loop < 0 or args.loop % 4:
        p.error(f"--loop must be a positive multiple of 4 (or 0: one call), got --loop {args.loop}")

    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    inp = timing.make_inputs(args.shape)
    runner = timing.RUNNERS[args.impl]
    if args.overrides:
        runner = _with_tuning(args.impl, inp, args.overrides)
    once, time_n = runner(inp)
    run = time_n(args.loop) if args.loop else once
    for _ in range(max(1, args.warmup)):
        run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    what = f"the timed loop of {args.loop} calls" if args.loop else "one call"
    with_set = f" with {args.overrides}" if args.overrides else ""
    print(f"profiled {what} of {args.impl} on {args.shape.name}{with_set}")
    return 0


def _with_tuning(impl: str, inp, overrides: dict):
    """The runner of `impl` (jax.pallas_<kernel>[.fp8]) on the heuristic's tuning for `inp` with `overrides`."""
    import importlib

    from parity import timing
    from parity.h200 import heuristic_tuning

    kernel, _, suffix = impl.removeprefix("jax.").partition(".")
    fp8 = suffix == "fp8"
    config = inp.config.replace(kv_cache_dtype="fp8_e4m3") if fp8 else inp.config
    tuning = heuristic_tuning(importlib.import_module(f"mla_jax.{kernel}"), config, inp.metadata, overrides)
    return timing.jax_kernel(kernel, tuning, fp8=fp8)


if __name__ == "__main__":
    sys.exit(main())
