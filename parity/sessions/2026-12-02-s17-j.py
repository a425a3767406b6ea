"""Session 17, call J: the kernel with Q's descriptors per use (Q_DESCRIPTORS_PER_USE, new default) against from q's
constant address (the old code), interleaved in one process: compiled each, outputs compared bitwise, then timed
in turns (2 s idle before each timing, the bench's launch timer). Prints a table; JSON to argv[1]."""
import json
import sys
import time

import numpy as np

from mla_jax import pallas_mosaic_gpu as mg
from parity import bench

rows = []
for shape in (bench.Shape(128, 64, 4096), bench.Shape(128, 64, 16384), bench.Shape(128, 128, 4096, 2)):
    inp = bench.make_inputs(shape)
    timers, outs = {}, {}
    for flag in (False, True):
        mg.Q_DESCRIPTORS_PER_USE = flag  # read when the kernel is traced (calibrate compiles it)
        timers[flag], outs[flag] = bench.calibrate(bench.RUNNERS["jax.pallas_mosaic_gpu"], inp)
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(outs[False], outs[True]))
    times = {False: [], True: []}
    for _ in range(3):
        for flag in (False, True):
            time.sleep(2)
            times[flag].append(timers[flag].measure(5)[0])
    med = {f: sorted(t)[1] for f, t in times.items()}
    steps = -(-shape.seq_len // 64)
    flops = 2 * shape.batch * shape.q_len * shape.num_heads * shape.seq_len * (576 + 512)
    rows.append(dict(shape=shape.name, bitwise_same=same, seconds_const_q=med[False], seconds_per_use=med[True],
                     rounds_const_q=times[False], rounds_per_use=times[True], steps=steps,
                     tflops_const_q=flops / med[False] * 1e-12, tflops_per_use=flops / med[True] * 1e-12))
    r = rows[-1]
    print(f"{r['shape']:<20} const q {r['seconds_const_q'] * 1e6:8.1f} us ({r['tflops_const_q']:.0f} TF/s)  per use "
          f"{r['seconds_per_use'] * 1e6:8.1f} us ({r['tflops_per_use']:.0f} TF/s)  ratio "
          f"{r['seconds_const_q'] / r['seconds_per_use']:.3f}  bitwise {same}", flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
