"""PTX and ptxas's report for the sparse Mosaic GPU kernel (mla_jax.pallas_mosaic_gpu.sparse) on an abstract H200,
with tools/mosaic_ptx.py's machinery (its venv with JAX's CUDA plugin, a stand-in libcuda, ptxas):

    python -m tools.sparse_ptx --heads 128 --tokens 64 --topk 2048 --out /tmp/ptx
    python -m tools.sparse_ptx --fp8 ...    # the fp8_ds_mla cache's kernel (sparse_fp8.py)

prints registers, spills, and the gather's instruction counts (cp.async, TMA) in the PTX."""

from __future__ import annotations

import argparse
import gzip
import os
import re
import sys


def sparse_modules(heads: int, tokens: int, topk: int, page: int = 64, num_blocks: int = 256, fp8: bool = False,
                   num_splits: int | None = None):
    """(text, bytecode) of the sparse kernel's Mosaic GPU module(s) for one call, lowered for an abstract H200
    (fp8: on the fp8_ds_mla cache, uint8 [num_blocks, page, 656]; num_splits: sparse_decode's, None the
    heuristic's)."""
    import io

    import jax
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import core as mgpu_core

    from mla_jax.pallas_mosaic_gpu import sparse as sp
    from mla_spec import MLAConfig, SparseMetadata
    from parity.h200 import lower_for_h200

    cfg = MLAConfig(num_heads=heads, page_size=page)
    sds = jax.ShapeDtypeStruct

    def fn(q, kv, idx, tl):
        return sp.sparse_decode(q, kv, SparseMetadata(idx, tl), cfg, cache_format="fp8_ds_mla" if fp8 else "auto",
                                num_splits=num_splits)

    out = []
    serde = mgpu_core._run_serde_pass

    def capture(mod, **kw):
        serialized = serde(mod, **kw)
        buf = io.BytesIO()
        serialized.operation.write_bytecode(buf, desired_version=0)
        out.append((mod.operation.get_asm(enable_debug_info=False), buf.getvalue()))
        return serialized

    mgpu_core._run_serde_pass = capture
    try:
        kv = sds((num_blocks, page, 656), jnp.uint8) if fp8 else sds((num_blocks, page, 576), jnp.bfloat16)
        lower_for_h200(fn, sds((tokens, heads, 576), jnp.bfloat16), kv,
                       sds((tokens, topk), jnp.int32), sds((tokens,), jnp.int32))
    finally:
        mgpu_core._run_serde_pass = serde
    return out


def main(argv=None) -> int:
    import ctypes
    import tempfile

    from tools.mosaic_ptx import compile_module, load_stand_in_driver, plugin_library, ptxas_dir, report

    p = argparse.ArgumentParser(prog="python -m tools.sparse_ptx", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--fp8", action="store_true", help="the fp8_ds_mla cache's kernel")
    p.add_argument("--num-splits", type=int, help="splits of each token's steps (default: the heuristic's)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    modules = sparse_modules(args.heads, args.tokens, args.topk, fp8=args.fp8, num_splits=args.num_splits)
    with tempfile.TemporaryDirectory() as workdir:
        load_stand_in_driver(workdir)
        tool_dir = ptxas_dir()
        os.environ["PATH"] = tool_dir + os.pathsep + os.environ.get("PATH", "")
        compile_fn = ctypes.CDLL(plugin_library()).MosaicGpuCompile
        compile_fn.argtypes = [ctypes.c_char_p, ctypes.c_int]
        compile_fn.restype = ctypes.c_void_p
        for i, (_, bytecode) in enumerate(modules):
            ptx, ptxas = compile_module(compile_fn, bytecode, workdir)
            r = report(ptxas)
            counts = {name: len(re.findall(pat, ptx)) for name, pat in (
                ("cp.async (16 B)", r"cp\.async\.cg\.shared\.global"),
                ("cp.async (4 B)", r"cp\.async\.ca\.shared\.global"),
                ("cp.async.mbarrier.arrive", r"cp\.async\.mbarrier\.arrive"),
                ("TMA loads", r"cp\.async\.bulk\.tensor\.[^ ]*shared::cluster\.global"),
                ("TMA stores", r"cp\.async\.bulk\.tensor\.[^ ]*global\.shared"),
                ("wgmma", r"wgmma\.mma_async"))}
            splits = "" if args.num_splits is None else f"_s{args.num_splits}"
            name = f"sparse{'_fp8' if args.fp8 else ''}_H{args.heads}_T{args.tokens}_topk{args.topk}{splits}"
            print(f"{name} kernel {i}: {r['registers']} registers, {r['spill_stores']} bytes spill stores, "
                  f"{r['spill_loads']} loads, {r['stack']}-byte stack frame; in the PTX: "
                  + ", ".join(f"{k} {v}" for k, v in counts.items()))
            for w in r["warnings"]:
                print(f"  {w}")
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with gzip.open(os.path.join(args.out, f"{name}-{i}.ptx.gz"), "wt") as f:
                    f.write(ptx)
                with open(os.path.join(args.out, f"{name}-{i}.ptxas"), "w") as f:
                    f.write(ptxas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
