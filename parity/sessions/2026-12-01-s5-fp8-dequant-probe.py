"""Session 5, CPU only: does Mosaic GPU (jax 0.11.2) take the fp8 -> bf16 step a Mosaic fp8 path needs (issue #7)?

A [64, 576] float8_e4m3fn tile TMA-loaded into SMEM, read 64 columns at a time in the WGMMA register layout,
converted, and stored into a bf16 [64, 576] buffer with the KV ring's transforms (8 x 64 tiles, 128-byte
swizzle), then copied out. Usage: python parity/sessions/2026-12-01-s5-fp8-dequant-probe.py {sw64,sw128,plain}
{interpret,lower} [direct]. Seen here (CPU): sw64 (the fp8 tile in 8 x 64 tiles, 64-byte swizzle) lowers for
CUDA and is exact in interpret mode through f32 (fp8 -> f16 -> f32 -> bf16); `direct` (fp8 -> bf16 in one
cvt) is refused without a ptxas of PTX ISA >= 9.2; sw128 (8 x 128 tiles) fails an assertion in the lowering;
plain (no transforms) fails: a TMA copies at most 256 elements along a dimension.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

variant, mode = sys.argv[1], sys.argv[2]
direct = "direct" in sys.argv[3:]
R, C = 64, 576
f8_tr = {"plain": (), "sw64": (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(64)),
         "sw128": (plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))}[variant]
bf_tr = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def body(x_ref, o_ref, x8, deq, bar):
    plgpu.copy_gmem_to_smem(x_ref, x8, bar)
    plgpu.barrier_wait(bar)
    for c in range(C // 64):
        src = x8.at[:, pl.ds(c * 64, 64)]
        v = src[...] if variant == "plain" else plgpu.load(src, (), layout=plgpu.Layout.WGMMA)
        deq.at[:, pl.ds(c * 64, 64)][...] = (v.astype(jnp.bfloat16) if direct
                                             else v.astype(jnp.float32).astype(jnp.bfloat16))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(deq, o_ref)
    plgpu.wait_smem_to_gmem(0)


kernel = plgpu.kernel(
    body, out_type=jax.ShapeDtypeStruct((R, C), jnp.bfloat16),
    scratch_types=[plgpu.SMEM((R, C), jnp.float8_e4m3fn, transforms=f8_tr),
                   plgpu.SMEM((R, C), jnp.bfloat16, transforms=bf_tr), plgpu.Barrier()],
    num_threads=1, thread_name="wg",
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane))
x = jnp.asarray(np.random.default_rng(0).standard_normal((R, C)).astype(np.float32)).astype(jnp.float8_e4m3fn)
if mode == "interpret":
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        out = jax.jit(kernel)(x)
    print(variant, "interpret exact:", bool(jnp.array_equal(out.astype(jnp.float32), x.astype(jnp.float32))))
else:
    h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=h200)):
        jax.jit(kernel).trace(x).lower(lowering_platforms=("cuda",))
    print(variant, "lowered for CUDA")
