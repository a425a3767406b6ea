"""How much shared memory does the Mosaic GPU kernel allocate for a problem and a tuning, against the 227 KiB a Hopper
block may opt into (what would a new buffer leave)? It lowers the kernel for an H200 on any machine and reads Mosaic
GPU's own count. A design aid, not a test. From the checkout's root: `python -m tools.smem --heads 128` or
`python -m tools.smem --heads 16 --fp8 --set field=value,...`.
"""

from __future__ import annotations

DETAILS = """  python -m tools.smem --heads 128
  python -m tools.smem --heads 16 --fp8 --set transpose=scores_and_pv

The tuning is the heuristic's pick for the problem, with --set's fields replaced (as tools/sweep.py's --set).
"""

import argparse
import re
import sys

SMEM_OPTIN_BYTES = 232448  # 227 KiB: what a Hopper block may opt into


def kernel_smem_bytes(num_heads: int, q_len: int = 1, page_size: int = 64, fp8: bool = False, sets=None,
                      seq_len: int = 300) -> tuple[int, object]:
    """(bytes, tuning): the kernel's shared memory for two requests of seq_len tokens and q_len queries each, on the
    heuristic's tuning with `sets` replaced. Lowered under an artificial 1 KiB limit, so that Mosaic GPU's own
    refusal reports the size (its error message is the only place it says it)."""
    import jax.numpy as jnp
    from jax.experimental.mosaic.gpu import core as mgpu_core

    import mla_jax
    from mla_jax import pallas_mosaic_gpu as mg
    from parity.h200 import lower_for_h200
    from parity.scenarios import Scenario, make_batch
    from parity.h200 import with_overrides

    scenario = Scenario("smem", seq_lens=(seq_len, seq_len), query_lens=(q_len, q_len), num_heads=num_heads,
                        page_size=page_size)
    batch = make_batch(scenario, "bfloat16")
    config = batch.config.replace(kv_cache_dtype="fp8_e4m3") if fp8 else batch.config
    md = batch.metadata
    tuning = mg.heuristic_config(config, md.num_decode_tokens, md.block_table.shape[1], md.num_reqs,
                                 max_query_len=md.max_query_len)
    tuning = with_overrides(tuning, sets or {})
    kv = jnp.asarray(batch.kv_cache, jnp.bfloat16)
    if fp8:
        kv = kv.astype(jnp.float8_e4m3fn)
    args = (jnp.asarray(batch.q_nope, jnp.bfloat16), jnp.asarray(batch.q_pe, jnp.bfloat16), kv,
            mla_jax.to_jax_metadata(md))

    def f(q_nope, q_pe, kv, md):
        return mg.mla_decode(q_nope, q_pe, kv, md, config, tuning=tuning, interpret=False)

    try:
        with mgpu_core.artificial_shared_memory_limit(1024):
            lower_for_h200(f, *args)
    except Exception as e:  # noqa: BLE001 (Mosaic GPU's refusal, wrapped by JAX's tracing)
        m = re.search(r"smem_bytes=(\d+)", str(e))
        if m is None:
            raise
        return int(m.group(1)), tuning
    raise RuntimeError("the kernel lowered under a 1 KiB shared-memory limit: it reported no size")


def main(argv=None) -> int:
    from tools.regions import parse_sets

    p = argparse.ArgumentParser(prog="python -m tools.smem", description=__doc__,
                                epilog=DETAILS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--q-len", type=int, default=1)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--fp8", action="store_true", help="an fp8_e4m3 cache")
    p.add_argument("--set", default="", help="MosaicConfig fields replaced in the heuristic's pick, e.g. "
                                             "transpose=scores_and_pv,num_splits=2")
    args = p.parse_args(argv)
    sets = parse_sets(args.set)
    nbytes, tuning = kernel_smem_bytes(args.heads, args.q_len, args.page_size, args.fp8, sets)
    print(f"H={args.heads} q_len={args.q_len} page={args.page_size} {'fp8' if args.fp8 else 'bf16'} "
          f"{sets or 'heuristic'}: {nbytes} bytes ({nbytes / 1024:.1f} KiB), {SMEM_OPTIN_BYTES - nbytes} left of "
          f"{SMEM_OPTIN_BYTES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
