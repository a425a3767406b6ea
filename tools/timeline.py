"""What does the GPU do during one timed launch of the bench: how much of the host-timed call is kernel time, how much
gaps between kernels, and what does the launch cost before its first kernel and after its last? It traces the
bench's N-call launch with the JAX profiler (CUPTI sees both stacks' kernels) and lists the kernels by name. On a
GPU, from the checkout's root: `python -m tools.timeline --shapes H16_B32_S1024_q1,H128_B1_S1024_q1 --impls
torch.fa3,jax.pallas_mosaic_gpu [--json t.json]`.
"""

from __future__ import annotations

DETAILS = """    python -m tools.timeline --shapes H16_B32_S1024_q1,H128_B1_S1024_q1 --impls torch.fa3,jax.pallas_mosaic_gpu

Per implementation and shape: the bench's launch of n calls (timing.calibrate), its host-clock time per
call (t(n) / n, the median of 3 launches: the bench's number) and the slope between launches of n and
2n calls, then the n-call launch traced: per call, the kernels' summed device time (`busy`), the device span
from the first kernel's start to the last one's end (`span`) and the busy share of it. A span near the
host time with a low busy share means the launch waits on the host (gaps between kernels), so the host
decides the bench's number; a busy share near 1 means the device time is the kernels'. The launch runs
inside a profiler annotation (LAUNCH), so the trace also says how long the launch spends on the host
before its first kernel starts (`lead_us`) and after its last one ends (`tail_us`): where a launch's own
cost goes (on the H200, 0.1-0.7 ms a launch of the JAX loop outside its kernels). The kernels are listed by
name with their mean time per call. GPU only.
"""

import argparse
import json
import os
import sys

from parity import timing
from parity.shapes import parse_shape


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.timeline", description=__doc__,
                                epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", required=True, help="comma-separated shape names such as H16_B32_S1024_q1")
    p.add_argument("--impls", default="torch.fa3,jax.pallas_mosaic_gpu")
    p.add_argument("--json")
    args = p.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    impls = args.impls.split(",")
    for name in impls:
        if name not in timing.RUNNERS:
            p.error(f"--impls: {name!r} is not one of {', '.join(sorted(timing.RUNNERS))}")
    import torch

    if not torch.cuda.is_available():
        print("the timeline needs a CUDA GPU")
        return 2
    rows = []
    for shape in shapes:
        inp = timing.make_inputs(shape)
        for name in impls:
            timer, _ = timing.calibrate(timing.RUNNERS[name], inp, slope=True)
            run, n = timer.short, timer.n
            launch, slope = timer.measure(3)
            host_us, slope_us = launch * 1e6, slope * 1e6
            events, window = timing.trace_launch(run)
            row = dict(shape=shape.name, impl=name, n_calls=n, host_us=host_us, slope_us=slope_us,
                       **timing.summarize(events, n, window))
            rows.append(row)
            if row["kernels"]:
                edges = (f"  launch: {row['lead_us']:.0f} us before the first kernel, {row['tail_us']:.0f} after the last"
                         if "lead_us" in row else "")
                print(f"{shape.name:<20} {name:<22} host {host_us:8.1f} us  slope {slope_us:8.1f}  busy {row['busy_us']:8.1f}  span "
                      f"{row['span_us']:8.1f}  busy/span {row['busy_share']:.2f}  kernels/call {row['kernels'] / n:.1f}{edges}")
                for k in row["top"]:
                    print(f"    {k['us_per_call']:8.2f} us/call  x{k['per_call']:.2f}  {k['name']}")
            else:
                print(f"{shape.name:<20} {name:<22} host {host_us:8.1f} us  (no device events traced)")
        del inp
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"xla_flags": os.environ.get("XLA_FLAGS", ""), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
