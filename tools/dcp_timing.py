"""How much faster is decode context parallelism (DCP) on W GPUs than the plain decode on one, and how much of its time
is the LSE merge? For each shape it times `mla_jax.dcp_mla_decode` on a W-device mesh (the KV interleaved over the
devices, as vLLM: `mla_spec.dcp`) and `mla_jax.mla_decode` on one device, with the bench's method
(`parity.timing`: N calls in one jitted `lax.fori_loop`, 4 query buffers, median of launches), and the merge alone,
timed the same way, two ways:

  merge       `mla_jax.dcp.merge_partials` on the W partials gathered on one device: the merge's arithmetic;
  psum merge  `mla_jax.dcp.merge_over_axis` in a shard_map over the mesh, each device holding its own partial: the
              merge as `dcp_mla_decode` runs it (pmax, then psums of [T, H] and [T, H, L] float32: the collectives).

Each share is that merge's time over the DCP call's. The outputs are checked too (the harness tolerances of the
dtype): the DCP result against the one-device result, and both merges' against the DCP result.

On a machine with two GPUs, from the checkout's root:
  python -m tools.dcp_timing --shapes H16_B64_S65536_q1,H128_B32_S32768_q1 --impl pallas_mosaic_gpu --json dcp.json
On a CPU (a check of the code path, never a timing): XLA_FLAGS=--xla_force_host_platform_device_count=2
  python -m tools.dcp_timing --shapes H16_B2_S128_q1 --impl xla --calls 4 --reps 1
"""

from __future__ import annotations

import argparse
import gc
import json
import sys

import numpy as np

from parity import bench, timing
from parity.shapes import Shape, parse_shape

IMPLS = ("pallas_mosaic_gpu", "pallas_triton", "xla")
COLUMNS = ("shape", "1 dev us", "W dev us", "speedup", "merge us", "merge share", "psum merge us", "psum share")


