"""Batch-invariant mode (MLAConfig.batch_invariant, vLLM's VLLM_BATCH_INVARIANT): one request's
out and lse are bitwise identical whether it runs alone or inside batches of 1 to 64 requests.

The request ("target") keeps its q, its cache pages (NaN page tail included) and its metadata
row; the rest of the batch (other requests with random seq_len and q_len, other block ids, the
target's position, the block table's width, max_query_len) changes from batch to batch.
CPU: the jnp reference, the torch reference and the Pallas Triton kernel in interpret mode. GPU
(marked `gpu`, run by the lead on the H200): the compiled Triton kernel and FA3.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import mla_jax
import mla_torch
from mla_jax import pallas_triton
from mla_jax.pallas_triton import TritonConfig, heuristic_config
from mla_spec import MLAConfig, build_decode_metadata
from mla_torch import fa3
from parity.scenarios import Scenario, make_batch, make_fp8_batch

H, P = 16, 16
BATCH_SIZES = (1, 2, 5, 17, 64)
TARGETS = {  # (seq_len, q_len)
    "decode": (150, 1),
    "spec_decode": (131, 3),
}


@dataclasses.dataclass(frozen=True)
class Embedded:
    config: MLAConfig
    q: np.ndarray  # float32, bf16 values
    kv_cache: np.ndarray  # float32, bf16 (or fp8) values, NaN where unreadable
    metadata: object
    tokens: slice  # the target's query tokens
    k_scale: float = 1.0


@functools.lru_cache(maxsize=None)
def target_batch(name: str, fp8: bool = False, page_tail: str = "nan"):
    seq_len, q_len = TARGETS[name]
    sc = Scenario(f"target_{name}", (seq_len,), (q_len,), num_heads=H, page_size=P)
    if fp8:
        return make_fp8_batch(sc, "bfloat16", seed=11, page_tail=page_tail, batch_invariant=True)
    return make_batch(sc, "bfloat16", seed=11, page_tail=page_tail, batch_invariant=True), 1.0


@functools.lru_cache(maxsize=None)
def embedded(name: str, batch_size: int, fp8: bool = False, page_tail: str = "nan") -> Embedded:
    """The target inside a batch of `batch_size` requests (batch_size 1: alone, other block ids).
    page_tail: make_batch's filling of the slots past seq_len in last pages ("finite" for FA3,
    which turns NaN there into NaN outputs for some tiles: README, parity/results/NOTES.md)."""
    target, k_scale = target_batch(name, fp8, page_tail)
    seq_len, q_len = TARGETS[name]
    rng = np.random.default_rng(1000 + batch_size)
    seqs = [int(s) for s in rng.integers(1, 201, size=batch_size)]
    qlens = [int(min(rng.integers(1, 5), s)) for s in seqs]
    pos = int(rng.integers(0, batch_size))
    seqs[pos], qlens[pos] = seq_len, q_len
    sc = Scenario(f"batch_{batch_size}", tuple(seqs), tuple(qlens), num_heads=H, page_size=P)
    if fp8:
        other, _ = make_fp8_batch(sc, "bfloat16", seed=batch_size, page_tail=page_tail, batch_invariant=True)
    else:
        other = make_batch(sc, "bfloat16", seed=batch_size, page_tail=page_tail, batch_invariant=True)
    qsl = other.metadata.query_start_loc
    tokens = slice(int(qsl[pos]), int(qsl[pos + 1]))
    q = other.q.copy()
    q[tokens] = target.q
    kv = other.kv_cache.copy()
    pages = -(-seq_len // P)
    kv[other.metadata.block_table[pos, :pages]] = target.kv_cache[target.metadata.block_table[0, :pages]]
    return Embedded(other.config, q, kv, other.metadata, tokens, k_scale)


def _bits(x) -> np.ndarray:
    return np.asarray(jnp.asarray(x).astype(jnp.float32)) if not isinstance(x, torch.Tensor) else x.float().cpu().numpy()


def assert_invariant(run, name: str, fp8: bool = False, batch_sizes=BATCH_SIZES, page_tail: str = "nan"):
    """`run(Embedded) -> (out, lse)`; the target's rows must be bitwise equal across all batches."""
    results = {}
    for n in batch_sizes:
        e = embedded(name, n, fp8, page_tail)
        out, lse = run(e)
        results[n] = (_bits(out)[e.tokens], _bits(lse)[e.tokens])
        assert np.isfinite(results[n][0]).all() and np.isfinite(results[n][1]).all()
    ref_out, ref_lse = results[batch_sizes[0]]
    for n, (out, lse) in results.items():
        assert np.array_equal(out, ref_out), (
            f"{name}: out differs between batch sizes {batch_sizes[0]} and {n}: max |diff| "
            f"{np.abs(out - ref_out).max():.3g}"
        )
        assert np.array_equal(lse, ref_lse), (
            f"{name}: lse differs between batch sizes {batch_sizes[0]} and {n}: max |diff| "
            f"{np.abs(lse - ref_lse).max():.3g}"
        )


