"""Session 5, call B: where the Mosaic kernel's run-to-run spread comes from (a record of what ran).

Session 4 and call A timed the same Mosaic code at H128 B64 S16384 at 494-627 us and H16 B32 S1024 at
24.8-32.1 us (two timings in one process), while FA3 stayed within ~2-5%. Per shape: FA3 and the Mosaic
loop are calibrated once (bench.calibrate), then each launch (n calls, ~3 ms) is timed on its own, 8 in a
row, for 3 rounds (FA3, Mosaic, FA3, Mosaic, ...); then the Mosaic runner is built again (a new jit) and
timed 8 more launches. Within-launch-sequence spread vs between-builds spread. The compiled HLO of one
Mosaic loop goes to $OUT (what XLA launches per iteration: copies, fusions, custom calls).
"""

import json
import os
import statistics
import sys
import time

import jax

from parity import bench
from parity.profile import parse_shape

out_dir = os.environ.get("OUT", "/tmp/out")
shapes = sys.argv[1].split(",")
result = {}
for name in shapes:
    shape = parse_shape(name)
    inp = bench.make_inputs(shape)

    def launches(run, n, k=8):
        ts = []
        for _ in range(k):
            t0 = time.perf_counter()
            run()
            ts.append((time.perf_counter() - t0) / n * 1e6)
        return ts

    fa3_run, fa3_n, _ = bench.calibrate(bench.torch_fa3, inp)
    mo_run, mo_n, _ = bench.calibrate(bench._jax_kernel("pallas_mosaic_gpu"), inp)
    rec = dict(fa3=[], mosaic=[])
    for _ in range(3):
        rec["fa3"].append(launches(fa3_run, fa3_n))
        rec["mosaic"].append(launches(mo_run, mo_n))
    mo2_run, mo2_n, _ = bench.calibrate(bench._jax_kernel("pallas_mosaic_gpu"), inp)
    rec["mosaic_rebuilt"] = [launches(mo2_run, mo2_n)]
    rec["n"] = dict(fa3=fa3_n, mosaic=mo_n)
    result[name] = rec
    for k in ("fa3", "mosaic", "mosaic_rebuilt"):
        for i, ts in enumerate(rec[k]):
            print(f"{name:<20} {k:<15} r{i} med {statistics.median(ts):8.1f} us  min {min(ts):8.1f}  max {max(ts):8.1f}  "
                  + " ".join(f"{t:.1f}" for t in ts), flush=True)
    del inp

# the compiled loop of one shape: what XLA runs per iteration
import jax.numpy as jnp  # noqa: E402

import mla_jax  # noqa: E402
from mla_jax import pallas_mosaic_gpu as mo  # noqa: E402

inp = bench.make_inputs(parse_shape(shapes[0]))
md = mla_jax.to_jax_metadata(inp.metadata)
q = jax.dlpack.from_dlpack(inp.q)
kv = jax.dlpack.from_dlpack(inp.kv_cache)
qs = tuple(q[k] for k in range(q.shape[0]))


def call(qi, kv, md, scale):
    return mo.mla_decode(qi, None, kv, md, inp.config)


text = jax.jit(bench.timed_loop, static_argnums=(0, 1)).lower(call, 8, qs, kv, md, jnp.float32(1)).compile().as_text()
with open(os.path.join(out_dir, "loop_hlo.txt"), "w") as f:
    f.write(text)
with open(os.path.join(out_dir, "spread.json"), "w") as f:
    json.dump(result, f, indent=1)
