"""Session 7, call D: where a compute-bound step of the Mosaic kernel goes (H = 128), with P in the KV slot's
rope columns (MosaicConfig(p_in_kv=True)), which frees the 7 KiB the profiler's buffer needs there.

The Mosaic GPU profiler (CompilerParams profile_space / profile_dir, patched in here only; 240 ranges per
warpgroup, bounds-checked: the first ~80 steps of warpgroup 0 in each block) records the kernel's named scopes
(kv_wait, qk, pv in warpgroup 0; p_ready_wait, pv in warpgroup 1); this prints each region's mean time per
step and the traced span per block."""
import collections
import dataclasses
import functools
import glob
import json
import os

import jax
from jax.experimental.pallas import mosaic_gpu as plgpu

from mla_jax import pallas_mosaic_gpu as mg
from parity import bench

OUT = os.environ.get("OUT", "/tmp/out")
ORIG = plgpu.CompilerParams


def regions(path):
    """{warpgroup kind: {region: (total us, count)}} and the traced span per block (us, mean)."""
    ev = json.load(open(path))["traceEvents"]
    per_tid = collections.defaultdict(list)
    for e in ev:
        per_tid[e["tid"]].append(e)
    out = {"wg0": collections.defaultdict(lambda: [0.0, 0]), "wg1": collections.defaultdict(lambda: [0.0, 0])}
    spans = []
    for tid, es in per_tid.items():
        names = {e["name"] for e in es}
        kind = "wg0" if "qk" in names else ("wg1" if "p_ready_wait" in names else None)
        if kind is None:
            continue
        stack = []
        for e in es:
            if e["ph"] == "B":
                stack.append(e)
            else:
                b = stack.pop()
                out[kind][b["name"]][0] += e["ts"] - b["ts"]
                out[kind][b["name"]][1] += 1
        spans.append(es[-1]["ts"] - es[0]["ts"])
    return out, sum(spans) / max(len(spans), 1)


def profile(tag, shape, p_in_kv):
    pdir = f"{OUT}/prof/{tag}"
    os.makedirs(pdir, exist_ok=True)
    inp = bench.make_inputs(shape)
    md = inp.metadata
    tuning = mg.heuristic_config(inp.config, md.num_decode_tokens, md.max_blocks, md.num_reqs,
                                 max_query_len=md.max_query_len)
    tuning = dataclasses.replace(tuning, p_in_kv=p_in_kv)
    plgpu.CompilerParams = functools.partial(ORIG, profile_space=240, profile_dir=pdir, profile_bounds_check=True)
    jax.clear_caches()
    try:
        once, _ = bench._jax_kernel("pallas_mosaic_gpu", tuning=tuning)(inp)
        once()
    finally:
        plgpu.CompilerParams = ORIG
    files = sorted(glob.glob(f"{pdir}/*-trace.json"))
    if not files:
        print(tag, "no trace", flush=True)
        return None
    reg, span = regions(files[-1])
    steps = reg["wg0"]["qk"][1]
    row = {"tag": tag, "tuning": repr(tuning), "steps": steps, "span_us_per_block": span}
    for kind in ("wg0", "wg1"):
        for name, (tot, cnt) in sorted(reg[kind].items()):
            row[f"{kind}.{name}"] = tot / max(steps, 1)
    print(json.dumps(row), flush=True)
    return row


rows = []
for shape in (bench.Shape(128, 64, 16384), bench.Shape(128, 32, 4096, 2)):
    tag = f"H{shape.num_heads}_B{shape.batch}_S{shape.seq_len}_q{shape.q_len}_p_in_kv"
    try:
        r = profile(tag, shape, True)
        if r:
            rows.append(r)
    except Exception as e:  # noqa: BLE001 (a diagnostic: print and go on)
        print(tag, "FAILED", type(e).__name__, str(e)[:400], flush=True)
json.dump(rows, open(f"{OUT}/h200-profile-h128-regions.json", "w"), indent=1)
keys = sorted({k for r in rows for k in r if "." in k})
print("us per step (per block trace)".ljust(24) + "".join(r["tag"][:18].rjust(20) for r in rows))
for k in ["steps", "span_us_per_block"] + keys:
    print(k.ljust(24) + "".join(f"{r.get(k, float('nan')):20.2f}" for r in rows))
