"""Decode context parallelism (DCP): the interleaved KV layout, the exact LSE merge, the JAX
`shard_map` entry point on a CPU device mesh (and two GPUs), and the torch local merge
(torch reference; FA3 on a GPU), each against the unsharded result.

The JAX mesh tests need several devices. On CPU, JAX must start with
`XLA_FLAGS=--xla_force_host_platform_device_count=4`, which this pytest process has not
done when JAX is already initialized with one device: `test_dcp_mesh_cpu_in_subprocess`
then runs them in a fresh pytest process with the flag set (skipped where this process
already has the devices, then they run here).
"""

import functools
import math
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import mla_jax
import mla_torch
from mla_jax import dcp as jdcp
from mla_spec import Bucket, pad_to_bucket, reference
from mla_spec import dcp as sdcp
from mla_torch import dcp as tdcp
from parity.compare import compare_out_lse
from parity import scenarios as _scenarios
from parity.scenarios import Scenario, make_batch

JNP = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# (name, seq_lens, num_heads, page_size): seq_lens below the world size leave shards empty.
DCP_SCENARIOS = {
    "short_empty_shards": ((1, 2, 3, 5), 16, 16),
    "mixed_page_64": ((1, 17, 97, 1030), 16, 64),
    "heads_128": ((3, 200), 128, 16),
}


@functools.lru_cache(maxsize=None)
def _case(name: str, world_size: int, dtype: str = "bfloat16", seed: int = 0, fill: float = math.nan,
          page_tail: str = "nan"):
    """(batch, shards, ref_out, ref_lse): a global batch (NaN in unread slots), its
    interleaved shards with permuted local pages, and the float64 reference on the global batch."""
    seq_lens, heads, page = DCP_SCENARIOS[name]
    sc = Scenario(name, seq_lens=seq_lens, query_lens=(1,) * len(seq_lens), num_heads=heads, page_size=page)
    batch = make_batch(sc, dtype, seed=seed, page_tail=page_tail, dcp_world_size=world_size)
    shards = sdcp.shard_batch(batch.kv_cache, batch.metadata, batch.config, permute_blocks=True, seed=seed,
                              fill=fill)
    ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    return batch, shards, ref_out, ref_lse


HAS_FP8 = hasattr(_scenarios, "make_fp8_batch")
FP8_SKIP = "fp8 KV cache support (parity.scenarios.make_fp8_batch) is not in this tree"


@functools.lru_cache(maxsize=None)
def _fp8_case(name: str, world_size: int):
    """(batch, k_scale, shards, ref_out, ref_lse) with an fp8 cache (float32 holding fp8 values)."""
    seq_lens, heads, page = DCP_SCENARIOS[name]
    sc = Scenario(name, seq_lens=seq_lens, query_lens=(1,) * len(seq_lens), num_heads=heads, page_size=page)
    batch, k_scale = _scenarios.make_fp8_batch(sc, "bfloat16", dcp_world_size=world_size)
    shards = sdcp.shard_batch(batch.kv_cache, batch.metadata, batch.config, permute_blocks=True)
    ref_out, ref_lse = reference.mla_decode(
        batch.q, batch.kv_cache * k_scale, batch.metadata, batch.config.replace(kv_cache_dtype="auto")
    )
    return batch, k_scale, shards, ref_out, ref_lse


def _check(out, lse, ref_out, ref_lse, dtype, what):
    out = np.asarray(out, np.float32) if not isinstance(out, torch.Tensor) else out.float().cpu().numpy()
    lse = np.asarray(lse) if not isinstance(lse, torch.Tensor) else lse.float().cpu().numpy()
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape, (out.shape, lse.shape)
    c_out, c_lse = compare_out_lse(out, lse, ref_out, ref_lse, dtype)
    assert c_out.ok, f"{what}: {c_out.message}"
    assert c_lse.ok, f"{what}: {c_lse.message}"


def _bucket_for(md, extra_reqs=2, extra_tokens=3):
    """A bucket the batch fits with room to spare: padding requests, padding token rows, wider
    block tables and a longer bound than its own."""
    return Bucket(num_reqs=md.num_reqs + extra_reqs, num_tokens=int(md.num_decode_tokens) + extra_tokens,
                  max_blocks=md.max_blocks + 2, max_seq_len=md.max_seq_len + 40)


@functools.lru_cache(maxsize=None)
def _padded_case(name: str, world_size: int, fp8: bool = False, fill: float = math.nan, page_tail: str = "nan"):
    """(batch, k_scale, q, shards, ref_out, ref_lse): the scenario's global batch padded to a bucket
    (`pad_to_bucket`: 2 padding requests, 3 padding token rows whose q is NaN), then sharded. Block 0,
    which the padding block-table entries name, holds NaN in the global cache; in the local caches it
    holds `fill` (NaN by default). ref_*: the float64 reference of the real tokens."""
    if fp8:
        batch, k_scale, _, ref_out, ref_lse = _fp8_case(name, world_size)
    else:
        (batch, _, ref_out, ref_lse), k_scale = _case(name, world_size, page_tail=page_tail), 1.0
    assert np.isnan(batch.kv_cache[0]).all(), "block 0 (the padding's) holds NaN"
    md = batch.metadata
    padded = pad_to_bucket(md, _bucket_for(md), batch.config, num_blocks=batch.kv_cache.shape[0])
    shards = sdcp.shard_batch(batch.kv_cache, padded, batch.config, permute_blocks=True, fill=fill)
    q = np.concatenate([batch.q, np.full((3,) + batch.q.shape[1:], np.nan, np.float32)])
    return batch, k_scale, q, shards, ref_out, ref_lse


