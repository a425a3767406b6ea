"""Times the sparse decode on one GPU: the Mosaic GPU kernel (jax, impl="pallas_mosaic_gpu") against FA3's sparse
path (torch, impl="fa3") on the same bf16 cache and indices, and FlashMLA (impl="flashmla") on the fp8_ds_mla cache
of the same rows. Checks the Mosaic output against the torch reference first.

    python -m tools.sparse_bench --heads 128 --tokens 64 --topk 2048
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--page", type=int, default=64)
    p.add_argument("--blocks", type=int, default=2048)
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args(argv)
    import jax
    import jax.numpy as jnp
    import torch

    import mla_jax
    import mla_torch
    from mla_spec import MLAConfig, SparseMetadata, quantize_sparse_fp8

    cfg = MLAConfig(num_heads=a.heads, page_size=a.page)
    rng = np.random.default_rng(0)
    slots = a.blocks * a.page
    rows = rng.standard_normal((slots, 576), dtype=np.float32)
    idx = np.stack([rng.permutation(slots)[: a.topk] for _ in range(a.tokens)]).astype(np.int32)
    q = rng.standard_normal((a.tokens, a.heads, 576), dtype=np.float32)
    md = SparseMetadata(idx)

    qj = jnp.asarray(q, jnp.bfloat16)
    kvj = jnp.asarray(rows.reshape(a.blocks, a.page, 576), jnp.bfloat16)
    mdj = mla_jax.to_jax_sparse_metadata(md)
    f = jax.jit(lambda q, kv, md: mla_jax.sparse_mla_decode(q, kv, md, cfg, impl="pallas_mosaic_gpu"))
    out, lse = f(qj, kvj, mdj)
    jax.block_until_ready(out)

    qt = torch.from_numpy(q).cuda().bfloat16()
    kvt = torch.from_numpy(rows.reshape(a.blocks, a.page, 576)).cuda().bfloat16()
    mdt = SparseMetadata(torch.from_numpy(idx).cuda())
    ref_out, ref_lse = mla_torch.sparse_mla_decode(qt, kvt, mdt, cfg)
    err = np.abs(np.asarray(out, np.float32) - ref_out.float().cpu().numpy()).max()
    lerr = np.abs(np.asarray(lse) - ref_lse.float().cpu().numpy()).max()
    print(f"mosaic vs torch reference: max |out| err {err:.3g}, max |lse| err {lerr:.3g}")

    def time_jax():
        for _ in range(5):
            jax.block_until_ready(f(qj, kvj, mdj))
        t = time.perf_counter()
        for _ in range(a.iters):
            r = f(qj, kvj, mdj)
        jax.block_until_ready(r)
        return (time.perf_counter() - t) / a.iters * 1e6

    def time_torch(fn):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(a.iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / a.iters * 1e3

    print(f"H{a.heads} T{a.tokens} topk{a.topk} page{a.page}: pallas_mosaic_gpu {time_jax():.1f} us (wall, incl. "
          f"the index encoding)")
    for impl, kv, fmt in (("fa3", kvt, "auto"),
                          ("flashmla", torch.from_numpy(quantize_sparse_fp8(rows).reshape(a.blocks, a.page, 656)).cuda(),
                           "fp8_ds_mla")):
        reason = mla_torch.sparse_unsupported_reason(impl, cfg, "cuda", cache_format=fmt)
        if reason:
            print(f"{impl}: skipped: {reason}")
            continue
        us = time_torch(lambda: mla_torch.sparse_mla_decode(qt, kv, mdt, cfg, impl=impl, cache_format=fmt,
                                                            check_values=False))
        print(f"H{a.heads} T{a.tokens} topk{a.topk} page{a.page}: {impl} ({fmt}) {us:.1f} us")


if __name__ == "__main__":
    main()
