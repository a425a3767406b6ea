"""python -m parity.wgmma_probe: how fast a CTA runs the H = 128 step's matmuls, alone and side by side (a diagnosis
of the Mosaic GPU kernel's compute-bound step, not a test).

Each CTA (two warpgroups, one CTA per SM) holds the kernel's operands in shared memory, in its layouts (8 x 64
tiles, 128-byte swizzle): a query tile Q [64, 576] and two KV steps K [2 x 64, 576] (the ring: the two slots
adjacent, so that 128 rows read as one operand); P of a slot is its 64 rope columns (as with p_in_kv: the shared
memory holds no more beside Q and the ring). Each iteration a warpgroup runs one of:

* "qk": the kernel's scores, S [64, 64] = Q @ K_slot^T (wgmma N = 64, K = 576: 36 instructions of k = 16, both
  operands from shared memory), then waits for them;
* "qk_n128": the scores of both slots in one, S [64, 128] (N = 128; its time is reported per 64 keys);
* "qk_rs": the scores with Q from registers (loaded once: the wgmma's left operand in registers, only K from
  shared memory);
* "pv": one warpgroup's P @ V, acc [64, 256] += P_slot [64, 64] @ V_slot [64, 256] (the slot's columns
  [256, 512)); "pv0" the same on the other half, columns [0, 256).

Probes (warpgroup 0's work / warpgroup 1's [/ warpgroup 2's]): qk / -, qk_n128 / -, qk_rs / -, - / pv, qk / pv (the
kernel's overlap: is a P @ V beside the scores free?), qk / qk (two warpgroups' scores at once), pv0 / pv (the two
P @ V halves at once, as "flashmla" runs them after the softmax), qk / pv / pv0 and qk_rs / pv / pv0 (three
warpgroups: the scores beside both halves, the step of schedule="three_wg", with Q from shared memory or registers). An iteration's time is the slope of
the kernel's time over the iteration count (the launch and set-up cancel). Every result is checked against numpy
(row sums of the last scores and of the accumulated P @ V; small integers, so exact in fp32).
"""

from __future__ import annotations

import argparse
import json
import sys

from parity.convert_probe import median_time, parse_iters

BLOCK_H, BLOCK_KV, HEAD_DIM, V_HALF = 64, 64, 576, 256
# probe -> (warpgroup 0's work, warpgroup 1's work); None: that warpgroup idles
PROBES = {"qk": ("qk", None), "qk_n128": ("qk_n128", None), "qk_rs": ("qk_rs", None), "pv": (None, "pv"),
          "qk+pv": ("qk", "pv"), "qk+qk": ("qk", "qk"), "pv+pv": ("pv0", "pv"), "qk+pv+pv": ("qk", "pv", "pv0"),
          "qk_rs+pv+pv": ("qk_rs", "pv", "pv0")}
V_COLS = {"pv": V_HALF, "pv0": 0}  # the first column of each P @ V kind's half


def build(probe: str, iters: int, num_ctas: int):
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    work = PROBES[probe]

    def body(q_ref, k_ref, o_ref, q_smem, k_smem, o_smem, bar):
        wg = lax.axis_index("wg")
        cta = lax.axis_index("cta")

        @pl.when(wg == 0)
        def _():
            plgpu.copy_gmem_to_smem(q_ref, q_smem, bar)
            plgpu.copy_gmem_to_smem(k_ref, k_smem, bar)

        plgpu.barrier_wait(bar)

        def scores(kind, i, q_regs):
            rows = (pl.ds(0, 2 * BLOCK_KV) if kind == "qk_n128"
                    else pl.ds(pl.multiple_of(lax.rem(i, jnp.int32(2)) * BLOCK_KV, BLOCK_KV), BLOCK_KV))
            n = 2 * BLOCK_KV if kind == "qk_n128" else BLOCK_KV

            def qk(s_ref):
                plgpu.wgmma(s_ref, q_smem if q_regs is None else q_regs, k_smem.at[rows].transpose((1, 0)))
                return s_ref[...]

            return pl.run_scoped(qk, plgpu.ACC((BLOCK_H, n), jnp.float32))

        def pv(acc, i, c0):
            rows = pl.ds(pl.multiple_of(lax.rem(i, jnp.int32(2)) * BLOCK_KV, BLOCK_KV), BLOCK_KV)
            p_slot = k_smem.at[rows, pl.ds(2 * V_HALF, BLOCK_KV)]  # the slot's rope columns
            return pl.run_state(lambda a_ref: plgpu.wgmma(a_ref, p_slot, k_smem.at[rows, pl.ds(c0, V_HALF)]))(
                plgpu.ACC.init(acc))

        for w, kind in enumerate(work):
            if kind is None:
                continue

            @pl.when(wg == w)
            def _(w=w, kind=kind):
                if kind in V_COLS:
                    init = plgpu.layout_cast(jnp.zeros((BLOCK_H, V_HALF), jnp.float32), plgpu.Layout.WGMMA)
                    out = lax.fori_loop(0, iters, lambda i, acc: pv(acc, i, V_COLS[kind]), init)
                else:
                    q_regs = plgpu.load(q_smem, layout=plgpu.Layout.WGMMA) if kind == "qk_rs" else None
                    n = 2 * BLOCK_KV if kind == "qk_n128" else BLOCK_KV
                    init = plgpu.layout_cast(jnp.zeros((BLOCK_H, n), jnp.float32), plgpu.Layout.WGMMA)
                    out = lax.fori_loop(0, iters, lambda i, s: scores(kind, i, q_regs), init)
                o_smem[w] = out.sum(axis=1)
                plgpu.commit_smem()

                @pl.when(cta == 0)
                def _():
                    plgpu.copy_smem_to_gmem(o_smem.at[w], o_ref.at[w])
                    plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((len(work), BLOCK_H), jnp.float32),
        scratch_types=[
            plgpu.SMEM((BLOCK_H, HEAD_DIM), jnp.bfloat16, transforms=t),
            plgpu.SMEM((2 * BLOCK_KV, HEAD_DIM), jnp.bfloat16, transforms=t),
            plgpu.SMEM((len(work), BLOCK_H), jnp.float32),
            plgpu.Barrier(num_arrivals=2),  # Q and K loaded
        ],
        grid=(num_ctas,),
        grid_names=("cta",),
        num_threads=len(work),
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
    )
    return jax.jit(kernel)


