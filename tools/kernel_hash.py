"""Fingerprints of the Mosaic GPU kernels that the heuristic builds, lowered on any machine (no GPU needed).

Each problem of the grid (heads 8/16/32/64/128, q_len 1-4, pages of 8/16/32/64/128, a bf16, fp16 or fp8 cache, and
batch x length pairs that give both unsplit and split-KV launches) is lowered through the public
`mla_jax.pallas_mosaic_gpu.mla_decode` with its default (heuristic) tuning, for an abstract H200. The Mosaic GPU
module handed to XLA is printed without debug locations, so moving code between files or functions does not change
it, and hashed. A refactor that must not change the kernels shows the same hash for every problem:

  python tools/kernel_hash.py --json /tmp/after.json            # this checkout
  python tools/kernel_hash.py --compare /tmp/before.json /tmp/after.json

To fingerprint another revision, run the same command inside a `git worktree` of it (the script uses only the
public API, so it runs against any revision that has `mla_decode(q, None, kv, metadata, config, k_scale=...)`).
`--quick` lowers one problem of each kind (about 40) instead of the whole grid (1,200, ~15 minutes on one core).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import re
import sys

# This checkout's packages first, ahead of any installed copy: the fingerprints are of the code beside this file.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HEADS = (8, 16, 32, 64, 128)
Q_LENS = (1, 2, 3, 4)
PAGES = (8, 16, 32, 64, 128)
CACHES = ("bf16", "fp16", "fp8")
# (batch, seq_len): long unsplit requests, a medium batch, split-KV with steps of a few pages, one request split wide
BATCHES = ((128, 16384), (32, 16384), (8, 4096), (1, 1024))


def problems(quick: bool = False):
    """(heads, batch, seq_len, q_len, page, cache) tuples of the grid; quick: a spread of about 40 of them."""
    grid = list(itertools.product(HEADS, BATCHES, Q_LENS, PAGES, CACHES))
    out = [(h, b, s, q, p, c) for h, (b, s), q, p, c in grid]
    if quick:
        out = out[::29]
    return out


def problem_name(problem) -> str:
    h, b, s, q, p, c = problem
    return f"H{h}_B{b}_S{s}_q{q}_p{p}_{c}"


@contextlib.contextmanager
def abstract_h200():
    """JAX lowers for an H200 (132 SMs) inside this context, without one."""
    import jax

    h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=h200)):
        yield


def module_texts(problem) -> list[str]:
    """The Mosaic GPU modules (text without debug locations) of one mla_decode call on `problem`."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import core as mgpu_core

    from mla_jax import pallas_mosaic_gpu as mosaic
    from mla_spec import DecodeMetadata, MLAConfig

    heads, batch, seq_len, q_len, page, cache = problem
    dtype = jnp.float16 if cache == "fp16" else jnp.bfloat16
    fp8 = cache == "fp8"
    tokens = batch * q_len
    blocks = -(-seq_len // page)
    config = MLAConfig(num_heads=heads, page_size=page, dtype=jnp.dtype(dtype).name,
                       kv_cache_dtype="fp8_e4m3" if fp8 else "auto")
    sds = jax.ShapeDtypeStruct
    q = sds((tokens, heads, 576), dtype)
    kv = sds((batch * blocks + 1, page, 576), jnp.float8_e4m3fn if fp8 else dtype)
    md = DecodeMetadata(query_start_loc=sds((batch + 1,), jnp.int32), seq_lens=sds((batch,), jnp.int32),
                        block_table=sds((batch, blocks), jnp.int32), max_query_len=q_len, max_seq_len=seq_len,
                        num_decode_tokens=tokens)

    def fn(q, kv, md, s):
        return mosaic.mla_decode(q, None, kv, md, config, k_scale=s) if fp8 else mosaic.mla_decode(q, None, kv, md,
                                                                                                   config)

    texts = []
    serde = mgpu_core._run_serde_pass  # each Mosaic GPU module passes here just before it is serialized

    def capture(mod, **kw):
        # (the dump name's counter grows with each kernel lowered in the process)
        texts.append(re.sub(r'dump_basename = "(\w+?)_\d+"', r'dump_basename = "\1"',
                            mod.operation.get_asm(enable_debug_info=False)))
        return serde(mod, **kw)

    mgpu_core._run_serde_pass = capture
    try:
        with abstract_h200():
            jax.jit(fn).trace(q, kv, md, sds((), jnp.float32)).lower(lowering_platforms=("cuda",))
    finally:
        mgpu_core._run_serde_pass = serde
    return texts


def fingerprint(problem) -> str:
    try:
        texts = module_texts(problem)
    except (ValueError, NotImplementedError) as e:  # a problem the kernel refuses: its message is the fingerprint
        return f"refused: {type(e).__name__}: {e}"
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def _shard(args):
    index, count, quick = args
    return {problem_name(p): fingerprint(p) for p in problems(quick)[index::count]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write {problem: fingerprint} here")
    p.add_argument("--quick", action="store_true", help="about 40 problems instead of the whole grid")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: the CPU count)")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two --json files and exit")
    args = p.parse_args(argv)
    if args.compare:
        with open(args.compare[0]) as f:
            before = json.load(f)
        with open(args.compare[1]) as f:
            after = json.load(f)
        common = sorted(set(before) & set(after))
        diff = [k for k in common if before[k] != after[k]]
        for k in diff:
            print(f"DIFF {k}: {before[k][:16]} -> {after[k][:16]}")
        print(f"{len(common) - len(diff)} of {len(common)} problems lower to the same text"
              f" ({len(set(before) ^ set(after))} in one file only)")
        return 1 if diff else 0
    import multiprocessing

    jobs = max(1, args.jobs)
    ctx = multiprocessing.get_context("spawn")  # a fresh JAX per worker
    with ctx.Pool(jobs) as pool:
        result = {}
        for part in pool.imap_unordered(_shard, [(i, jobs, args.quick) for i in range(jobs)]):
            result.update(part)
    result = dict(sorted(result.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    refused = sum(v.startswith("refused") for v in result.values())
    print(f"{len(result)} problems lowered ({refused} refused by the kernel)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
