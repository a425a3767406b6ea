"""The float64 NumPy reference against a brute-force dense attention computed here on its own, the torch and jnp
references with it on random batches, and what the shared cases (tests/cases.py) do not check: the NaN test's
teeth on the float64 reference, q as a pair, seq_len 1, the jnp reference under jax.jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import mla_jax
import mla_torch
from mla_spec import MLAConfig, build_decode_metadata, reference
from parity.compare import compare
from parity.scenarios import SCENARIOS, Scenario, make_batch, random_scenario

OUT_REL, LSE_ABS = 1e-5, 1e-4


def brute_force(q, kv_cache, seq_lens, query_lens, block_tables, config):
    """Token by token, position by position: a deliberately naive second definition."""
    L, P = config.kv_lora_rank, config.page_size
    outs, lses = [], []
    for r, (seq_len, q_len) in enumerate(zip(seq_lens, query_lens)):
        for i in range(q_len):
            t = sum(query_lens[:r]) + i
            pos = seq_len - q_len + i
            keys = np.stack([kv_cache[block_tables[r][p // P], p % P] for p in range(pos + 1)]).astype(np.float64)
            qt = q[t].astype(np.float64)  # [H, 576]
            s = config.softmax_scale * (qt @ keys.T)  # q_nope.kv_c + q_pe.k_pe in one product
            lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
            outs.append(np.exp(s - lse[:, None]) @ keys[:, :L])
            lses.append(lse)
    return np.stack(outs), np.stack(lses)


def _run_all(batch):
    cfg32 = batch.config
    ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, cfg32)
    t_out, t_lse = mla_torch.mla_decode(torch.from_numpy(batch.q), torch.from_numpy(batch.kv_cache), batch.metadata, cfg32)
    j_out, j_lse = mla_jax.mla_decode(jnp.asarray(batch.q), jnp.asarray(batch.kv_cache), batch.metadata, cfg32)
    return (ref_out, ref_lse), (t_out.numpy(), t_lse.numpy()), (np.asarray(j_out), np.asarray(j_lse))


def _assert_close(out, lse, ref_out, ref_lse, what):
    c_out = compare(out, ref_out, name=f"{what} out", rel_tol=OUT_REL)
    c_lse = compare(lse, ref_lse, name=f"{what} lse", abs_tol=LSE_ABS)
    assert c_out.ok, c_out.message
    assert c_lse.ok, c_lse.message


@pytest.mark.parametrize("name", ["single_token", "page_size_1", "spec_decode_page_16", "heads_128_spec"])
def test_reference_matches_brute_force(name):
    sc = SCENARIOS[name]
    batch = make_batch(sc, "float32", seed=2)
    ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    bt = [batch.metadata.block_table[r] for r in range(len(sc.seq_lens))]
    bf_out, bf_lse = brute_force(batch.q, batch.kv_cache, sc.seq_lens, sc.query_lens, bt, batch.config)
    _assert_close(ref_out, ref_lse, bf_out, bf_lse, "numpy reference vs brute force")


@pytest.mark.parametrize("seed", range(4))
def test_random_batches_agree_with_brute_force(seed):
    rng = np.random.default_rng(seed)
    sc = random_scenario(rng, num_heads=4, page_size=int(rng.choice([1, 3, 16])), max_seq=120)
    batch = make_batch(sc, "float32", seed=seed)
    bt = [batch.metadata.block_table[r] for r in range(len(sc.seq_lens))]
    bf_out, bf_lse = brute_force(batch.q, batch.kv_cache, sc.seq_lens, sc.query_lens, bt, batch.config)
    for out, lse in _run_all(batch):
        _assert_close(out, lse, bf_out, bf_lse, f"random {sc}")


def test_poison_is_detected_when_a_slot_is_read():
    """The NaN test has teeth: poisoning one slot that is read makes the output NaN."""
    sc = SCENARIOS["spec_decode"]
    batch = make_batch(sc, "float32")
    kv = batch.kv_cache.copy()
    kv[batch.metadata.block_table[0, 0], 0] = np.nan  # position 0 of request 0: every token of it reads it
    out, lse = reference.mla_decode(batch.q, kv, batch.metadata, batch.config)
    assert np.isnan(out[: sc.query_lens[0]]).all() and np.isfinite(out[sc.query_lens[0]:]).all()


def test_tuple_and_packed_q_agree():
    batch = make_batch(SCENARIOS["spec_decode"], "float32")
    packed = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    split = reference.mla_decode((batch.q_nope, batch.q_pe), batch.kv_cache, batch.metadata, batch.config)
    np.testing.assert_array_equal(packed[0], split[0])
    tq = torch.from_numpy(batch.q)
    t1 = mla_torch.mla_decode(tq, torch.from_numpy(batch.kv_cache), batch.metadata, batch.config)
    t2 = mla_torch.mla_decode((tq[..., :512], tq[..., 512:]), torch.from_numpy(batch.kv_cache), batch.metadata,
                              batch.config)
    torch.testing.assert_close(t1[0], t2[0], rtol=0, atol=0)
    jq = jnp.asarray(batch.q)
    j1 = mla_jax.mla_decode(jq, jnp.asarray(batch.kv_cache), batch.metadata, batch.config)
    j2 = mla_jax.mla_decode((jq[..., :512], jq[..., 512:]), jnp.asarray(batch.kv_cache), batch.metadata, batch.config)
    np.testing.assert_allclose(np.asarray(j1[0]), np.asarray(j2[0]), rtol=1e-6, atol=1e-6)


def test_single_position_is_attention_to_itself():
    """seq_len 1: softmax over one key is 1, so out = kv_c and lse = the score."""
    cfg = MLAConfig(num_heads=2, page_size=4, dtype="float32")
    md = build_decode_metadata(seq_lens=[1], query_lens=[1], block_table=[[1]], config=cfg, num_blocks=2)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 576)).astype(np.float32)
    kv = np.full((2, 4, 576), np.nan, np.float32)
    kv[1, 0] = rng.standard_normal(576)
    out, lse = reference.mla_decode(q, kv, md, cfg)
    np.testing.assert_allclose(out[0, 0], kv[1, 0, :512], rtol=1e-12)
    np.testing.assert_allclose(lse[0], cfg.softmax_scale * (q[0].astype(np.float64) @ kv[1, 0]), rtol=1e-12)


def test_jax_reference_under_jit_with_metadata_pytree():
    batch = make_batch(SCENARIOS["spec_decode"], "float32")
    md = mla_jax.to_jax_metadata(batch.metadata)
    leaves, treedef = jax.tree_util.tree_flatten(md)
    assert len(leaves) == 3  # the arrays; the ints are static, scheduler_metadata None
    f = jax.jit(lambda q, kv, md: mla_jax.mla_decode(q, kv, md, batch.config))
    out, lse = f(jnp.asarray(batch.q), jnp.asarray(batch.kv_cache), md)
    ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    _assert_close(np.asarray(out), np.asarray(lse), ref_out, ref_lse, "jit")
    # same shapes, other values: no retrace needed, and still right
    sc2 = Scenario("other", seq_lens=(50, 100, 290, 1025), query_lens=(2, 4, 8, 3))  # same page counts
    b2 = make_batch(sc2, "float32", seed=5)
    assert b2.metadata.block_table.shape == batch.metadata.block_table.shape
    assert b2.kv_cache.shape == batch.kv_cache.shape
    md2 = mla_jax.to_jax_metadata(b2.metadata.replace(max_seq_len=batch.metadata.max_seq_len))
    out2, lse2 = f(jnp.asarray(b2.q), jnp.asarray(b2.kv_cache), md2)
    r2 = reference.mla_decode(b2.q, b2.kv_cache, b2.metadata, b2.config)
    _assert_close(np.asarray(out2), np.asarray(lse2), *r2, "jit, second batch")