def _jax_inputs(e: Embedded):
    kv_dtype = jnp.float8_e4m3fn if e.config.is_fp8_kv_cache else jnp.bfloat16
    return jnp.asarray(e.q, jnp.bfloat16), jnp.asarray(e.kv_cache, kv_dtype), mla_jax.to_jax_metadata(e.metadata)


def _run_jax(impl: str, interpret: bool | None = None):
    def run(e: Embedded):
        q, kv, md = _jax_inputs(e)
        return mla_jax.mla_decode(q, kv, md, e.config, impl=impl, interpret=interpret, k_scale=e.k_scale)

    return run


def test_embedding_changes_everything_but_the_target():
    """The batches really differ: sizes, block-table widths, max_query_len, target positions."""
    es = [embedded("spec_decode", n) for n in BATCH_SIZES]
    assert [e.metadata.num_reqs for e in es] == list(BATCH_SIZES)
    assert len({e.metadata.max_blocks for e in es}) > 1
    assert len({e.metadata.max_query_len for e in es}) > 1
    assert len({e.tokens.start for e in es}) > 1
    assert all(np.isnan(e.kv_cache).any() for e in es)  # NaN page tails and spare blocks


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("name", list(TARGETS))
def test_xla_reference_is_batch_invariant(name):
    assert_invariant(_run_jax("xla"), name)


def test_xla_reference_fp8_is_batch_invariant():
    assert_invariant(_run_jax("xla"), "spec_decode", fp8=True)


