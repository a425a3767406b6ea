"""Where does the Mosaic GPU kernel's step time go, per warpgroup: how long each named phase (kv_wait, qk, pv, the
waits, dequant) takes? It turns on Mosaic GPU's profiler for one call of the heuristic's tuning (with `--set`
fields replaced) and prints each region's mean time and count per warpgroup. On a GPU, from the checkout's root:
`python -m tools.regions --shapes H128_B32_S4096_q2 [--set field=value] [--space 240] [--json r.json]`.
"""

from __future__ import annotations

DETAILS = """    python -m tools.regions --shapes H128_B32_S4096_q2 --set num_splits=2 --space 240 --json r.json

The kernel's phases are `jax.named_scope` regions (kv_wait, qk, p_free_wait, pv, p_ready_wait, deq_wait,
dequant; mla_jax.pallas_mosaic_gpu's docstring). With `plgpu.CompilerParams(profile_space=..., profile_dir=...)`
each warpgroup of each block records them into a buffer in shared memory (`--space` ranges a warpgroup, 32
bytes a range for the kernel's two compute warpgroups; bounds-checked: ranges past it are dropped), written
as a Perfetto trace per call. This tool patches those parameters in for one call of the heuristic's tuning
(with `--set` fields replaced) and prints, per warpgroup, each region's mean time and count per trace.

Traces are grouped by warpgroup (the profiler numbers a block's warpgroups' traces consecutively: thread
id = 1 + warpgroup + warpgroups x block), and each region's mean is its own total over its own count, so
warpgroups that record different numbers of steps (the buffer fills after fewer steps for a warpgroup with
more regions a step) are not mixed. The shared memory the buffer takes must fit beside the kernel's (at H = 128 the q tile
and two stages leave none for it).
"""

import argparse
import collections
import dataclasses
import functools
import glob
import json
import os
import sys
import tempfile


def summarize(trace: dict, warpgroups: int | None = None) -> dict:
    """{role: {"traces": n, "span_us": mean span of a trace, "regions": {name: {"mean_us", "count"}}}}
    for a Perfetto trace of the Mosaic GPU profiler (B/E events per thread id = one warpgroup of a block).
    role: "wg<i>" with the kernel's number of warpgroups per block given (thread id = 1 + i + warpgroups x
    block), else the sorted region names of a trace joined by '+'. count: the region's ranges per trace."""
    per_tid = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") in ("B", "E"):
            per_tid[(e.get("pid"), e["tid"])].append(e)
    roles = {}
    for events in per_tid.values():
        events.sort(key=lambda e: e["ts"])
        totals = collections.defaultdict(lambda: [0.0, 0])
        stack = []
        for e in events:
            if e["ph"] == "B":
                stack.append(e)
            elif stack:
                b = stack.pop()
                totals[b["name"]][0] += e["ts"] - b["ts"]
                totals[b["name"]][1] += 1
        if not totals:
            continue
        tid = events[0]["tid"]
        role = f"wg{(tid - 1) % warpgroups}" if warpgroups else "+".join(sorted(totals))
        r = roles.setdefault(role, {"traces": 0, "span": 0.0, "tot": collections.defaultdict(lambda: [0.0, 0])})
        r["traces"] += 1
        r["span"] += events[-1]["ts"] - events[0]["ts"]
        for name, (t, c) in totals.items():
            r["tot"][name][0] += t
            r["tot"][name][1] += c
    return {role: {"traces": r["traces"], "span_us": r["span"] / r["traces"],
                   "regions": {name: {"mean_us": t / c, "count": c / r["traces"]}
                               for name, (t, c) in sorted(r["tot"].items())}}
            for role, r in sorted(roles.items())}


def parse_sets(text: str) -> dict:
    """'num_splits=2,transpose=scores' -> {'num_splits': 2, 'transpose': 'scores'}."""
    out = {}
    for item in filter(None, text.split(",")):
        field, sep, value = item.partition("=")
        if not sep or not field or not value:
            raise ValueError(f"--set takes field=value pairs separated by commas, got {item!r}")
        if value in ("True", "False"):
            out[field] = value == "True"
        else:
            try:
                out[field] = int(value)
            except ValueError:
                out[field] = value
    return out


def profile(shape, sets: dict, space: int, out_dir: str, fp8: bool = False) -> dict:
    """One call of the Mosaic kernel on `shape` (the heuristic's tuning with `sets` replaced) under the profiler."""
    import jax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from mla_jax import pallas_mosaic_gpu as mg
    from parity import timing
    from parity.h200 import with_overrides

    inp = timing.make_inputs(shape)
    md = inp.metadata
    config = inp.config.replace(kv_cache_dtype="fp8_e4m3") if fp8 else inp.config
    tuning = mg.heuristic_config(config, md.num_decode_tokens, md.max_blocks, md.num_reqs,
                                 max_query_len=md.max_query_len)
    tuning = with_overrides(tuning, sets)
    orig = plgpu.CompilerParams
    plgpu.CompilerParams = functools.partial(orig, profile_space=space, profile_dir=out_dir, profile_bounds_check=True)
    jax.clear_caches()
    try:
        once, _ = timing.jax_kernel("pallas_mosaic_gpu", tuning=tuning, fp8=fp8)(inp)
        once()
    finally:
        plgpu.CompilerParams = orig
        jax.clear_caches()
    files = sorted(glob.glob(os.path.join(out_dir, "*-trace.json")), key=os.path.getmtime)
    if not files:
        raise RuntimeError(f"the profiler wrote no trace under {out_dir}")
    with open(files[-1]) as f:
        trace = json.load(f)
    warpgroups = 2  # the kernel's per block
    return {"shape": shape.name, "tuning": dataclasses.asdict(tuning), "fp8": fp8, "profile_space": space,
            "roles": summarize(trace, warpgroups)}


def format_row(row: dict) -> str:
    lines = [f"{row['shape']} ({'fp8, ' if row['fp8'] else ''}profile_space={row['profile_space']})"]
    for role, r in row["roles"].items():
        lines.append(f"  {role}: {r['traces']} traces, span {r['span_us']:.1f} us")
        for name, g in r["regions"].items():
            lines.append(f"    {name:14s} {g['mean_us']:8.3f} us x {g['count']:.1f} a trace")
    return "\n".join(lines)


def main(argv=None) -> int:
    from parity.shapes import parse_shape

    p = argparse.ArgumentParser(prog="python -m tools.regions", description=__doc__,
                                epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", required=True, help="comma-separated shape names such as H128_B32_S4096_q2")
    p.add_argument("--set", dest="sets", type=parse_sets, default={},
                   help="MosaicConfig fields replaced in the heuristic's pick, e.g. transpose=scores,num_splits=2")
    p.add_argument("--space", type=int, default=240, help="profile_space: ranges a warpgroup (default 240)")
    p.add_argument("--fp8", action="store_true", help="on an fp8_e4m3 copy of the cache")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.space < 1:
        p.error(f"--space must be >= 1, got {args.space}")
    shapes = [parse_shape(n) for n in args.shapes.split(",")]
    import jax

    if jax.default_backend() != "gpu":
        print("the Mosaic GPU profiler needs a GPU")
        return 2
    rows = []
    for shape in shapes:
        with tempfile.TemporaryDirectory(prefix="parity-regions-") as d:
            try:
                row = profile(shape, args.sets, args.space, d, fp8=args.fp8)
            except Exception as e:  # a diagnostic: say why and go on
                row = {"shape": shape.name, "error": f"{type(e).__name__}: {e}"[:400]}
        rows.append(row)
        print(format_row(row) if "error" not in row else f"{shape.name}: {row['error']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
