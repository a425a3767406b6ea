"""Session 8, call b: which kernel made call a's fp8 sweep fault (CUDA_ERROR_ILLEGAL_ADDRESS at
H16_B128_S16384_q1, heuristic vs dequant_layout=wgmma_8bit)? One variant a process:
  python3 parity/sessions/2026-12-01-s8-b.py SHAPE LAYOUT [N]
runs the fp8 Mosaic kernel once (blocks), compares it with bf16 Mosaic (rel. out / abs. lse),
then an N-call jitted loop twice (blocks), and prints one line."""
import dataclasses
import sys

import numpy as np

from mla_jax import pallas_mosaic_gpu as mg
from parity import bench
from parity.profile import parse_shape

shape, layout = parse_shape(sys.argv[1]), sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 400
inp = bench.make_inputs(shape)
md = inp.metadata
config = inp.config.replace(kv_cache_dtype="fp8_e4m3")
base = mg.heuristic_config(config, md.num_decode_tokens, md.max_blocks, num_reqs=md.num_reqs,
                           max_query_len=md.max_query_len)
tuning = dataclasses.replace(base, dequant_layout=layout)
once16, _ = bench._jax_kernel("pallas_mosaic_gpu")(inp)
ref_out, ref_lse = (np.asarray(x, np.float32) for x in once16())
once, time_n = bench._jax_kernel("pallas_mosaic_gpu", tuning, fp8=True)(inp)
out, lse = (np.asarray(x, np.float32) for x in once())
rel = float(np.abs(out - ref_out).max() / np.abs(ref_out).max())
dl = float(np.abs(lse - ref_lse).max())
print(f"{shape.name} {layout}: once ok, out rel {rel:.2e}, lse abs {dl:.2e}, tuning {tuning}", flush=True)
run = time_n(n)
run()
run()
print(f"{shape.name} {layout}: {n}-call loop x2 ok", flush=True)
