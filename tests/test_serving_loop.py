"""A decode loop as a serving engine runs it: requests join and leave, each step adds q_len 1-3 tokens to every
request, and each batch is padded to the smallest of a few buckets (mla_spec.Bucket), so that a jitted decode
compiles once per bucket whatever the lengths. Every step is checked against the float64 reference, and the
padding rows against out 0, lse -inf.

The cache is a NumPy array written as the engine would (each step's new tokens into their slots); blocks that
belong to no request hold NaN, as do the slots past a request's seq_len in its last page.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import mla_jax
from mla_spec import Bucket, MLAConfig, build_decode_metadata, pad_to_bucket, reference, smallest_bucket
from parity.compare import TOLERANCES, compare

PAGE = 16
BUCKETS = (
    Bucket(num_reqs=4, num_tokens=8, max_blocks=8, max_seq_len=128, max_query_len=3),
    Bucket(num_reqs=8, num_tokens=24, max_blocks=16, max_seq_len=256, max_query_len=3),
    Bucket(num_reqs=12, num_tokens=36, max_blocks=24, max_seq_len=384, max_query_len=3),
)


@dataclasses.dataclass
class Request:
    blocks: list
    seq_len: int


class Engine:
    """The requests, a block allocator over a NaN-filled cache, and the next batch."""

    def __init__(self, config: MLAConfig, num_blocks: int, seed: int):
        self.config, self.rng = config, np.random.default_rng(seed)
        self.cache = np.full((num_blocks, PAGE, config.head_dim), np.nan, np.float32)
        self.free = list(range(1, num_blocks))  # block 0: never given out (the padding's block-table entry)
        self.reqs: list[Request] = []

    def _write(self, req: Request, start: int, stop: int):
        """KV rows for positions [start, stop) of req (new blocks as needed), rounded to bfloat16 (the config's dtype)."""
        while len(req.blocks) * PAGE < stop:
            req.blocks.append(self.free.pop(self.rng.integers(len(self.free))))
        pos = np.arange(start, stop)
        rows = self.rng.standard_normal((pos.size, self.config.head_dim)).astype(np.float32)
        self.cache[np.asarray(req.blocks)[pos // PAGE], pos % PAGE] = rows.astype(ml_dtypes.bfloat16).astype(np.float32)
        req.seq_len = stop

    def step(self, max_reqs: int, max_seq: int, min_reqs: int = 1):
        """Requests leave (finished) and join (a prefill's KV written; at least min_reqs then); then each gets
        q_len 1-3 new tokens. Returns (query_lens, exact metadata)."""
        rng = self.rng
        for req in [r for r in self.reqs if r.seq_len > max_seq - 3 or rng.random() < 0.08]:
            self.reqs.remove(req)
            self.cache[req.blocks] = np.nan
            self.free += req.blocks
        while len(self.reqs) < max_reqs and (len(self.reqs) < min_reqs or rng.random() < 0.3):
            req = Request([], 0)
            self._write(req, 0, int(rng.integers(1, max_seq // 2)))
            self.reqs.append(req)
        query_lens = [int(rng.integers(1, 4)) for _ in self.reqs]
        for req, q_len in zip(self.reqs, query_lens):
            self._write(req, req.seq_len, req.seq_len + q_len)
        md = build_decode_metadata(seq_lens=[r.seq_len for r in self.reqs], query_lens=query_lens,
                                   block_table=[r.blocks for r in self.reqs], config=self.config,
                                   num_blocks=self.cache.shape[0])
        return query_lens, md


def run_loop(impl: str, steps: int, max_reqs: int, max_seq: int, seed: int = 0, ramp: bool = False, heads: int = 16,
             **extra):
    """The loop on mla_jax.mla_decode(impl=...) under one jax.jit (ramp: step k has at least k + 1 requests);
    returns (compiles, buckets used)."""
    config = MLAConfig(num_heads=heads, page_size=PAGE)
    engine = Engine(config, num_blocks=1 + max_reqs * (max_seq // PAGE + 1), seed=seed)
    decode = jax.jit(lambda q, kv, md: mla_jax.mla_decode(q, kv, md, config, impl=impl, **extra))
    tol = TOLERANCES[config.dtype]
    used = set()
    for step in range(steps):
        _, md = engine.step(max_reqs, max_seq, min_reqs=step + 1 if ramp else 1)
        bucket = smallest_bucket(BUCKETS, md)
        used.add(bucket)
        padded = pad_to_bucket(md, bucket, config, num_blocks=engine.cache.shape[0])
        T = md.num_decode_tokens
        q = engine.rng.standard_normal((bucket.num_tokens, heads, config.head_dim)).astype(np.float32)
        q = q.astype(ml_dtypes.bfloat16).astype(np.float32)
        q[T:] = np.nan  # the padding rows' q: whatever the engine left there
        out, lse = decode(jnp.asarray(q, jnp.bfloat16), jnp.asarray(engine.cache, jnp.bfloat16),
                          mla_jax.to_jax_metadata(padded))
        out, lse = np.asarray(out, np.float32), np.asarray(lse)
        ref_out, ref_lse = reference.mla_decode(q[:T].astype(np.float64), engine.cache.astype(np.float64), md, config)
        c_out = compare(out[:T], ref_out, name="out", rel_tol=tol["out_rel"], cos_tol=tol["out_cos"])
        c_lse = compare(lse[:T], ref_lse, name="lse", abs_tol=tol["lse_abs"])
        assert c_out.ok and c_lse.ok, f"step {step} ({bucket}): {c_out.message} {c_lse.message}"
        assert (out[T:] == 0).all() and (lse[T:] == -np.inf).all(), f"step {step}: padding rows not 0 / -inf"
    return decode._cache_size(), used


def test_xla_loop_compiles_once_per_bucket():
    """200 steps through three buckets (requests joining and leaving, q_len 1-3; 8 heads, to keep the float64
    reference of every step cheap): one compile a bucket."""
    compiles, used = run_loop("xla", steps=200, max_reqs=12, max_seq=380, heads=8)
    assert used == set(BUCKETS), f"the loop reached {len(used)} of {len(BUCKETS)} buckets"
    assert compiles == len(used)


@pytest.mark.parametrize("impl", ["pallas_triton", "pallas_mosaic_gpu"])
def test_kernel_loop_compiles_once_per_bucket(impl):
    """The Pallas kernels in interpret mode, a 5-step loop over the two smaller buckets (step k has k + 1 requests:
    the fifth needs the second bucket): one compile a bucket."""
    if impl == "pallas_mosaic_gpu":
        pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")
    compiles, used = run_loop(impl, steps=5, max_reqs=6, max_seq=120, seed=1, ramp=True, interpret=True)
    assert len(used) == 2, f"the loop reached {len(used)} buckets"
    assert compiles == len(used)
