"""python -m parity.timeline: what the GPU does during one timed launch of the bench, from the
JAX profiler's device trace (CUPTI sees the kernels of both stacks in one process).

    python -m parity.timeline --shapes H16_B32_S1024_q1,H128_B1_S1024_q1 --impls torch.fa3,jax.pallas_mosaic_gpu

Per implementation and shape: the bench's launch of n calls (bench.calibrate), its host-clock time per
call (t(n) / n, the median of 3 launches: the bench's number) and the slope between launches of n and
2n calls, then the n-call launch traced: per call, the kernels' summed device time (`busy`), the device span
from the first kernel's start to the last one's end (`span`) and the busy share of it. A span near the
host time with a low busy share means the launch waits on the host (gaps between kernels), so the host
decides the bench's number; a busy share near 1 means the device time is the kernels'. The launch runs
inside a profiler annotation (LAUNCH), so the trace also says how long the launch spends on the host
before its first kernel starts (`lead_us`) and after its last one ends (`tail_us`): where a launch's own
cost goes (session 5: 0.1-0.7 ms a launch of the JAX loop outside its kernels). The kernels are listed by
name with their mean time per call. GPU only.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import sys
import tempfile


def device_events(profile) -> list[tuple[str, float, float]]:
    """(name, start_ns, duration_ns) of every event on a device plane ("/device:GPU:*") of a
    jax.profiler.ProfileData, from its stream lines (not the summary lines XLA adds)."""
    events = []
    for plane in profile.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for e in line.events:
                events.append((e.name, float(e.start_ns), float(e.duration_ns)))
    return events


LAUNCH = "parity.timeline.launch"  # the host-side annotation around the traced launch


def launch_window(profile) -> tuple[float, float] | None:
    """(start_ns, end_ns) of the LAUNCH annotation on a host plane (the same clock as the device events)."""
    for plane in profile.planes:
        if plane.name.startswith("/device"):
            continue
        for line in plane.lines:
            for e in line.events:
                if e.name == LAUNCH:
                    return float(e.start_ns), float(e.start_ns + e.duration_ns)
    return None


def summarize(events, n_calls: int, window: tuple[float, float] | None = None) -> dict:
    """busy (summed kernel time), span (first start to last end) and kernel means, per call, in us; with the
    launch's host window, also what the launch spends before its first kernel starts (lead_us) and after its
    last one ends (tail_us), per launch, in us."""
    if not events:
        return dict(kernels=0)
    start = min(s for _, s, _ in events)
    end = max(s + d for _, s, d in events)
    busy = sum(d for _, _, d in events)
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for name, _, d in events:
        by_name[name][0] += 1
        by_name[name][1] += d
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:6]
    out = dict(kernels=len(events), busy_us=busy / n_calls / 1e3, span_us=(end - start) / n_calls / 1e3,
               busy_share=busy / max(end - start, 1.0),
               top=[dict(name=k[:80], per_call=c / n_calls, us_per_call=t / n_calls / 1e3) for k, (c, t) in top])
    if window is not None:
        out.update(lead_us=(start - window[0]) / 1e3, tail_us=(window[1] - end) / 1e3)
    return out


def trace_launch(run):
    """(device events, the launch's host window or None) of one run(), traced with the JAX profiler."""
    import jax
    from jax.profiler import ProfileData

    d = tempfile.mkdtemp(prefix="parity-timeline-")
    try:
        jax.profiler.start_trace(d)
        with jax.profiler.TraceAnnotation(LAUNCH):
            run()
        jax.profiler.stop_trace()
        [path] = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        profile = ProfileData.from_file(path)
        return device_events(profile), launch_window(profile)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    from parity import bench
    from parity.profile import parse_shape

    p = argparse.ArgumentParser(prog="python -m parity.timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", required=True, help="comma-separated shape names such as H16_B32_S1024_q1")
    p.add_argument("--impls", default="torch.fa3,jax.pallas_mosaic_gpu")
    p.add_argument("--json")
    args = p.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    impls = args.impls.split(",")
    for name in impls:
        if name not in bench.RUNNERS:
            p.error(f"--impls: {name!r} is not one of {', '.join(sorted(bench.RUNNERS))}")
    import torch

    if not torch.cuda.is_available():
        print("the timeline needs a CUDA GPU")
        return 2
    rows = []
    for shape in shapes:
        inp = bench.make_inputs(shape)
        for name in impls:
            timer, _ = bench.calibrate(bench.RUNNERS[name], inp, slope=True)
            run, n = timer.short, timer.n
            launch, slope = timer.measure(3)
            host_us, slope_us = launch * 1e6, slope * 1e6
            events, window = trace_launch(run)
            row = dict(shape=shape.name, impl=name, n_calls=n, host_us=host_us, slope_us=slope_us,
                       **summarize(events, n, window))
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