def test_xla_batch_invariant_path_matches_the_dense_one():
    """The batch-invariant (per-token, chunked) path computes the same attention as the dense one."""
    e = embedded("spec_decode", 17)
    q, kv, md = _jax_inputs(e)
    out_bi, lse_bi = mla_jax.mla_decode(q, kv, md, e.config, impl="xla")
    out, lse = mla_jax.mla_decode(q, kv, md, e.config.replace(batch_invariant=False), impl="xla")
    np.testing.assert_allclose(_bits(out_bi), _bits(out), rtol=0, atol=2e-2)
    np.testing.assert_allclose(np.asarray(lse_bi), np.asarray(lse), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", list(TARGETS))
def test_triton_interpret_is_batch_invariant(name):
    # (three batch sizes, the largest 64 requests: each size is a compile and an interpreted run; the references run
    # all of BATCH_SIZES)
    assert_invariant(_run_jax("pallas_triton", interpret=True), name, batch_sizes=(1, 5, 64))


def test_triton_interpret_without_batch_invariant_is_not():
    """The negative control: with batch_invariant=False the heuristic's tiles follow the batch
    (block_q 1 alone, 4 beside a request with q_len 4) and the target's bits change."""

    def run(e: Embedded):
        return _run_jax("pallas_triton", interpret=True)(
            dataclasses.replace(e, config=e.config.replace(batch_invariant=False))
        )

    with pytest.raises(AssertionError, match="differs between batch sizes 1 and 2"):
        assert_invariant(run, "decode", batch_sizes=(1, 2))


def test_triton_interpret_fp8_is_batch_invariant():
    assert_invariant(_run_jax("pallas_triton", interpret=True), "decode", fp8=True, batch_sizes=(1, 5, 64))


def test_torch_reference_is_batch_invariant():
    def run(e: Embedded):
        return mla_torch.mla_decode(
            torch.from_numpy(e.q).bfloat16(), torch.from_numpy(e.kv_cache).bfloat16(), e.metadata, e.config
        )

    assert_invariant(run, "spec_decode")


def _heuristic(e_or_md, config: MLAConfig) -> TritonConfig:
    md = e_or_md
    return heuristic_config(
        config, md.num_decode_tokens, md.max_blocks, max_query_len=md.max_query_len, num_reqs=md.num_reqs,
        max_num_splits=md.max_num_splits,
    )


def test_triton_heuristic_depends_on_the_batch_unless_batch_invariant():
    """Without batch_invariant the heuristic's query tile (block_q) follows the batch that holds one request of
    1000 tokens, and its balanced cuts (chunk_steps 0) follow every length in the batch. With batch_invariant every
    batch gets one token a tile and the chunk INVARIANT_CHUNK_STEPS: only num_parts follows the batch (its query
    tiles), and the parts take whole chunks, so it changes which program computes a chunk, not the chunk's bits."""
    cfg = MLAConfig(num_heads=H, page_size=P)
    rng = np.random.default_rng(5)
    picks = {}
    for n in (1, 5, 17, 64, 128):
        seqs = [1000] + [int(s) for s in rng.integers(100, 2001, size=n - 1)]
        qlens = [1] + [int(q) for q in rng.integers(1, 5, size=n - 1)]
        bt = [list(range(-(-s // P))) for s in seqs]
        md = build_decode_metadata(seq_lens=seqs, query_lens=qlens, block_table=bt, config=cfg)
        picks[n] = (_heuristic(md, cfg), _heuristic(md, cfg.replace(batch_invariant=True)))
    assert picks[1][0].block_q == 1 and picks[5][0].block_q > 1  # max_query_len 1 alone, up to 4 in a batch
    assert {free.chunk_steps for free, _ in picks.values()} == {0}
    assert len({bi.num_parts for _, bi in picks.values()}) > 1
    invariant = {dataclasses.replace(bi, num_parts=1) for _, bi in picks.values()}
    assert len(invariant) == 1, invariant
    (bi,) = invariant
    assert (bi.chunk_steps, bi.block_q, bi.block_h) == (pallas_triton.INVARIANT_CHUNK_STEPS, 1, 16)


def test_triton_refuses_batch_dependent_tuning_under_batch_invariant():
    e = embedded("decode", 2)
    q, kv, md = _jax_inputs(e)
    q_nope, q_pe = mla_jax.split_q(q, e.config)
    for tuning, match in ((TritonConfig(chunk_steps=0), "chunk_steps=0"),
                          (TritonConfig(chunk_steps=16, block_q=2), "block_q=2")):
        with pytest.raises(ValueError, match=match):
            pallas_triton.mla_decode(q_nope, q_pe, kv, md, e.config, tuning=tuning, interpret=True)
        with pytest.raises(ValueError, match=match):
            mla_jax.mla_decode(q, kv, md, e.config, impl="pallas_triton", tuning=tuning, interpret=True)
    # a batch-independent tuning is taken (block_kv 32 instead of the heuristic's 128, its own chunk and parts)
    tuning = TritonConfig(block_kv=32, chunk_steps=2, num_parts=3)
    out, _ = pallas_triton.mla_decode(q_nope, q_pe, kv, md, e.config, tuning=tuning, interpret=True)
    assert np.isfinite(_bits(out)).all()


# several chunks a target (150 and 131 positions in steps of 16: 10 and 9 steps, chunks of 2), and a part count
# that changes with the batch
CHUNKED_PARTS = {1: 3, 5: 7, 17: 16}


@pytest.mark.parametrize("name", list(TARGETS))
def test_triton_interpret_chunks_are_batch_invariant(name):
    """A target split into five chunks, merged in slot order, keeps its bits over batches that differ in every
    other request and in the part count (which moves whole chunks between programs)."""

    def run(e: Embedded):
        q, kv, md = _jax_inputs(e)
        q_nope, q_pe = mla_jax.split_q(q, e.config)
        tuning = TritonConfig(block_kv=16, chunk_steps=2, num_parts=CHUNKED_PARTS[e.metadata.num_reqs])
        return pallas_triton.mla_decode(q_nope, q_pe, kv, md, e.config, tuning=tuning, interpret=True)

    seq_len, q_len = TARGETS[name]
    assert -(-seq_len // 16) > 4 * 2  # five chunks
    assert_invariant(run, name, batch_sizes=tuple(CHUNKED_PARTS))


def test_triton_interpret_prebuilt_schedule_is_batch_invariant():
    """The schedule built ahead by pallas_triton.with_schedule (once a batch) and walked through mla_jax.mla_decode:
    the target's chunks keep their bits over the batches and part counts, as with the schedule built inline."""

    def run(e: Embedded):
        q, kv, md = _jax_inputs(e)
        tuning = TritonConfig(block_kv=16, chunk_steps=2, num_parts=CHUNKED_PARTS[e.metadata.num_reqs])
        ahead = pallas_triton.with_schedule(md, e.config, tuning=tuning)
        assert ahead.scheduler_metadata.chunk_steps == 2
        return mla_jax.mla_decode(q, kv, ahead, e.config, impl="pallas_triton", tuning=tuning, interpret=True)

    assert_invariant(run, "spec_decode", batch_sizes=tuple(CHUNKED_PARTS))


def test_config_batch_invariant_is_a_validated_bool():
    assert MLAConfig(num_heads=16).batch_invariant is False
    assert MLAConfig(num_heads=16, batch_invariant=True).replace(page_size=16).batch_invariant is True
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match=f"batch_invariant={bad!r}"):
            MLAConfig(num_heads=16, batch_invariant=bad)


def test_mosaic_gpu_refuses_batch_invariant():
    cfg = MLAConfig(num_heads=16, batch_invariant=True)
    assert mla_jax.unsupported_reason("pallas_mosaic_gpu", cfg.replace(batch_invariant=False)) is None
    assert "batch_invariant" in mla_jax.unsupported_reason("pallas_mosaic_gpu", cfg)
    assert mla_jax.unsupported_reason("pallas_triton", cfg) is None
    e = embedded("decode", 2)
    q, kv, md = _jax_inputs(e)
    with pytest.raises(NotImplementedError, match="batch_invariant"):
        mla_jax.mla_decode(q, kv, md, e.config, impl="pallas_mosaic_gpu", interpret=True)


def test_fa3_builder_uses_one_split_under_batch_invariant():
    """The newer seed's rule: max_num_splits = 1 under batch invariance, in eager and graph mode
    and over a requested split count (FakeFA3 records the schedule call)."""
    from test_fa3 import FakeFA3

    e = embedded("spec_decode", 5)
    for cfg, expected in ((e.config.replace(batch_invariant=False), (0, 32, 4)), (e.config, (1, 1, 1))):
        got = []
        for graph, md in ((False, e.metadata), (True, e.metadata), (False, e.metadata.replace(max_num_splits=4))):
            fake = FakeFA3(cfg)
            b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=graph, fa3_provider=fake.provider)
            d = b.build(md).decode
            assert fake.sched_calls[-1]["num_splits"] == d.max_num_splits
            got.append(d.max_num_splits)
        assert tuple(got) == expected, (cfg.batch_invariant, got)


# ----------------------------------------------------------------------------- GPU (the H200)


def _needs_jax_gpu():
    if jax.default_backend() != "gpu":
        pytest.skip(f"JAX has no GPU (default backend {jax.default_backend()!r})")
    reason = mla_jax.unsupported_reason("pallas_triton", MLAConfig(num_heads=H, batch_invariant=True), jax.devices()[0])
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TARGETS))
def test_gpu_triton_is_batch_invariant(name):
    _needs_jax_gpu()
    assert_invariant(_run_jax("pallas_triton", interpret=False), name)


@pytest.mark.gpu
def test_gpu_triton_fp8_is_batch_invariant():
    _needs_jax_gpu()
    assert_invariant(_run_jax("pallas_triton", interpret=False), "spec_decode", fp8=True)


@pytest.mark.gpu
def test_gpu_xla_reference_is_batch_invariant():
    _needs_jax_gpu()
    assert_invariant(_run_jax("xla"), "spec_decode")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TARGETS))
def test_gpu_fa3_is_batch_invariant(name):
    reason = fa3.unsupported_reason(embedded(name, 1).config, "cuda")
    if reason is not None:
        pytest.skip(reason)

    def run(e: Embedded):
        q = torch.from_numpy(e.q).to("cuda", torch.bfloat16)
        kv = torch.from_numpy(e.kv_cache).to("cuda", torch.bfloat16)
        return mla_torch.mla_decode(q, kv, e.metadata, e.config, impl="fa3")

    assert_invariant(run, name, page_tail="finite")
