"""python -m parity.kernel_hash: a fingerprint of the Mosaic GPU kernels the heuristic builds, on any machine (the
lowering for an abstract H200 needs no GPU), to check that a change leaves them as they were.

Each problem of PROBLEMS (bench shapes: fp8 and bf16 caches, 16, 32 and 64-row tiles, long and short splits, B = 1)
is lowered with the heuristic's tuning on abstract inputs; the Mosaic GPU module handed to XLA is printed without
its debug locations (so moving code does not change it) and hashed. `--against REV` lowers the same problems with mla_jax/pallas_mosaic_gpu.py
as it is at git revision REV (in a subprocess) and prints SAME / DIFF per problem: a refactor or an opt-in that must
not touch the default kernels shows SAME everywhere. (Only the Mosaic GPU kernel: the Triton combine is not in it.)

  python -m parity.kernel_hash
  python -m parity.kernel_hash --against HEAD~1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile

# (heads, batch, seq_len, q_len, fp8): bench shapes, lowered on abstract inputs (no arrays made) with the heuristic's
# tuning, pages of 64
PROBLEMS = (
    (16, 128, 16384, 1, True),  # 16 rows: warpgroup_halves with v_from_ring
    (16, 8, 4096, 1, True),  # 16 rows, short splits: warpgroup_halves alone
    (16, 64, 4096, 2, True),  # 32 rows: warpgroup_halves with v_from_ring
    (32, 64, 4096, 1, True),  # 32 rows, H = 32
    (16, 1, 1024, 1, True),  # B = 1: splits of one step (the one-chain path)
    (128, 64, 4096, 1, True),  # 64 rows: the fused conversion
    (16, 128, 16384, 1, False),  # bf16: transposed scores and P @ V
    (128, 64, 4096, 2, False),  # bf16 at 64 rows
)


def problem_name(problem) -> str:
    heads, batch, seq_len, q_len, fp8 = problem
    return f"H{heads}_B{batch}_S{seq_len}_q{q_len}_{'fp8' if fp8 else 'bf16'}"


def module_texts(problem, module=None, tuning=None) -> list[str]:
    """The Mosaic GPU modules (without debug locations) of one call on `problem` ((heads, batch, seq_len, q_len,
    fp8)), lowered for an abstract H200 on abstract inputs with `tuning` (None: the heuristic's). module: the
    mla_jax.pallas_mosaic_gpu module to use (default: the package's)."""
    return [text for text, _ in lowered_modules(problem, module, tuning)]


def _abstract_problem(problem, page: int = 64):
    """(config, q, kv, metadata): `problem` ((heads, batch, seq_len, q_len, fp8)) with pages of `page` as a config and
    abstract inputs (ShapeDtypeStructs: q bf16, the cache, the metadata's arrays)."""
    import jax
    import jax.numpy as jnp

    from mla_spec import DecodeMetadata, MLAConfig

    heads, batch, seq_len, q_len, fp8 = problem
    tokens = batch * q_len
    blocks = -(-seq_len // page)
    config = MLAConfig(num_heads=heads, page_size=page, dtype="bfloat16",
                       kv_cache_dtype="fp8_e4m3" if fp8 else "auto")
    sds = jax.ShapeDtypeStruct
    q = sds((tokens, heads, 576), jnp.bfloat16)
    kv = sds((batch * blocks + 1, page, 576), jnp.float8_e4m3fn if fp8 else jnp.bfloat16)
    md = DecodeMetadata(query_start_loc=sds((batch + 1,), jnp.int32), seq_lens=sds((batch,), jnp.int32),
                        block_table=sds((batch, blocks), jnp.int32), max_query_len=q_len, max_seq_len=seq_len,
                        num_decode_tokens=tokens)
    return config, q, kv, md


def problem_tuning(problem, overrides=None, module=None, page: int = 64):
    """The heuristic's MosaicConfig for `problem` (pages of `page`), with `overrides` ({field: value}) replaced."""
    from parity.sweep import heuristic_tuning

    if module is None:
        from mla_jax import pallas_mosaic_gpu as module
    config, _, _, md = _abstract_problem(problem, page)
    return heuristic_tuning(module, config, md, overrides)


def abstract_call(problem, module=None, tuning=None, page: int = 64):
    """(fn, args): one call of mla_decode on `problem` ((heads, batch, seq_len, q_len, fp8)) with pages of `page`, on
    abstract inputs (_abstract_problem's and k_scale), for `lower_for_h200(fn, *args)`; `tuning` None: the
    heuristic's; a dict: the heuristic's with those fields replaced (problem_tuning, as parity.sweep's --set)."""
    import jax
    import jax.numpy as jnp

    if module is None:
        from mla_jax import pallas_mosaic_gpu as module
    config, q, kv, md = _abstract_problem(problem, page)
    if isinstance(tuning, dict):
        tuning = problem_tuning(problem, tuning, module, page)
    fp8 = problem[4]

    def fn(q, kv, md, s):
        if fp8:
            return module.mla_decode(q, None, kv, md, config, tuning=tuning, k_scale=s)
        return module.mla_decode(q, None, kv, md, config, tuning=tuning)

    return fn, (q, kv, md, jax.ShapeDtypeStruct((), jnp.float32))


def lowered_modules(problem, module=None, tuning=None, page: int = 64) -> list[tuple[str, bytes]]:
    """(text without debug locations, bytecode handed to XLA) of each Mosaic GPU module of one call on `problem`
    (abstract_call's), lowered for an abstract H200. The bytecode is what Mosaic GPU's compiler reads
    (`parity.mosaic_ptx`)."""
    import io

    from jax.experimental.mosaic.gpu import core as mgpu_core

    from parity.h200 import lower_for_h200

    fn, args = abstract_call(problem, module, tuning, page)
    out = []
    serde = mgpu_core._run_serde_pass  # (each Mosaic GPU module passes here just before it is serialized)

    def capture(mod, **kw):
        # (the dump name's counter grows with each kernel lowered in the process)
        text = re.sub(r'dump_basename = "(\w+?)_\d+"', r'dump_basename = "\1"',
                      mod.operation.get_asm(enable_debug_info=False))
        serialized = serde(mod, **kw)
        buf = io.BytesIO()  # (as Mosaic GPU's lowering rule writes it)
        serialized.operation.write_bytecode(buf, desired_version=0)
        out.append((text, buf.getvalue()))
        return serialized

    mgpu_core._run_serde_pass = capture
    try:
        lower_for_h200(fn, *args)
    finally:
        mgpu_core._run_serde_pass = serde
    return out


def hashes(module=None) -> dict[str, str]:
    """{problem name: sha256 of its modules' text} for PROBLEMS."""
    return {problem_name(p): hashlib.sha256("\n".join(module_texts(p, module)).encode()).hexdigest()
            for p in PROBLEMS}


def _load_module(path: str):
    """mla_jax.pallas_mosaic_gpu from the file `path` (in place of the package's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mla_jax.pallas_mosaic_gpu", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["mla_jax.pallas_mosaic_gpu"] = module
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.kernel_hash", description=__doc__.split("\n\n")[0])
    p.add_argument("--against", metavar="REV", help="compare with mla_jax/pallas_mosaic_gpu.py at git revision REV")
    p.add_argument("--module-file", help=argparse.SUPPRESS)  # (--against's subprocess: the file to load)
    p.add_argument("--json", help="write {problem: hash} here")
    args = p.parse_args(argv)
    if args.module_file:
        mine = hashes(_load_module(args.module_file))
    else:
        mine = hashes()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(mine, f, indent=1)
    if not args.against:
        for name, h in mine.items():
            print(f"{name:<28} {h[:16]}")
        return 0
    source = subprocess.run(["git", "show", f"{args.against}:mla_jax/pallas_mosaic_gpu.py"], capture_output=True,
                            text=True)
    if source.returncode:
        p.error(f"--against {args.against}: {source.stderr.strip()}")
    with tempfile.TemporaryDirectory() as d:
        path, out = f"{d}/pallas_mosaic_gpu.py", f"{d}/hashes.json"
        with open(path, "w") as f:
            f.write(source.stdout)
        subprocess.run([sys.executable, "-m", "parity.kernel_hash", "--module-file", path, "--json", out], check=True,
                       stdout=subprocess.DEVNULL)
        with open(out) as f:
            theirs = json.load(f)
    same = 0
    for name, h in mine.items():
        same += h == theirs[name]
        print(f"{name:<28} {'SAME' if h == theirs[name] else 'DIFF'}  {theirs[name][:16]} -> {h[:16]}")
    print(f"{same} of {len(mine)} the same as at {args.against}")
    return 0 if same == len(mine) else 1


if __name__ == "__main__":
    sys.exit(main())
