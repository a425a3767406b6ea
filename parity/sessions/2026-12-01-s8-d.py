"""Session 8, call d: call c showed FA3's graph replay faulting (big shape) or hanging (small) after the fp8
Mosaic runner ran; the fp8 runner alone is fine. Which part breaks FA3's graph?
  python3 parity/sessions/2026-12-01-s8-d.py SHAPE MODE
MODE: quantize (bench.quantize_fp8 and the runner's DLPack/bitcast, no kernel), fp8-once (the fp8 runner's
one call, no loop), bf16 (the bf16 runner calibrated: the control), sanitize (no FA3: the fp8 runner's one
call, for compute-sanitizer)."""
import sys

import jax
import jax.numpy as jnp
import torch
from jax import lax

from parity import bench
from parity.profile import parse_shape

shape, mode = parse_shape(sys.argv[1]), sys.argv[2]


def sync(step):
    torch.cuda.synchronize()
    jax.block_until_ready(jnp.zeros(1) + 1)
    print(f"  {step}: ok", flush=True)


inp = bench.make_inputs(shape)
fa3 = None
if mode != "sanitize":
    fa3, _ = bench.calibrate(bench.torch_fa3, inp)
    fa3.measure(1)
    sync(f"FA3 calibrated (n={fa3.n}) and replayed")
if mode == "quantize":
    kv_fp8, k_scale = bench.quantize_fp8(inp.kv_cache)
    sync("quantized")
    kv = lax.bitcast_convert_type(jax.dlpack.from_dlpack(kv_fp8.view(torch.uint8)), jnp.float8_e4m3fn)
    sync("DLPack + bitcast")
elif mode in ("fp8-once", "sanitize"):
    once, _ = bench._jax_kernel("pallas_mosaic_gpu", fp8=True)(inp)
    sync("fp8 runner made")
    once()
    sync("fp8 once")
elif mode == "bf16":
    bench.calibrate(bench._jax_kernel("pallas_mosaic_gpu"), inp)
    sync("bf16 calibrated")
if fa3:
    fa3.measure(1)
    sync("FA3 replayed after")