def expected(probe: str, iters: int, q, k):
    """Row sums numpy says each warpgroup writes (None where it idles)."""
    import numpy as np

    q, k = (np.asarray(x, np.float64) for x in (q, k))
    last = (iters - 1) % 2
    out = []
    for kind in PROBES[probe]:
        if kind is None:
            out.append(None)
        elif kind == "qk_n128":
            out.append((q @ k.T).sum(axis=1))
        elif kind in V_COLS:
            n0, n1 = (iters + 1) // 2, iters // 2  # iterations on slot 0, slot 1
            c = slice(V_COLS[kind], V_COLS[kind] + V_HALF)
            pv = [k[r, 2 * V_HALF:] @ k[r, c] for r in (slice(0, BLOCK_KV), slice(BLOCK_KV, None))]
            out.append((n0 * pv[0] + n1 * pv[1]).sum(axis=1))
        else:
            out.append((q @ k[last * BLOCK_KV:(last + 1) * BLOCK_KV].T).sum(axis=1))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.wgmma_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--probes", default=",".join(PROBES))
    p.add_argument("--iters", default="200,2200", help="two iteration counts; the slope between them is timed")
    p.add_argument("--ctas", type=int, default=132, help="CTAs (one per SM on the H200)")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    probes = args.probes.split(",")
    for name in probes:
        if name not in PROBES:
            raise ValueError(f"--probes: {name!r} is not one of {tuple(PROBES)}")
    lo, hi = parse_iters(args.iters)

    import jax
    import jax.numpy as jnp
    import numpy as np

    if jax.default_backend() != "gpu":
        print(f"wgmma_probe: needs a GPU (JAX's default backend is {jax.default_backend()!r})", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    q = rng.integers(-1, 2, size=(BLOCK_H, HEAD_DIM)).astype(np.float32)
    k = rng.integers(-1, 2, size=(2 * BLOCK_KV, HEAD_DIM)).astype(np.float32)
    args_dev = tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k))
    rows = []
    for name in probes:
        f_lo, f_hi = build(name, lo, args.ctas), build(name, hi, args.ctas)
        got = np.asarray(f_hi(*args_dev))
        want = expected(name, hi, q, k)
        exact = all(w is None or np.array_equal(got[i], w) for i, w in enumerate(want))
        t_lo, t_hi = median_time(f_lo, args_dev, args.reps), median_time(f_hi, args_dev, args.reps)
        us = (t_hi - t_lo) / (hi - lo) * 1e6
        keys = 2 * BLOCK_KV if "qk_n128" in PROBES[name] else BLOCK_KV
        flops = sum(2 * BLOCK_H * (2 * BLOCK_KV if w == "qk_n128" else BLOCK_KV) * HEAD_DIM if w and w.startswith("qk")
                    else 2 * BLOCK_H * BLOCK_KV * V_HALF if w in V_COLS else 0 for w in PROBES[name])
        rows.append(dict(probe=name, work=PROBES[name], us_per_iter=us, us_per_64_keys=us * BLOCK_KV / keys,
                         tflops_per_sm=flops / us * 1e-6, exact=exact, t_lo_ms=t_lo * 1e3, t_hi_ms=t_hi * 1e3,
                         iters=[lo, hi], ctas=args.ctas))
    print(f"{'probe':<8} {'us/iter':>8} {'us/64 keys':>10} {'TFLOP/s/SM':>10} {'exact':>6}  ({args.ctas} CTAs)")
    for r in rows:
        print(f"{r['probe']:<8} {r['us_per_iter']:8.3f} {r['us_per_64_keys']:10.3f} {r['tflops_per_sm']:10.2f} "
              f"{str(r['exact']):>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=str(jax.devices()[0].device_kind), rows=rows), f, indent=1)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
