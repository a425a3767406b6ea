"""Fingerprints of the Mosaic GPU kernels that the heuristic builds, lowered on any machine (no GPU needed).

Each problem of the grid (heads 8/16/32/64/128, q_len 1-4, pages of 8/16/32/64/128, a bf16, fp16 or fp8 cache, and
batch x length pairs that give both unsplit and split-KV launches) is lowered through the public
`mla_jax.pallas_mosaic_gpu.mla_decode` with its default (heuristic) tuning, for an abstract H200. The Mosaic GPU
module handed to XLA is printed without debug locations, so moving code between files or functions does not change
it, and hashed. Beside it, `<problem>#xla` fingerprints the rest of the jitted call (the XLA ops around the kernel: padding,
the schedule array, q's conversion and permutation, the combine's launch) as StableHLO text without debug locations
and without the custom calls' payloads. A refactor that must not change the kernels or the work around them shows
the same fingerprints for every problem:

  python tools/kernel_hash.py --json /tmp/after.json            # this checkout
  python tools/kernel_hash.py --compare /tmp/before.json /tmp/after.json

To fingerprint another revision, make a `git worktree` of it and pass `--checkout PATH` (the script uses only the
public API, so it runs against any revision that has `mla_decode(q, None, kv, metadata, config, k_scale=...)`).
`--quick` lowers one problem of each kind (about 40) instead of the whole grid (1,200, ~15 minutes on one core).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import sys

# This checkout's packages first, ahead of any installed copy: by default the fingerprints are of the code beside
# this file (--checkout names another).
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _HERE)

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


def lowered_texts(problem) -> tuple[list[str], str]:
    """(the Mosaic GPU modules' text, the jitted call's StableHLO text), both without debug locations, of one
    mla_decode call on `problem`; the StableHLO's custom calls keep their target, operands and types only."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import core as mgpu_core

    from mla_jax import pallas_mosaic_gpu as mosaic
    from mla_spec import DecodeMetadata, MLAConfig
    from parity.h200 import abstract_h200  # (in every revision the tool compares)

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
            lowered = jax.jit(fn).trace(q, kv, md, sds((), jnp.float32)).lower(lowering_platforms=("cuda",))
    finally:
        mgpu_core._run_serde_pass = serde
    return texts, _without_payloads(lowered.as_text(debug_info=False))


def _without_payloads(hlo: str) -> str:
    """StableHLO text with each custom call cut to its target, operands and types: the payloads (serialized kernels,
    their hashes) carry source locations, and the kernels are fingerprinted on their own."""
    out = []
    for line in hlo.splitlines():
        call = re.match(r"(.*?custom_call @[^(\s]+\(.*?\))", line)
        if call:
            types = line.rfind(" : (")
            line = call.group(1) + (line[types:] if types > 0 else "")
        out.append(line)
    return "\n".join(out)


def module_texts(problem) -> list[str]:
    """The Mosaic GPU modules (text without debug locations) of one mla_decode call on `problem`."""
    return lowered_texts(problem)[0]


def fingerprints(problem) -> dict[str, str]:
    """{name: sha256 of the kernels' text, name#xla: sha256 of the call's StableHLO around them} for `problem`."""
    name = problem_name(problem)
    try:
        texts, hlo = lowered_texts(problem)
    except (ValueError, NotImplementedError) as e:  # a problem the kernel refuses: its message is the fingerprint
        return {name: f"refused: {type(e).__name__}: {e}"}
    return {name: hashlib.sha256("\n".join(texts).encode()).hexdigest(),
            f"{name}#xla": hashlib.sha256(hlo.encode()).hexdigest()}


def fingerprint(problem) -> str:
    """The kernels' fingerprint of `problem` (fingerprints' first entry)."""
    return next(iter(fingerprints(problem).values()))


def _shard(args):
    index, count, quick, checkout = args
    sys.path.insert(0, checkout)  # (a spawned worker: the packages of the checkout being fingerprinted)
    out = {}
    for p in problems(quick)[index::count]:
        out.update(fingerprints(p))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write {problem: fingerprint} here")
    p.add_argument("--quick", action="store_true", help="about 40 problems instead of the whole grid")
    p.add_argument("--checkout", default=_HERE, help="fingerprint the packages of this checkout (default: the one "
                   "holding this script), e.g. a `git worktree` of another revision")
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
        shards = [(i, jobs, args.quick, os.path.abspath(args.checkout)) for i in range(jobs)]
        for part in pool.imap_unordered(_shard, shards):
            result.update(part)
    result = dict(sorted(result.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    kernels = {k: v for k, v in result.items() if not k.endswith("#xla")}
    refused = sum(v.startswith("refused") for v in kernels.values())
    print(f"{len(kernels)} problems lowered ({refused} refused by the kernel)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
