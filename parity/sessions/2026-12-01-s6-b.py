"""Session 6, call B (its first run failed at compile: the profiler buffer is in SMEM; 1024 ranges, H16 only): where the Mosaic kernel's fp8 path spends its steps (call A: 0.53x of bf16).

The Mosaic GPU profiler (CompilerParams profile_space / profile_dir, patched in here only) records the
kernel's named scopes (kv_wait, qk, p_free_wait, pv, p_ready_wait, deq_wait, dequant) per warpgroup;
this prints each region's mean time per step, bf16 against fp8, on two shapes. MOSAIC_GPU_DUMP_PTXAS /
_PTX / _SASS (set by the .sh) dump the compiled kernels under $OUT/dump (registers, spills, SASS)."""
import collections
import functools
import glob
import json
import os
import sys

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


def profile(tag, shape, fp8):
    pdir = f"{OUT}/prof/{tag}"
    os.makedirs(pdir, exist_ok=True)
    plgpu.CompilerParams = functools.partial(ORIG, profile_space=1024, profile_dir=pdir, profile_bounds_check=True)
    jax.clear_caches()
    try:
        inp = bench.make_inputs(shape)
        once, _ = bench._jax_kernel("pallas_mosaic_gpu", fp8=fp8)(inp)
        once()
    finally:
        plgpu.CompilerParams = ORIG
    files = sorted(glob.glob(f"{pdir}/*-trace.json"))
    if not files:
        print(tag, "no trace", flush=True)
        return None
    reg, span = regions(files[-1])
    steps = reg["wg0"]["qk"][1]
    row = {"tag": tag, "steps": steps, "span_us_per_block": span}
    for kind in ("wg0", "wg1"):
        for name, (tot, cnt) in sorted(reg[kind].items()):
            row[f"{kind}.{name}"] = tot / max(steps, 1)
    print(json.dumps(row), flush=True)
    return row


rows = []
for shape in (bench.Shape(16, 128, 4096), bench.Shape(16, 64, 8192)):
    for fp8 in (False, True):
        tag = f"H{shape.num_heads}_B{shape.batch}_S{shape.seq_len}_{'fp8' if fp8 else 'bf16'}"
        try:
            r = profile(tag, shape, fp8)
            if r:
                rows.append(r)
        except Exception as e:  # noqa: BLE001 (a diagnostic: print and go on)
            print(tag, "FAILED", type(e).__name__, str(e)[:400], flush=True)
json.dump(rows, open(f"{OUT}/h200-profile-fp8-regions.json", "w"), indent=1)
keys = sorted({k for r in rows for k in r if "." in k})
print("us per step (per block trace)".ljust(24) + "".join(r["tag"][-14:].rjust(16) for r in rows))
for k in ["steps", "span_us_per_block"] + keys:
    print(k.ljust(24) + "".join(f"{r.get(k, float('nan')):16.2f}" for r in rows))
