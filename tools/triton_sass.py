"""What machine code does the Pallas Triton kernel get for an H200: registers, spills, shared memory and the SASS
instructions that decide its speed? It lowers the kernel for a bench shape on an abstract H200 and compiles it with
the installed Triton for sm_90, on any machine (a static view: XLA's own Triton compiles it on the GPU). From the
checkout's root: `python -m tools.triton_sass --shape H16_B32_S16384_q1 --fp8 [--set field=value] [--sass k.sass]`.
"""

from __future__ import annotations

DETAILS = """Lowers `mla_jax.pallas_triton` for a bench shape (an abstract H200: no GPU needed), compiles the
Triton module with the Triton package installed here (torch's) for sm_90, and prints the registers,
the spill stack, the shared memory and a histogram of the SASS instructions that decide the
kernel's speed (tensor-core ops, conversions, shared-memory and local-memory traffic):

    python -m tools.triton_sass --shape H16_B32_S16384_q1 --fp8
    python -m tools.triton_sass --shape H128_B64_S16384_q1 --set num_warps=4 --sass k.sass

A static view, for choosing what to time: on the GPU the kernel is compiled by XLA's own Triton,
whose version and passes can differ from the installed one. Timings come from `tools/sweep.py`.
"""

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

from parity.h200 import lower_for_h200, with_overrides
from parity.shapes import parse_shape
from tools.sweep import parse_overrides

# SASS opcodes (before the first '.') reported; the rest are summed as "other"
OPCODES = ("HGMMA", "HMMA", "F2F", "F2FP", "HADD2", "PRMT", "LDS", "LDSM", "STS", "LDGSTS", "LDG", "STG",
           "LDL", "STL", "BAR", "MUFU", "FFMA", "FMUL")


def triton_module(shape, fp8: bool, overrides: dict) -> tuple[str, object]:
    """(the kernel's Triton module as MLIR text, its TritonConfig), lowered for an abstract H200. A ragged shape
    (`Shape.ragged`) is a ValueError: the lowering takes every request seq_len long."""
    if shape.ragged:
        raise ValueError(f"{shape.name}: tools/triton_sass.py lowers uniform batches only (every request seq_len "
                         f"long); its uniform twin is {shape.uniform_twin().name}")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax._src.pallas.triton import lowering as triton_lowering

    import mla_jax
    from mla_jax import pallas_triton
    from mla_spec import build_decode_metadata
    from parity.timing import shape_config

    s = shape
    config = shape_config(s, kv_cache_dtype="fp8_e4m3" if fp8 else "auto")
    pages = -(-s.seq_len // s.page_size)
    block_table = np.arange(s.batch * pages, dtype=np.int32).reshape(s.batch, pages)
    md = build_decode_metadata(seq_lens=[s.seq_len] * s.batch, query_lens=[s.q_len] * s.batch,
                               block_table=block_table, config=config)
    tuning = pallas_triton.heuristic_config(config, md.num_decode_tokens, md.max_blocks,
                                            max_query_len=md.max_query_len, num_reqs=md.num_reqs)
    if overrides:
        tuning = with_overrides(tuning, overrides)
    q = jax.ShapeDtypeStruct((s.batch * s.q_len, s.num_heads, 576), jnp.dtype(s.dtype))
    kv = jax.ShapeDtypeStruct((s.batch * pages, s.page_size, 576), jnp.float8_e4m3fn if fp8 else jnp.dtype(s.dtype))
    extra = {"k_scale": 1.0} if fp8 else {}

    def f(q, kv, md):
        return pallas_triton.mla_decode(q, None, kv, md, config, tuning=tuning, **extra)

    modules = []
    lower = triton_lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = lower(*args, **kwargs)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    triton_lowering.lower_jaxpr_to_triton_module = capture
    try:
        lower_for_h200(f, q, kv, mla_jax.to_jax_metadata(md))
    finally:
        triton_lowering.lower_jaxpr_to_triton_module = lower
    kernel = [m for m in modules if "@mla_decode_paged" in m]
    if not kernel:
        raise RuntimeError(f"no mla_decode_paged module among the {len(modules)} lowered Triton modules")
    return kernel[0], tuning


def compile_sm90(ttir: str, num_warps: int, num_stages: int, workdir: str) -> dict:
    """Compiles Triton IR for sm_90 with the installed Triton; returns the resources and the SASS."""
    import triton
    from triton.backends.compiler import GPUTarget

    path = os.path.join(workdir, "kernel.ttir")
    with open(path, "w") as f:
        f.write(ttir)
    compiled = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    cubin = os.path.join(workdir, "kernel.cubin")
    with open(cubin, "wb") as f:
        f.write(compiled.asm["cubin"])
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    cuobjdump = os.path.join(tools, "cuobjdump")
    if not os.path.exists(cuobjdump):
        raise RuntimeError(f"the installed Triton has no cuobjdump at {cuobjdump}")
    usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    res = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return {"registers": int(res.get("REG", -1)), "stack_bytes": int(res.get("STACK", -1)),
            "shared_bytes": compiled.metadata.shared, "sass": sass}


def histogram(sass: str) -> collections.Counter:
    """Counts of the SASS instructions by opcode (the text before the first '.'), predicates skipped."""
    counts = collections.Counter()
    for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[.\s]", sass):
        op = m.group(1)
        counts[op if op in OPCODES else "other"] += 1
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.triton_sass", description=__doc__, epilog=DETAILS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", required=True, type=parse_shape, help="a bench shape, e.g. H16_B32_S16384_q1")
    p.add_argument("--fp8", action="store_true", help="an fp8_e4m3 cache (the kernel converts its tiles)")
    p.add_argument("--set", dest="overrides", type=parse_overrides, default={},
                   help="field=int pairs replaced in the heuristic's TritonConfig (e.g. num_warps=4,block_kv=64)")
    p.add_argument("--sass", help="also write the whole SASS here")
    args = p.parse_args(argv)
    if args.shape.ragged:
        print(f"{args.shape.name}: a ragged shape; this tool lowers uniform batches only (its uniform twin: "
              f"{args.shape.uniform_twin().name})", file=sys.stderr)
        return 2
    if importlib.util.find_spec("triton") is None:
        print("needs the triton package (installed with torch on Linux)", file=sys.stderr)
        return 2
    ttir, tuning = triton_module(args.shape, args.fp8, args.overrides)
    with tempfile.TemporaryDirectory() as d:
        out = compile_sm90(ttir, tuning.num_warps, tuning.num_stages, d)
    if args.sass:
        with open(args.sass, "w") as f:
            f.write(out["sass"])
    counts = histogram(out["sass"])
    print(f"{args.shape.name}{' fp8' if args.fp8 else ''}: {tuning}")
    print(f"registers {out['registers']}, spill stack {out['stack_bytes']} bytes, shared {out['shared_bytes']} bytes")
    print("  ".join(f"{op} {counts[op]}" for op in (*OPCODES, "other") if counts[op]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
