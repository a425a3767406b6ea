"""For the next session's first call (see next-session-first-call.sh): the kernel and FA3 on the bench's random
pages against the same requests' pages in order, timed in turns (2 s idle before each timing, the bench's launch
timer). Prints a table; JSON to argv[1]."""
import dataclasses
import json
import sys
import time

import numpy as np

from mla_spec import build_decode_metadata
from parity import bench

rows = []
for shape in (bench.Shape(128, 64, 4096), bench.Shape(128, 64, 16384)):
    rand = bench.make_inputs(shape)
    pages = -(-shape.seq_len // shape.page_size)
    table = (np.arange(shape.batch * pages, dtype=np.int32) + 1).reshape(shape.batch, pages)  # in order
    md = build_decode_metadata(seq_lens=[shape.seq_len] * shape.batch, query_lens=[shape.q_len] * shape.batch,
                               block_table=table, config=rand.config, num_blocks=rand.kv_cache.shape[0])
    inputs = {"random": rand, "in_order": dataclasses.replace(rand, metadata=md)}
    timers = {(impl, order): bench.calibrate(bench.RUNNERS[impl], inp)[0]
              for impl in ("torch.fa3", "jax.pallas_mosaic_gpu") for order, inp in inputs.items()}
    times = {key: [] for key in timers}
    for _ in range(3):
        for key, timer in timers.items():
            time.sleep(2)
            times[key].append(timer.measure(5)[0])
    flops = 2 * shape.batch * shape.q_len * shape.num_heads * shape.seq_len * (576 + 512)
    for (impl, order), ts in times.items():
        med = sorted(ts)[1]
        rows.append(dict(shape=shape.name, impl=impl, pages=order, seconds=med, rounds=ts,
                         tflops=flops / med * 1e-12, us_per_step=med * 1e6 / -(-shape.seq_len // 64)))
        print(f"{shape.name:<20} {impl:<22} {order:<9} {med * 1e6:8.1f} us {flops / med * 1e-12:6.0f} TF/s "
              f"{rows[-1]['us_per_step']:.3f} us/step", flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
