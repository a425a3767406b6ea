"""Session 8, call c: localize the fp8 sweep's illegal address (call a, b: each fp8 kernel alone is fine; the
sweep's FA3 + fp8 heuristic faults at H16_B128_S16384_q1). The sweep's steps, each followed by a sync of
torch and JAX and a printed line, so the first step that faults is the last line before the error:
  python3 parity/sessions/2026-12-01-s8-c.py SHAPE [fa3-first|no-fa3]"""
import sys

import jax
import torch

from parity import bench
from parity.profile import parse_shape

shape, mode = parse_shape(sys.argv[1]), sys.argv[2]


def sync(step):
    torch.cuda.synchronize()
    jax.block_until_ready(jax.numpy.zeros(1) + 1)
    print(f"  {step}: ok", flush=True)


inp = bench.make_inputs(shape)
sync("inputs")
fa3 = None
if mode == "fa3-first":
    fa3, _ = bench.calibrate(bench.torch_fa3, inp)
    sync(f"FA3 calibrated (n={fa3.n})")
timer, _ = bench.calibrate(bench._jax_kernel("pallas_mosaic_gpu", fp8=True), inp)
sync(f"fp8 calibrated (n={timer.n})")
for r in range(2):
    if fa3:
        fa3.measure(3)
        sync(f"round {r}: FA3 measured")
    timer.measure(3)
    sync(f"round {r}: fp8 measured")
