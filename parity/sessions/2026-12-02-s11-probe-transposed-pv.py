"""Session 11 CPU probe (JAX 0.11.2, no GPU): P @ V transposed for the Mosaic kernel, O^T = V^T P^T.
python parity/sessions/2026-12-02-s11-probe-transposed-pv.py {plain,store_t,T}: lowers the probe kernel for an
abstract H200 and runs it in interpret mode. Findings in parity/NOTES_pallas_mosaic_gpu.md, "Sessions 10 and 11"."""
import sys
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
N = 16
T = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
mode = sys.argv[1]
def body(v_ref, p_ref, o_ref, v_smem, p_smem, o_smem, bar):
    plgpu.copy_gmem_to_smem(v_ref, v_smem, bar)
    plgpu.copy_gmem_to_smem(p_ref, p_smem, bar)
    plgpu.barrier_wait(bar)
    def mm(acc_ref):
        for c in range(4):
            plgpu.wgmma(acc_ref.at[pl.ds(c * 64, 64)], v_smem.at[:, pl.ds(c * 64, 64)].transpose((1, 0)),
                        p_smem.at[pl.ds(0, N)].transpose((1, 0)))
        return acc_ref[...]
    acc = pl.run_scoped(mm, plgpu.ACC((256, N), jnp.float32))
    if mode == "store_t":
        o_smem.transpose((1, 0))[...] = acc
    else:
        o_smem[...] = acc.T if mode == "T" else acc
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_ref)
    plgpu.wait_smem_to_gmem(0)
oshape = (N, 256) if mode in ("store_t", "T") else (256, N)
k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(oshape, jnp.float32),
    scratch_types=[plgpu.SMEM((64, 256), jnp.float16, transforms=T), plgpu.SMEM((64, 64), jnp.float16, transforms=T),
                   plgpu.SMEM(oshape, jnp.float32), plgpu.Barrier(num_arrivals=2)],
    num_threads=1, thread_name="wg", compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane))
v = jax.random.normal(jax.random.key(0), (64, 256), jnp.float16)
p = jax.random.normal(jax.random.key(1), (64, 64), jnp.float16)
want = (v.astype(jnp.float32).T @ p[:N].astype(jnp.float32).T)
h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
try:
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=h200)):
        jax.jit(k).trace(jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(p.shape, p.dtype)).lower(lowering_platforms=("cuda",))
    print(mode, "lowers for CUDA")
except Exception as e:
    print(mode, "lowering fails:", type(e).__name__, str(e).splitlines()[0][:300])
try:
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        got = jax.jit(k)(v, p)
    w = want.T if mode in ("store_t", "T") else want
    print(mode, "interpret max err", float(jnp.abs(got - w).max()))
except Exception as e:
    print(mode, "interpret fails:", type(e).__name__, str(e).splitlines()[0][:300])