def _inputs(shape: Shape, world_size: int, seed: int):
    """(config, config_dcp, md, md_shards, kv, kv_shards, qs) for `shape`: a cache of random normal rows on device 0
    (block 0 unused), the requests' pages at a random permutation of blocks 1.. (`parity.timing.shape_metadata`),
    its interleaved shards (`mla_spec.dcp.shard_layout`) gathered on device 0 and put one a device of the mesh
    (unread local slots 0), and 4 random query buffers [T, H, 576]."""
    import jax
    import jax.numpy as jnp

    from mla_spec import dcp as sdcp

    config = timing.shape_config(shape)
    config_dcp = config.replace(dcp_world_size=world_size)
    rng = np.random.default_rng(seed)
    num_blocks = shape.num_pages + 1
    md = timing.shape_metadata(shape, config, rng.permutation(np.arange(1, num_blocks)).astype(np.int32))
    md_shards, source = sdcp.shard_layout(md, config_dcp, num_blocks=num_blocks)
    dev0 = jax.devices()[0]
    dt = jnp.dtype(shape.dtype)
    k_kv, k_q = jax.random.split(jax.random.key(seed))
    with jax.default_device(dev0):
        # in chunks of <= 2^28 values (a cache of 2.4e9 values, H16_B64_S65536, is one draw past 2^31)
        per = max(1, (1 << 28) // (shape.page_size * config.head_dim))
        kv = jnp.concatenate([
            jax.random.normal(jax.random.fold_in(k_kv, i), (min(per, num_blocks - b), shape.page_size, config.head_dim),
                              dt)
            for i, b in enumerate(range(0, num_blocks, per))])
        src = jnp.asarray(source, jnp.int32)
        flat = kv.reshape(-1, config.head_dim)
        kv_shards = jnp.where((src >= 0)[..., None], flat[jnp.maximum(src, 0)], jnp.zeros((), dt))
        del flat, src
        q = jax.random.normal(k_q, (4, shape.num_tokens, shape.num_heads, config.head_dim), dt)
        qs = tuple(q[k] for k in range(4))
    return config, config_dcp, md, md_shards, kv, kv_shards, qs


def _timer(loop_fn, *, calls: int | None, launch_seconds: float):
    """A parity.timing.LaunchTimer of `loop_fn` (n -> a callable making n calls and syncing): n calibrated as the
    bench does (`parity.timing.calibrate`), or fixed to `calls`."""

    def make(_):
        return (lambda: None), loop_fn

    if calls is not None:
        run = loop_fn(calls)
        run()
        return timing.LaunchTimer(run, None, calls)
    timer, _ = timing.calibrate(make, None, launch_seconds=launch_seconds)
    return timer


def measure(shape: Shape, *, impl: str, world_size: int, reps: int, calls: int | None, launch_seconds: float,
            interpret: bool, seed: int = 0) -> dict:
    """One shape's row: the times (seconds per call) of the one-device decode, the DCP decode and both merges, the
    ratios, the launches' call counts, and the checks."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    import mla_jax
    from mla_jax import dcp as jdcp
    from mla_spec import dcp as sdcp
    from parity.compare import compare_out_lse

    if not isinstance(shape, Shape) or shape.q_len != 1:
        raise ValueError(f"DCP decodes one query token per request: a dense shape with q_len 1, got {shape.name}")
    if len(jax.devices()) < world_size:
        raise ValueError(f"--world {world_size} needs {world_size} devices, JAX has {len(jax.devices())}")
    config, config_dcp, md, md_shards, kv, kv_shards, qs = _inputs(shape, world_size, seed)
    mesh = jdcp.make_dcp_mesh(world_size)
    sharded = NamedSharding(mesh, PartitionSpec("dcp"))
    replicated = NamedSharding(mesh, PartitionSpec())
    kv_shards = jax.device_put(kv_shards, sharded)
    md_shards = jax.tree.map(lambda x: jax.device_put(jnp.asarray(x, jnp.int32), sharded), md_shards)
    qs_mesh = tuple(jax.device_put(q, replicated) for q in qs)
    md1 = mla_jax.to_jax_metadata(md, jax.devices()[0])
    extra = {} if impl == "xla" else {"interpret": interpret}
    dt = qs[0].dtype
    gc.collect()

    def one(qi, kv, md):
        return mla_jax.mla_decode(qi, kv, md, config, impl=impl, **extra)

    def dcp(qi, kv, md):
        return jdcp.dcp_mla_decode(qi, kv, md, config_dcp, mesh=mesh, impl=impl, **extra)

    def merge(o, lses):
        return jdcp.merge_partials(o, lses, out_dtype=dt)

    def psum_merge(o, lses):
        body = lambda o, l: jdcp.merge_over_axis(o[0], l[0], "dcp", dt)  # noqa: E731
        return jax.shard_map(body, mesh=mesh, in_specs=(PartitionSpec("dcp"),) * 2,
                             out_specs=(PartitionSpec(), PartitionSpec()), check_vma=False)(o, lses)

    out1, lse1 = jax.jit(one)(qs[0], kv, md1)
    outd, lsed, outs, lses = jdcp.dcp_mla_decode(qs_mesh[0], kv_shards, md_shards, config_dcp, mesh=mesh, impl=impl,
                                                 return_partials=True, **extra)
    dev0 = jax.devices()[0]
    outs_g = tuple(jax.device_put(outs, dev0) + 0.0 for _ in range(4))  # 4 separate buffers, gathered on device 0
    lses_g = jax.device_put(lses, dev0)
    outs_m = tuple(outs + 0.0 for _ in range(4))  # 4 separate buffers, each device its own partial
    outm, lsem = jax.jit(merge)(outs_g[0], lses_g)
    outp, lsep = jax.jit(psum_merge)(outs_m[0], lses)

    def np32(x):
        return np.asarray(jnp.asarray(x, jnp.float32))

    checks = {}
    for name, (o, l, ro, rl) in {"dcp_vs_1dev": (outd, lsed, out1, lse1), "merge_vs_dcp": (outm, lsem, outd, lsed),
                                 "psum_merge_vs_dcp": (outp, lsep, outd, lsed)}.items():
        c_out, c_lse = compare_out_lse(np32(o), np32(l), np32(ro).astype(np.float64), np32(rl).astype(np.float64),
                                       shape.dtype)
        checks[name] = {"ok": bool(c_out.ok and c_lse.ok), "out": c_out.message, "lse": c_lse.message}
    del out1, lse1, outd, lsed, outm, lsem, outp, lsep

    timers = {
        "one_device": timing.jax_time_n(one, qs, kv, md1),
        "dcp": timing.jax_time_n(dcp, qs_mesh, kv_shards, md_shards),
        "merge": timing.jax_time_n(merge, outs_g, lses_g),
        "psum_merge": timing.jax_time_n(psum_merge, outs_m, lses),
    }
    seconds, n_calls = {}, {}
    for name, time_n in timers.items():
        timer = _timer(time_n, calls=calls, launch_seconds=launch_seconds)
        seconds[name], _ = timer.measure(reps)
        n_calls[name] = timer.n
    t1, td = seconds["one_device"], seconds["dcp"]
    return {
        "shape": shape.name, "impl": impl, "world_size": world_size, "seconds": seconds, "n_calls": n_calls,
        "speedup": t1 / td, "merge_share": seconds["merge"] / td, "psum_merge_share": seconds["psum_merge"] / td,
        "local_max_seq_len": int(md_shards.max_seq_len), "checks": checks,
        "checks_ok": all(c["ok"] for c in checks.values()),
    }


def table(rows) -> str:
    """The rows as a text table (COLUMNS; a failed shape shows its error)."""
    lines = ["  ".join(f"{c:>13}" if i else f"{c:<22}" for i, c in enumerate(COLUMNS))]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['shape']:<22}  error: {r['error']}")
            continue
        s = r["seconds"]
        cells = [f"{s['one_device'] * 1e6:.1f}", f"{s['dcp'] * 1e6:.1f}", f"{r['speedup']:.2f}x",
                 f"{s['merge'] * 1e6:.1f}", f"{r['merge_share'] * 100:.1f}%", f"{s['psum_merge'] * 1e6:.1f}",
                 f"{r['psum_merge_share'] * 100:.1f}%"]
        flag = "" if r["checks_ok"] else "  CHECK FAILED: " + "; ".join(
            f"{k}: {v['out']} {v['lse']}" for k, v in r["checks"].items() if not v["ok"])
        lines.append(f"{r['shape']:<22}  " + "  ".join(f"{c:>13}" for c in cells) + flag)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dcp_timing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="H16_B64_S65536_q1,H128_B32_S32768_q1",
                   help="comma-separated shape names, q_len 1 (parity.shapes.parse_shape)")
    p.add_argument("--impl", default="pallas_mosaic_gpu", choices=IMPLS)
    p.add_argument("--world", type=int, default=2, help="DCP world size: devices in the mesh (default 2)")
    p.add_argument("--reps", type=int, default=5, help="launches per timing, the median kept (default 5)")
    p.add_argument("--calls", type=int, default=None,
                   help="calls per launch, a multiple of 4 (default: calibrated to --launch-ms, as the bench)")
    p.add_argument("--launch-ms", type=bench.arg_type(bench.parse_launch_ms), default=timing.LAUNCH_SECONDS * 1e3,
                   help=f"what a launch lasts when calibrated (default {timing.LAUNCH_SECONDS * 1e3:g})")
    p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (a CPU check, never a timing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows and the method to this path")
    args = p.parse_args(argv)
    if args.world < 1:
        p.error(f"--world must be >= 1, got {args.world}")
    if args.calls is not None and (args.calls < 4 or args.calls % 4):
        p.error(f"--calls must be a multiple of 4, got {args.calls}")
    try:
        shapes = [parse_shape(name) for name in filter(None, args.shapes.split(","))]
    except ValueError as e:
        p.error(str(e))

    if args.interpret:  # before JAX makes its CPU client: Mosaic GPU's interpreter hangs on a narrow pool
        from parity._cpu_pool import widen_cpu_pool

        widen_cpu_pool()
    import jax

    devices = jax.devices()
    print(f"devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}); impl {args.impl}, "
          f"W={args.world}", flush=True)
    rows = []
    for shape in shapes:
        try:
            row = measure(shape, impl=args.impl, world_size=args.world, reps=args.reps, calls=args.calls,
                          launch_seconds=args.launch_ms * 1e-3, interpret=args.interpret, seed=args.seed)
        except Exception as e:  # noqa: BLE001 (one shape's failure is reported; the others still run)
            row = {"shape": shape.name, "impl": args.impl, "world_size": args.world,
                   "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]}
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
        gc.collect()
    print()
    print(table(rows))
    if args.json:
        method = (timing.METHOD + "\nmerge: mla_jax.dcp.merge_partials on the W partials gathered on device 0; psum "
                  "merge: mla_jax.dcp.merge_over_axis in a shard_map, each device its own partial. Shares: merge "
                  "time / DCP call time.")
        with open(args.json, "w") as f:
            json.dump({"method": method, "devices": [str(d.device_kind) for d in devices], "impl": args.impl,
                       "world_size": args.world, "rows": rows}, f, indent=1, default=float)
        print(f"wrote {args.json}")
    failed = [r["shape"] for r in rows if "error" in r or not r.get("checks_ok", False)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
