"""Session 13, call C (first part): does timing FA3 first, in the same process, slow the Mosaic kernel timed after it?
Call B: the fp8 kernel (H16 B128 S16384 q1) 666-679 us in sweeps with no FA3, 706.6 us in the sweep that calibrated
and timed FA3 first (same tree, same tuning); the bench and the sweep both time FA3 first on every shape.
One process, one shape, the bench's runners and timers (bench.calibrate, LaunchTimer.measure(3)):
  a0: Mosaic (fp8 and bf16), before FA3 exists in the process
  a1: after FA3 is calibrated (its graph captured, its buffers allocated), FA3 not timed since
  a2: right after FA3 is timed (each kernel right after its own FA3 measure)
  a3: after a 3 s sleep
  a4: a fresh Mosaic runner (a new fp8 copy of the cache, allocated after FA3), measured
  a5: the first timers again, last.
Prediction: if FA3's allocations move the fp8 copy (the sweep's case: the kernel's runner quantizes after FA3's
calibrate), a4 slow and a0/a1/a5 equal; if FA3's running heats the GPU, a2 slow and a3 back to a0."""
import json
import os
import sys
import time

from parity import bench
from parity.profile import parse_shape

shape = parse_shape(sys.argv[1] if len(sys.argv) > 1 else "H16_B128_S16384_q1")
inp = bench.make_inputs(shape)
kinds = {"fp8": bench._jax_kernel("pallas_mosaic_gpu", fp8=True), "bf16": bench._jax_kernel("pallas_mosaic_gpu")}
timers = {k: bench.calibrate(make, inp)[0] for k, make in kinds.items()}
res = {k: {} for k in kinds}
res["fa3"] = {}
us = lambda t: t.measure(3)[0] * 1e6
for k, t in timers.items():
    res[k]["a0"] = us(t)
fa3, _ = bench.calibrate(bench.torch_fa3, inp)
for k, t in timers.items():
    res[k]["a1"] = us(t)
for k, t in timers.items():
    res["fa3"]["before_" + k] = us(fa3)
    res[k]["a2"] = us(t)
time.sleep(3)
for k, t in timers.items():
    res[k]["a3"] = us(t)
for k, make in kinds.items():
    res[k]["a4"] = us(bench.calibrate(make, inp)[0])
for k, t in timers.items():
    res[k]["a5"] = us(t)
for k in kinds:
    print(f"{shape.name} {k:<5} " + "  ".join(f"{s} {v:7.1f}" for s, v in res[k].items()) + " us")
print(f"{shape.name} FA3   " + "  ".join(f"{s} {v:7.1f}" for s, v in res["fa3"].items()) + " us")
out = os.environ.get("OUT")
if out:
    with open(os.path.join(out, f"probe-fa3-order-{shape.name}.json"), "w") as f:
        json.dump({"shape": shape.name, "us": res}, f, indent=1)