def _check_padded(out, lse, ref_out, ref_lse, dtype, what):
    """The real rows against the reference; the padding rows past them out 0, lse -inf."""
    out = np.asarray(out, np.float32) if not isinstance(out, torch.Tensor) else out.float().cpu().numpy()
    lse = np.asarray(lse) if not isinstance(lse, torch.Tensor) else lse.float().cpu().numpy()
    T = ref_out.shape[0]
    assert out.shape[0] == T + 3 and lse.shape[0] == T + 3, (out.shape, lse.shape)
    _check(out[:T], lse[:T], ref_out, ref_lse, dtype, what)
    assert (out[T:] == 0).all(), f"{what}: padding rows' out {out[T:].min()} .. {out[T:].max()}, expected 0"
    assert (lse[T:] == -np.inf).all(), f"{what}: padding rows' lse {lse[T:].min()} .. {lse[T:].max()}, expected -inf"


# ----------------------------------------------------------------------------------------
# Layout and sharding
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_local_seq_lens_count_the_interleaved_positions(world_size):
    seq_lens = np.arange(0, 40)
    lens = sdcp.local_seq_lens(seq_lens, world_size)
    assert lens.shape == (world_size, seq_lens.size) and lens.dtype == np.int32
    for i, n in enumerate(seq_lens):
        for s in range(world_size):
            assert lens[s, i] == sum(1 for p in range(n) if p % world_size == s), (n, s)
    np.testing.assert_array_equal(lens.sum(axis=0), seq_lens)


@pytest.mark.parametrize("world_size", [2, 4])
def test_shard_batch_puts_position_p_on_shard_p_mod_world(world_size):
    batch, shards, _, _ = _case("mixed_page_64", world_size)
    cfg, md = batch.config, batch.metadata
    P = cfg.page_size
    assert shards.kv_cache.shape[0] == world_size and shards.kv_cache.shape[2:] == (P, cfg.head_dim)
    smd = shards.metadata
    assert smd.seq_lens.shape == (world_size, md.num_reqs)
    assert smd.query_start_loc.shape == (world_size, md.num_reqs + 1)
    assert smd.block_table.shape[:2] == (world_size, md.num_reqs)
    read = np.zeros(shards.kv_cache.shape[:3], bool)
    for r, seq_len in enumerate(md.seq_lens):
        for p in range(int(seq_len)):
            s, j = p % world_size, p // world_size
            page = smd.block_table[s, r, j // P]
            assert page != 0, "local block 0 is the padding target, never a data page"
            np.testing.assert_array_equal(
                shards.kv_cache[s, page, j % P], batch.kv_cache[md.block_table[r, p // P], p % P]
            )
            read[s, page, j % P] = True
    assert np.isnan(shards.kv_cache[~read]).all(), "every slot no request reads is NaN"


def test_shard_batch_rejects_multi_token_queries_and_world_mismatch():
    sc = Scenario("spec", seq_lens=(9, 20), query_lens=(1, 2), page_size=16)
    batch = make_batch(sc, "bfloat16")  # dcp_world_size=1: q_len 2 is a valid decode here
    cfg2 = batch.config.replace(dcp_world_size=2)
    with pytest.raises(ValueError, match=r"q_len=2 for request 1"):
        sdcp.shard_batch(batch.kv_cache, batch.metadata, cfg2)
    with pytest.raises(ValueError, match=r"config.dcp_world_size=1, world_size=2"):
        sdcp.shard_batch(batch.kv_cache, batch.metadata, batch.config, world_size=2)


def test_shard_batch_of_a_padded_batch_has_its_buckets_shapes():
    """Pad, then shard: the stacked arrays' shapes and static ints are functions of the bucket and W
    alone (one compile per bucket), padding requests hold no KV anywhere, padded carries through."""
    bucket = Bucket(num_reqs=6, num_tokens=8, max_blocks=5, max_seq_len=70)
    seen = set()
    for seq_lens in [(1, 2, 3, 5), (17, 60), (9, 33, 70, 2, 4)]:
        sc = Scenario("b", seq_lens=seq_lens, query_lens=(1,) * len(seq_lens), page_size=16)
        batch = make_batch(sc, "bfloat16", dcp_world_size=4)
        padded = pad_to_bucket(batch.metadata, bucket, batch.config, num_blocks=batch.kv_cache.shape[0])
        shards = sdcp.shard_batch(batch.kv_cache, padded, batch.config, permute_blocks=True)
        md = shards.metadata
        seen.add((shards.kv_cache.shape, md.query_start_loc.shape, md.seq_lens.shape, md.block_table.shape,
                  md.max_query_len, md.max_seq_len, md.num_decode_tokens, md.padded))
        R = len(seq_lens)
        assert md.padded and (md.seq_lens[:, R:] == 0).all() and (md.block_table[:, R:] == 0).all()
        np.testing.assert_array_equal(md.seq_lens.sum(axis=0)[:R], seq_lens)
        sdcp.shard_metadata(md, 3, for_kernel=True).validate(sdcp.local_config(batch.config),
                                                             num_blocks=shards.kv_cache.shape[1])
    # local bound ceil(70 / 4) = 18 tokens in 2 pages of 16; 1 + 6 requests x 2 pages local blocks
    assert seen == {((4, 13, 16, 576), (4, 7), (4, 6), (4, 6, 2), 1, 18, 8, True)}, seen


def test_dcp_padding_is_accepted_only_where_padded_says_so():
    sc = Scenario("p", seq_lens=(5, 9), query_lens=(1, 1), page_size=16)
    batch = make_batch(sc, "bfloat16", dcp_world_size=2)
    padded = pad_to_bucket(batch.metadata, Bucket(num_reqs=4, num_tokens=4, max_blocks=2, max_seq_len=32),
                           batch.config)
    qsl = padded.query_start_loc  # [0, 1, 2, 2, 2]
    sdcp.check_single_token_queries(qsl, padded=True, seq_lens=padded.seq_lens)
    with pytest.raises(ValueError, match=r"q_len=0 for request 2 \(a padding request, q_len 0 and seq_len 0, "
                                         r"needs padded=True: pad_to_bucket\)"):
        sdcp.check_single_token_queries(qsl)
    with pytest.raises(ValueError, match=r"got q_len=0 with seq_len=7 for request 3"):
        sdcp.check_single_token_queries(qsl, padded=True, seq_lens=[5, 9, 0, 7])
    with pytest.raises(ValueError, match=r"q_len=2 for request 1"):
        sdcp.check_single_token_queries([0, 1, 3, 3], padded=True)
    shards = sdcp.shard_batch(batch.kv_cache, padded, batch.config)
    nbl = shards.kv_cache.shape[1]
    with pytest.raises(ValueError, match=r"q_len=0 for request 2 \(a padding request"):
        sdcp.validate_shards(batch.config, shards.metadata.replace(padded=False), world_size=2, num_blocks_local=nbl)
    # a padding request that holds KV on a shard
    bad = shards.metadata.replace(seq_lens=shards.metadata.seq_lens + np.array([[0, 0, 0, 1], [0, 0, 0, 0]], np.int32))
    with pytest.raises(ValueError, match=r"q_len=0 with seq_len=1 for request 3"):
        sdcp.validate_shards(batch.config, bad, world_size=2, num_blocks_local=nbl)
    with pytest.raises(ValueError, match=r"num_blocks_local must be an int that holds the batch's local pages "
                                         r"\(block 0 unused: >= 3\), got num_blocks_local=1"):
        sdcp.shard_batch(batch.kv_cache, padded, batch.config, num_blocks_local=1)


# ----------------------------------------------------------------------------------------
# The merge, against a direct softmax over all scores
# ----------------------------------------------------------------------------------------


def _split_softmax(world_size, T=5, H=3, S=13, L=8, seed=0, empty=()):
    """Scores split over shards as DCP does (interleaved), the per-shard partials, and the
    direct softmax over all of them. `empty`: (shard, token) pairs whose shard holds nothing."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((T, H, S)) * 4
    v = rng.standard_normal((S, L))
    shard_of = np.arange(S) % world_size
    keep = np.ones((world_size, T, S), bool)
    for sh, t in empty:
        keep[sh, t] = False
    visible = keep[shard_of, :, np.arange(S)].T  # [T, S]: position visible at all
    s_all = np.where(visible[:, None, :], s, -np.inf)
    lse = np.log(np.exp(s_all).sum(-1))
    out = np.einsum("ths,sl->thl", np.exp(s_all - lse[..., None]), v)
    outs = np.zeros((world_size, T, H, L))
    lses = np.full((world_size, T, H), -np.inf)
    for sh in range(world_size):
        for t in range(T):
            cols = (shard_of == sh) & keep[sh, t]
            if cols.any():
                st = s[t][:, cols]
                lses[sh, t] = np.log(np.exp(st).sum(-1))
                outs[sh, t] = np.exp(st - lses[sh, t][:, None]) @ v[cols]
    return outs, lses, out, lse


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
def test_merge_equals_the_direct_softmax(world_size, backend):
    empty = ((1, 0), (1, 3)) if world_size > 1 else ()
    outs, lses, ref_out, ref_lse = _split_softmax(world_size, empty=empty)
    if backend == "numpy":
        out, lse = sdcp.merge_partials(outs, lses)
        np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)
        return
    if backend == "jax":
        out, lse = jdcp.merge_partials(jnp.asarray(outs, jnp.float32), jnp.asarray(lses, jnp.float32))
        assert out.dtype == jnp.float32 and lse.dtype == jnp.float32
    else:
        out, lse = tdcp.merge_attn_states(torch.tensor(outs, dtype=torch.float32), torch.tensor(lses, dtype=torch.float32))
        assert out.dtype == torch.float32 and lse.dtype == torch.float32
        out, lse = out.numpy(), lse.numpy()
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-5, atol=1e-5)


def _merge(backend, outs, lses):
    """The LSE merge of float32 NumPy partials by one backend's merge, as NumPy arrays."""
    if backend == "numpy":
        return sdcp.merge_partials(outs, lses)
    if backend == "jax":
        return tuple(np.asarray(x) for x in jdcp.merge_partials(jnp.asarray(outs), jnp.asarray(lses)))
    return tuple(x.numpy() for x in tdcp.merge_attn_states(torch.tensor(outs), torch.tensor(lses)))


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
def test_merge_with_every_shard_empty_gives_zero_and_minus_inf(backend):
    outs = np.zeros((3, 2, 4, 8), np.float32)
    lses = np.full((3, 2, 4), -np.inf, np.float32)
    lses[1, 1] = 0.5  # token 1 has one non-empty shard; token 0 none
    outs[1, 1] = 2.0
    out, lse = _merge(backend, outs, lses)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()
    np.testing.assert_allclose(out[1], 2.0, rtol=1e-6)
    np.testing.assert_allclose(lse[1], 0.5, rtol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch"])
def test_merge_of_a_nan_shard_is_nan_in_that_row_only(backend):
    """A NaN lse (a non-finite q entry of that head) makes that row's out and lse NaN, not a plausible 0; the
    other rows merge as usual."""
    rng = np.random.default_rng(3)
    outs = rng.standard_normal((3, 2, 4, 8)).astype(np.float32)
    lses = rng.standard_normal((3, 2, 4)).astype(np.float32)
    lses[1, 0, 2] = np.nan
    outs[1, 0, 2] = np.nan
    ref_out, ref_lse = sdcp.merge_partials(np.where(np.isnan(outs), 0, outs), np.where(np.isnan(lses), 0, lses))
    out, lse = _merge(backend, outs, lses)
    assert np.isnan(out[0, 2]).all() and np.isnan(lse[0, 2])
    keep = np.ones((2, 4), bool)
    keep[0, 2] = False
    np.testing.assert_allclose(out[keep], ref_out[keep], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse[keep], ref_lse[keep], rtol=1e-5, atol=1e-6)


def test_merge_keeps_out_dtype_and_rejects_bad_shapes():
    outs, lses, _, _ = _split_softmax(2)
    out, _ = jdcp.merge_partials(jnp.asarray(outs, jnp.bfloat16), jnp.asarray(lses, jnp.float32))
    assert out.dtype == jnp.bfloat16
    out, _ = tdcp.merge_attn_states(torch.tensor(outs, dtype=torch.float32), torch.tensor(lses), out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"lses.shape=\(2, 5\)"):
        tdcp.merge_attn_states(torch.tensor(outs), torch.tensor(lses[:, :, 0]))


# ----------------------------------------------------------------------------------------
# JAX: per-shard partials merged without a mesh, and the mesh entry point's checks
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
def test_jax_partials_on_one_device_merge_to_the_unsharded_result(world_size):
    """Each shard through the plain mla_jax.mla_decode (dummy length 1 on empty shards, then
    overwritten), merged by merge_partials: the DCP arithmetic without collectives."""
    batch, shards, ref_out, ref_lse = _case("short_empty_shards", world_size)
    lc = sdcp.local_config(batch.config)
    q = jnp.asarray(batch.q, jnp.bfloat16)
    outs, lses = [], []
    for s in range(world_size):
        md = sdcp.shard_metadata(shards.metadata, s, for_kernel=True)
        out, lse = mla_jax.mla_decode(q, jnp.asarray(shards.kv_cache[s], jnp.bfloat16), md, lc, impl="xla")
        empty = np.asarray(shards.metadata.seq_lens[s]) == 0
        outs.append(jnp.where(empty[:, None, None], 0.0, out.astype(jnp.float32)))
        lses.append(jnp.where(empty[:, None], -jnp.inf, lse))
    assert (np.asarray(shards.metadata.seq_lens) == 0).any(), "the scenario must have empty shards"
    out, lse = jdcp.merge_partials(jnp.stack(outs), jnp.stack(lses), out_dtype=jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    _check(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", f"W={world_size}")


@pytest.mark.parametrize("impl", ["xla", "pallas_triton"])
def test_jax_dcp_on_a_one_device_mesh_equals_mla_decode(impl):
    """World size 1 runs the same shard_map path in this process (whatever its device count)."""
    batch, shards, ref_out, ref_lse = _case("mixed_page_64", 1)
    mesh = jdcp.make_dcp_mesh(1)
    q = jnp.asarray(batch.q, jnp.bfloat16)
    out, lse = jdcp.dcp_mla_decode(q, jnp.asarray(shards.kv_cache, jnp.bfloat16), shards.metadata, batch.config,
                                   mesh=mesh, impl=impl)
    assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    _check(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", impl)


@pytest.mark.parametrize("impl", ["xla", "pallas_mosaic_gpu"])
def test_jax_dcp_padded_bucket_on_a_one_device_mesh(impl):
    """A batch padded to a bucket, then sharded (W = 1): the real rows as the reference, the padding
    rows (NaN q, NaN block 0) out 0, lse -inf. (The Triton kernel: the mesh cases below. The Mosaic GPU
    kernel runs here only: on a 2-device CPU mesh its interpreter fails, "Barrier remains allocated",
    its simulated memory being one per process while each device's kernel checks at its end that no
    barrier is left, the other device's included; test_jax_dcp_*_on_two_gpus run it compiled.)"""
    if impl == "pallas_mosaic_gpu":
        pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")
    batch, _, q, shards, ref_out, ref_lse = _padded_case("short_empty_shards", 1)
    out, lse = jdcp.dcp_mla_decode(jnp.asarray(q, jnp.bfloat16), jnp.asarray(shards.kv_cache, jnp.bfloat16),
                                   shards.metadata, batch.config, mesh=jdcp.make_dcp_mesh(1), impl=impl)
    _check_padded(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", f"padded W=1 {impl}")


def test_jax_dcp_rejects_bad_calls():
    batch, shards, _, _ = _case("short_empty_shards", 2)
    mesh1 = jdcp.make_dcp_mesh(1)
    q = jnp.asarray(batch.q, jnp.bfloat16)
    kv = jnp.asarray(shards.kv_cache, jnp.bfloat16)
    with pytest.raises(ValueError, match=r"config.dcp_world_size=2, world_size=1"):
        jdcp.dcp_mla_decode(q, kv, shards.metadata, batch.config, mesh=mesh1)
    cfg1 = batch.config.replace(dcp_world_size=1)
    with pytest.raises(ValueError, match=r"kv_cache_shards.shape=\(2, "):
        jdcp.dcp_mla_decode(q, kv, shards.metadata, cfg1, mesh=mesh1)
    with pytest.raises(ValueError, match=r"axis_name='tp'"):
        jdcp.dcp_mla_decode(q, kv, shards.metadata, batch.config, mesh=mesh1, axis_name="tp")
    with pytest.raises(ValueError, match=r"impl='fa3'"):
        jdcp.dcp_mla_decode(q, kv, shards.metadata, batch.config, mesh=mesh1, impl="fa3")
    # each part of a (q_nope, q_pe) pair is named when it is an array of another library
    pe = torch.from_numpy(np.ascontiguousarray(batch.q[..., 512:]))
    with pytest.raises(ValueError, match=r"^q_pe must be a NumPy or JAX array, got q_pe=torch.Tensor$"):
        jdcp.dcp_mla_decode((q[..., :512], pe), kv, shards.metadata, cfg1, mesh=mesh1)
    with pytest.raises(ValueError, match=r"^q and kv_cache_shards must be arrays, got kv_cache_shards=list$"):
        jdcp.dcp_mla_decode(q, [kv], shards.metadata, cfg1, mesh=mesh1)
    with pytest.raises(ValueError, match=r"^q must be one array or a \(q_nope, q_pe\) pair, got a tuple of 3$"):
        jdcp.dcp_mla_decode((q[..., :512], q[..., 512:], q), kv, shards.metadata, cfg1, mesh=mesh1)
    # A stacked metadata claiming two query tokens for request 0.
    md = shards.metadata
    bad = md.replace(query_start_loc=md.query_start_loc + np.array([0, 1, 1, 1, 1], np.int32), max_query_len=2)
    with pytest.raises(ValueError, match=r"max_query_len=2"):
        sdcp.validate_shards(batch.config, bad, world_size=2, num_blocks_local=kv.shape[1])
    bad = md.replace(query_start_loc=md.query_start_loc + np.array([0, 1, 1, 1, 1], np.int32))
    with pytest.raises(ValueError, match=r"q_len=2 for request 0"):
        sdcp.validate_shards(batch.config, bad, world_size=2, num_blocks_local=kv.shape[1])
    bad = md.replace(block_table=md.block_table + kv.shape[1])
    with pytest.raises(ValueError, match=r"block id out of range"):
        sdcp.validate_shards(batch.config, bad, world_size=2, num_blocks_local=kv.shape[1])


# ----------------------------------------------------------------------------------------
# JAX on a device mesh (CPU devices here; run in a subprocess with the XLA flag, below)
# ----------------------------------------------------------------------------------------

# xla at both world sizes on every scenario; the Triton kernel (3x xla's time in the subprocess) on each scenario once,
# at W = 4 where a shard of short_empty_shards is empty
MESH_CASES = [(w, "xla", name) for w in (2, 4) for name in DCP_SCENARIOS] + [
    (4, "pallas_triton", "short_empty_shards"), (2, "pallas_triton", "mixed_page_64"),
    (4, "pallas_triton", "heads_128"),
]
MESH_FP8_CASES = [(4, impl, "short_empty_shards") for impl in ("xla", "pallas_triton")] if HAS_FP8 else []


@pytest.mark.parametrize("world_size,impl,name", MESH_CASES)
def test_dcp_mesh(world_size, impl, name):
    if len(jax.devices()) < world_size:
        pytest.skip(
            f"needs {world_size} JAX devices, have {len(jax.devices())}: set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts "
            "(test_dcp_mesh_cpu_in_subprocess does)"
        )
    batch, shards, ref_out, ref_lse = _case(name, world_size)
    mesh = jdcp.make_dcp_mesh(world_size)
    out, lse = jdcp.dcp_mla_decode(
        jnp.asarray(batch.q, jnp.bfloat16), jnp.asarray(shards.kv_cache, jnp.bfloat16), shards.metadata,
        batch.config, mesh=mesh, impl=impl,
    )
    assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    assert out.sharding.is_fully_replicated and len(out.sharding.device_set) == world_size
    _check(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", f"{name} W={world_size} {impl}")


@pytest.mark.skipif(not HAS_FP8, reason=FP8_SKIP)
@pytest.mark.parametrize("world_size,impl,name", MESH_FP8_CASES or [(4, "xla", "short_empty_shards")])
def test_dcp_mesh_fp8(world_size, impl, name):
    if len(jax.devices()) < world_size:
        pytest.skip(f"needs {world_size} JAX devices, have {len(jax.devices())} (test_dcp_mesh_cpu_in_subprocess)")
    batch, k_scale, shards, ref_out, ref_lse = _fp8_case(name, world_size)
    out, lse = jdcp.dcp_mla_decode(
        jnp.asarray(batch.q, jnp.bfloat16), jnp.asarray(shards.kv_cache, jnp.float8_e4m3fn), shards.metadata,
        batch.config, mesh=jdcp.make_dcp_mesh(world_size), impl=impl, k_scale=k_scale,
    )
    _check(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", f"fp8 {name} W={world_size} {impl}")


# Two padded buckets (the subprocess's time: an interpret-mode compile is ~5 s): the Triton kernel at W = 4,
# the fp8 cache through xla at W = 2 (where the tree has it); xla runs padded in the compile-count loop below too.
MESH_PADDED_CASES = [(4, "pallas_triton", False)] + ([(2, "xla", True)] if HAS_FP8 else [])


@pytest.mark.parametrize("world_size,impl,fp8", MESH_PADDED_CASES)
def test_dcp_mesh_padded_bucket(world_size, impl, fp8):
    """Pad to a bucket, then shard: padding requests (q_len 0, seq_len 0; no KV on any shard), padding
    token rows with NaN q, NaN in block 0 and in every unread local slot. The real rows match the
    reference; the padding rows come out 0 / -inf after the merge."""
    if len(jax.devices()) < world_size:
        pytest.skip(f"needs {world_size} JAX devices, have {len(jax.devices())} (test_dcp_mesh_cpu_in_subprocess)")
    batch, k_scale, q, shards, ref_out, ref_lse = _padded_case("short_empty_shards", world_size, fp8)
    kv = jnp.asarray(shards.kv_cache, jnp.float8_e4m3fn if fp8 else jnp.bfloat16)
    out, lse = jdcp.dcp_mla_decode(jnp.asarray(q, jnp.bfloat16), kv, shards.metadata, batch.config,
                                   mesh=jdcp.make_dcp_mesh(world_size), impl=impl, k_scale=k_scale)
    assert out.sharding.is_fully_replicated
    _check_padded(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16",
                  f"padded {'fp8 ' if fp8 else ''}W={world_size} {impl}")


DCP_LOOP_BUCKETS = (Bucket(num_reqs=4, num_tokens=6, max_blocks=4, max_seq_len=64),
                    Bucket(num_reqs=8, num_tokens=10, max_blocks=8, max_seq_len=128))


def test_dcp_mesh_padded_loop_compiles_once_per_bucket():
    """A serving loop's use, W = 2: six batches of different lengths and sizes, each padded to the
    smaller bucket that fits, then sharded, through one `jax.jit` around dcp_mla_decode: one compile
    a bucket, every step against the float64 reference, padding rows 0 / -inf."""
    if len(jax.devices()) < 2:
        pytest.skip(f"needs 2 JAX devices, have {len(jax.devices())} (test_dcp_mesh_cpu_in_subprocess)")
    from mla_jax import to_jax_metadata
    from mla_spec import smallest_bucket

    rng = np.random.default_rng(5)
    mesh = jdcp.make_dcp_mesh(2)
    config = Scenario("loop", (1,), (1,), num_heads=8, page_size=16).config("bfloat16", dcp_world_size=2)
    decode = jax.jit(lambda q, kv, md: jdcp.dcp_mla_decode(q, kv, md, config, mesh=mesh, impl="xla"))
    used = []
    for step, n in enumerate((2, 4, 7, 3, 8, 1)):
        seq_lens = tuple(int(x) for x in rng.integers(1, 120 if n > 4 else 60, size=n))
        sc = Scenario(f"loop{step}", seq_lens, (1,) * n, num_heads=8, page_size=16)
        batch = make_batch(sc, "bfloat16", seed=step, dcp_world_size=2)
        assert batch.config == config
        bucket = smallest_bucket(DCP_LOOP_BUCKETS, batch.metadata)
        used.append(bucket)
        padded = pad_to_bucket(batch.metadata, bucket, config, num_blocks=batch.kv_cache.shape[0])
        shards = sdcp.shard_batch(batch.kv_cache, padded, config, permute_blocks=True, seed=step)
        q = np.full((bucket.num_tokens,) + batch.q.shape[1:], np.nan, np.float32)
        q[:n] = batch.q
        out, lse = decode(jnp.asarray(q, jnp.bfloat16), jnp.asarray(shards.kv_cache, jnp.bfloat16),
                          to_jax_metadata(shards.metadata))
        ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, config)
        out, lse = np.asarray(out.astype(jnp.float32)), np.asarray(lse)
        _check(out[:n], lse[:n], ref_out, ref_lse, "bfloat16", f"step {step} ({bucket})")
        assert (out[n:] == 0).all() and (lse[n:] == -np.inf).all(), f"step {step}: padding rows not 0 / -inf"
    assert set(used) == set(DCP_LOOP_BUCKETS)
    assert decode._cache_size() == len(DCP_LOOP_BUCKETS)


def test_dcp_mesh_cpu_in_subprocess():
    if len(jax.devices()) >= 4:
        pytest.skip("this process has >= 4 JAX devices: test_dcp_mesh runs here")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", os.path.abspath(__file__),
         "-k", "test_dcp_mesh and not subprocess"],
        env=env, cwd=root, capture_output=True, text=True, timeout=600,
    )
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    m = re.search(r"(\d+) passed", proc.stdout)
    expected = len(MESH_CASES) + len(MESH_FP8_CASES) + len(MESH_PADDED_CASES) + 1  # + the compile-count loop
    assert m and int(m.group(1)) == expected and "skipped" not in proc.stdout.splitlines()[-1], tail


# ----------------------------------------------------------------------------------------
# torch: every rank's share on one device, merged
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ["short_empty_shards", "mixed_page_64"])
def test_torch_dcp_local_reference_equals_unsharded_reference(world_size, name):
    batch, shards, ref_out, ref_lse = _case(name, world_size)
    q = torch.tensor(batch.q).to(torch.bfloat16)
    kv = torch.tensor(shards.kv_cache).to(torch.bfloat16)
    out, lse, (outs, lses) = tdcp.dcp_mla_decode_local(q, kv, shards.metadata, batch.config, impl="reference",
                                                       return_partials=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    empty = torch.tensor(shards.metadata.seq_lens == 0)
    assert torch.isneginf(lses[empty]).all() and (outs[empty] == 0).all()
    unsharded = mla_torch.mla_decode(
        q, torch.tensor(batch.kv_cache).to(torch.bfloat16), batch.metadata, batch.config.replace(dcp_world_size=1),
        impl="reference",
    )
    _check(out, lse, ref_out, ref_lse, "bfloat16", "DCP vs float64 reference")
    _check(out, lse, unsharded[0].float().numpy(), unsharded[1].numpy(), "bfloat16", "DCP vs unsharded torch reference")


@pytest.mark.skipif(not HAS_FP8, reason=FP8_SKIP)
def test_torch_dcp_local_fp8_cache():
    batch, k_scale, shards, ref_out, ref_lse = _fp8_case("short_empty_shards", 4)
    q = torch.tensor(batch.q).to(torch.bfloat16)
    kv = torch.tensor(shards.kv_cache).to(torch.float8_e4m3fn)
    out, lse = tdcp.dcp_mla_decode_local(q, kv, shards.metadata, batch.config, impl="reference", k_scale=k_scale)
    _check(out, lse, ref_out, ref_lse, "bfloat16", "fp8 DCP vs float64 reference")


@pytest.mark.parametrize("world_size,fp8", [(2, False), (4, False)] + ([(4, True)] if HAS_FP8 else []))
def test_torch_dcp_local_reference_padded_bucket(world_size, fp8):
    """Pad to a bucket, then shard, through the torch reference: padding requests hold no KV on any
    shard and their partials are (0, -inf) on every shard, as are the padding token rows (NaN q);
    the merge gives the real rows the reference's values and the padding rows out 0, lse -inf."""
    batch, k_scale, q, shards, ref_out, ref_lse = _padded_case("short_empty_shards", world_size, fp8)
    kv = torch.tensor(shards.kv_cache).to(torch.float8_e4m3fn if fp8 else torch.bfloat16)
    out, lse, (outs, lses) = tdcp.dcp_mla_decode_local(
        torch.tensor(q).to(torch.bfloat16), kv, shards.metadata, batch.config, impl="reference",
        k_scale=k_scale, return_partials=True)
    T = ref_out.shape[0]
    assert torch.isneginf(lses[:, T:]).all() and (outs[:, T:] == 0).all()
    _check_padded(out, lse, ref_out, ref_lse, "bfloat16", f"padded torch reference W={world_size} fp8={fp8}")


def test_torch_dcp_local_checks_world_size():
    batch, shards, _, _ = _case("short_empty_shards", 2)
    kv = torch.tensor(shards.kv_cache).to(torch.bfloat16)
    q = torch.tensor(batch.q).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"config.dcp_world_size=2, world_size=1"):
        tdcp.dcp_mla_decode_local(q, kv[:1], shards.metadata, batch.config)
    with pytest.raises(ValueError, match=r"impl='xla'"):
        tdcp.dcp_mla_decode_local(q, kv, shards.metadata, batch.config, impl="xla")


# ----------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------


def _fa3_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    return mla_torch.fa3_unavailable_reason(torch.device("cuda", 0))


@pytest.mark.gpu
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", list(DCP_SCENARIOS))
def test_fa3_partials_merged_equal_unsharded_fa3(world_size, name):
    reason = _fa3_reason()
    if reason:
        pytest.skip(f"FA3 cannot run: {reason}")
    # FA3 may turn NaN in the unread tail of a page into NaN outputs (README): finite garbage there.
    batch, shards, ref_out, ref_lse = _case(name, world_size, fill=1e4, page_tail="finite")
    dev = torch.device("cuda", 0)
    q = torch.tensor(batch.q).to(dev, torch.bfloat16)
    kv = torch.tensor(shards.kv_cache).to(dev, torch.bfloat16)
    out, lse = tdcp.dcp_mla_decode_local(q, kv, shards.metadata, batch.config, impl="fa3")
    fa3_out, fa3_lse = mla_torch.mla_decode(
        q, torch.tensor(batch.kv_cache).to(dev, torch.bfloat16), batch.metadata, batch.config.replace(dcp_world_size=1),
        impl="fa3",
    )
    _check(out, lse, fa3_out.float().cpu().numpy(), fa3_lse.float().cpu().numpy(), "bfloat16", "DCP FA3 vs unsharded FA3")
    _check(out, lse, ref_out, ref_lse, "bfloat16", "DCP FA3 vs float64 reference")


@pytest.mark.gpu
def test_fa3_dcp_with_one_gpu_per_rank():
    reason = _fa3_reason()
    if reason:
        pytest.skip(f"FA3 cannot run: {reason}")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    batch, shards, ref_out, ref_lse = _case("mixed_page_64", 2, fill=1e4, page_tail="finite")
    q = torch.tensor(batch.q).to("cuda:0", torch.bfloat16)
    caches = [torch.tensor(shards.kv_cache[s]).to(f"cuda:{s}", torch.bfloat16) for s in range(2)]
    out, lse = tdcp.dcp_mla_decode_local(q, caches, shards.metadata, batch.config, impl="fa3")
    assert out.device == q.device
    _check(out, lse, ref_out, ref_lse, "bfloat16", "DCP FA3, one GPU per rank, vs float64 reference")


@pytest.mark.gpu
@pytest.mark.parametrize("per_rank", [False, True], ids=["one_gpu", "gpu_per_rank"])
def test_fa3_dcp_padded_bucket(per_rank):
    """FA3 through a padded bucket (W = 2): padding requests and NaN padding q rows, NaN in every
    local block 0 (which padding block-table entries name); finite garbage in page tails (FA3 reads
    them: README). On one GPU, or each rank's cache on its own GPU."""
    reason = _fa3_reason()
    if reason:
        pytest.skip(f"FA3 cannot run: {reason}")
    if per_rank and torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    batch, _, q, shards, ref_out, ref_lse = _padded_case("mixed_page_64", 2, fill=1e4, page_tail="finite")
    kv = shards.kv_cache.copy()
    kv[:, 0] = np.nan
    caches = [torch.tensor(kv[s]).to(f"cuda:{s if per_rank else 0}", torch.bfloat16) for s in range(2)]
    out, lse = tdcp.dcp_mla_decode_local(torch.tensor(q).to("cuda:0", torch.bfloat16), caches, shards.metadata,
                                         batch.config, impl="fa3")
    _check_padded(out, lse, ref_out, ref_lse, "bfloat16", f"padded DCP FA3 ({'per rank' if per_rank else 'one GPU'})")


def _jax_gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


JAX_GPU_IMPLS = ["xla", "pallas_triton", "pallas_mosaic_gpu"]


@pytest.mark.gpu
@pytest.mark.parametrize("impl", JAX_GPU_IMPLS)
@pytest.mark.parametrize("name", list(DCP_SCENARIOS))
def test_jax_dcp_on_two_gpus(impl, name):
    gpus = _jax_gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs 2 JAX GPUs, have {len(gpus)}")
    batch, shards, ref_out, ref_lse = _case(name, 2)
    mesh = jdcp.make_dcp_mesh(2, devices=gpus)
    out, lse = jdcp.dcp_mla_decode(
        jnp.asarray(batch.q, jnp.bfloat16), jnp.asarray(shards.kv_cache, jnp.bfloat16), shards.metadata,
        batch.config, mesh=mesh, impl=impl, interpret=False,
    )
    assert out.sharding.is_fully_replicated and {d.platform for d in out.sharding.device_set} == {"gpu"}
    _check(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", f"{name} {impl} on 2 GPUs")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FP8, reason=FP8_SKIP)
@pytest.mark.parametrize("impl", JAX_GPU_IMPLS)
def test_jax_dcp_fp8_on_two_gpus(impl):
    gpus = _jax_gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs 2 JAX GPUs, have {len(gpus)}")
    batch, k_scale, shards, ref_out, ref_lse = _fp8_case("mixed_page_64", 2)
    out, lse = jdcp.dcp_mla_decode(
        jnp.asarray(batch.q, jnp.bfloat16), jnp.asarray(shards.kv_cache, jnp.float8_e4m3fn), shards.metadata,
        batch.config, mesh=jdcp.make_dcp_mesh(2, devices=gpus), impl=impl, interpret=False, k_scale=k_scale,
    )
    _check(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", f"fp8 {impl} on 2 GPUs")


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("impl", JAX_GPU_IMPLS)
def test_jax_dcp_padded_bucket_on_two_gpus(impl, fp8):
    """Pad to a bucket, then shard, on two GPUs: padding requests, NaN padding q rows, NaN block 0."""
    gpus = _jax_gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs 2 JAX GPUs, have {len(gpus)}")
    if fp8 and not HAS_FP8:
        pytest.skip(FP8_SKIP)
    batch, k_scale, q, shards, ref_out, ref_lse = _padded_case("short_empty_shards", 2, fp8)
    kv = jnp.asarray(shards.kv_cache, jnp.float8_e4m3fn if fp8 else jnp.bfloat16)
    out, lse = jdcp.dcp_mla_decode(jnp.asarray(q, jnp.bfloat16), kv, shards.metadata, batch.config,
                                   mesh=jdcp.make_dcp_mesh(2, devices=gpus), impl=impl, interpret=False,
                                   k_scale=k_scale)
    assert {d.platform for d in out.sharding.device_set} == {"gpu"}
    _check_padded(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", f"padded fp8={fp8} {impl} on 2 GPUs")
