"""The sparse decode's implementations on the shared cases (tests/sparse_cases.py).

CPU: the torch reference, the jnp reference (eager and jitted), and the FA3 and FlashMLA paths end to end against
CPU stand-ins for the kernels (`FakeSparseFA3`, `FakeFlashMLA`: keyword-checking, computing with the torch
reference the way each kernel is documented to), so a wrong argument, a lost mask or a bad compaction fails here;
the fp8_ds_mla layout read by torch and jnp bit for bit as by NumPy; bad input through both entry points, each
message naming the offending value.

GPU (`gpu` marker; skipped with the reason where CUDA, FA3 or FlashMLA is missing): FA3 over one-token pages and
FlashMLA's fp8 kernel on every case they take, and at DeepSeek-V3.2's size (128 heads, topk 2048, 64 tokens).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import mla_jax
import mla_torch
from mla_jax import sparse_reference as jax_sparse_reference
from mla_spec import (
    MLAConfig,
    SparseMetadata,
    build_sparse_metadata,
    dequantize_sparse_fp8,
    quantize_sparse_fp8,
    reference,
)
from mla_torch import flashmla
from mla_torch import sparse_reference as torch_sparse_reference
from mla_torch.fa3 import providers as fa3_providers
from mla_torch.fa3 import sparse as fa3_sparse
from parity.scenarios import round_to
from tests.cases import to_numpy
from tests.sparse_cases import (
    SPARSE_CASES, SparseCase, SparseCases, SparseInputs, SparseScenario, assert_sparse_matches, prepare,
)

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
JAX_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


def torch_inputs(inputs: SparseInputs, device="cpu"):
    """q and the cache as torch tensors of the case's dtypes (the fp8_ds_mla cache as uint8)."""
    dtype = TORCH_DTYPES[inputs.config.dtype]
    q = torch.from_numpy(inputs.q).to(device=device, dtype=dtype)
    kv = torch.from_numpy(inputs.kv_cache).to(device)
    return q, (kv if inputs.cache_format == "fp8_ds_mla" else kv.to(dtype))


def jax_inputs(inputs: SparseInputs):
    q = jnp.asarray(inputs.q, JAX_DTYPES[inputs.config.dtype])
    kv = jnp.asarray(inputs.kv_cache)
    return q, (kv if inputs.cache_format == "fp8_ds_mla" else kv.astype(JAX_DTYPES[inputs.config.dtype]))


# ----------------------------------------------------------------------------------------
# The references
# ----------------------------------------------------------------------------------------


class TestTorchReference(SparseCases):
    def unsupported_reason(self, config, cache_format):
        return mla_torch.sparse_unsupported_reason("reference", config, cache_format=cache_format)

    def decode(self, inputs):
        q, kv = torch_inputs(inputs)
        return mla_torch.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, cache_format=inputs.cache_format)


class JaxSparseCases(SparseCases):
    """A JAX implementation, `impl`, through mla_jax.sparse_mla_decode: `interpret` as the call's argument (None:
    the default, compiled on a GPU), asked about the GPU when `on_gpu` (the GPU classes) and about no device
    otherwise."""

    impl = "xla"
    interpret = None
    on_gpu = False

    def unsupported_reason(self, config, cache_format):
        device = None
        if self.on_gpu and any(d.platform == "gpu" for d in jax.devices()):
            device = jax.devices("gpu")[0]
        return mla_jax.sparse_unsupported_reason(self.impl, config, device, cache_format=cache_format)

    def decode(self, inputs):
        q, kv = jax_inputs(inputs)
        return mla_jax.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, impl=self.impl,
                                         cache_format=inputs.cache_format, interpret=self.interpret)


class TestJaxReference(JaxSparseCases):
    impl = "xla"


class TestTritonSparseInterpret(JaxSparseCases):
    """impl="pallas_triton" in Pallas interpret mode: every shared case, both cache formats."""

    impl = "pallas_triton"
    interpret = True


@pytest.mark.gpu
class TestTritonSparseGPU(JaxSparseCases):
    impl = "pallas_triton"
    on_gpu = True


MOSAIC_INTERPRET_CASES = ("minus_one_scattered-bfloat16", "repeats_within_row-bfloat16", "topk_length-bfloat16",
                          "empty_rows-bfloat16", "topk_1-bfloat16", "page_1-bfloat16", "heads_128-float16",
                          "minus_one_scattered-float16", "minus_one_scattered-bfloat16-fp8_ds_mla",
                          "topk_length-bfloat16-fp8_ds_mla", "empty_rows-bfloat16-fp8_ds_mla",
                          "heads_128-bfloat16-fp8_ds_mla")
"""The shared cases the interpret-mode class runs (each a few seconds on one CPU): -1 anywhere, repeats, topk_length
with NaN past it, empty rows, topk 1, page size 1, 128 heads (two tiles), both 16-bit dtypes; the fp8_ds_mla cache
(its own kernel, sparse_fp8.py) with -1 anywhere, topk_length with NaN bytes past it, empty rows and 128 heads. The
others (topk 2048: 32 steps; the 3-step and pairs cases) add interpret time, not paths; they run on the GPU
class."""


class TestMosaicSparseInterpret(JaxSparseCases):
    """impl="pallas_mosaic_gpu" in Mosaic GPU interpret mode (the gather there: a 1-row TMA a key; compiled it is
    cp.async, which only the GPU class runs)."""

    impl = "pallas_mosaic_gpu"
    interpret = True

    def _prepare_or_skip(self, case):
        if case.id not in MOSAIC_INTERPRET_CASES:
            pytest.skip("interpret mode runs the cases in MOSAIC_INTERPRET_CASES (CI time); the GPU class runs all")
        return super()._prepare_or_skip(case)


@pytest.mark.gpu
class TestMosaicSparseGPU(JaxSparseCases):
    impl = "pallas_mosaic_gpu"
    on_gpu = True


def test_mosaic_sparse_refuses_fp8_ds_mla_with_float16_by_name():
    """The fp8_ds_mla cache runs its wgmmas in bf16 (the dequantized values are exact there, not in f16): a float16
    q is refused, naming the dtype, by the entry point and by the kernel module."""
    inputs = prepare(next(c for c in SPARSE_CASES if c.id == "topk_1-bfloat16-fp8_ds_mla"))
    q, kv = jax_inputs(inputs)
    cfg = inputs.config.replace(dtype="float16")
    assert "needs dtype='bfloat16'" in mla_jax.sparse_unsupported_reason("pallas_mosaic_gpu", cfg,
                                                                         cache_format="fp8_ds_mla")
    with pytest.raises(NotImplementedError, match=r"impl='pallas_mosaic_gpu' cannot run this problem: "
                                                  r"cache_format='fp8_ds_mla' needs dtype='bfloat16'.*"
                                                  r"got dtype='float16'"):
        mla_jax.sparse_mla_decode(q.astype(jnp.float16), kv, inputs.metadata, cfg, impl="pallas_mosaic_gpu",
                                  cache_format="fp8_ds_mla", interpret=True)
    from mla_jax.pallas_mosaic_gpu.sparse import sparse_decode

    with pytest.raises(NotImplementedError, match=r"got q.dtype=float16"):
        sparse_decode(q.astype(jnp.float16), kv, inputs.metadata, cfg, cache_format="fp8_ds_mla", interpret=True)


SPLIT_SCENARIO = SparseScenario("splits", num_tokens=4, topk=200, minus_one=0.1, topk_length=(200, 150, 0, 70))
"""4 steps in 3 splits of 2 (split 2 always empty): token 0's first split only masked keys (its entries [0, 128) set
to -1 below), token 1's topk_length cutting split 1 (step 2 only, 22 of its 64 entries used), token 2 with no used
entry (no split runs a step), token 3's steps all in split 0 (split 1 empty)."""


@pytest.mark.parametrize("cache_format", ["auto", "fp8_ds_mla"])
def test_mosaic_sparse_splits_interpret(cache_format):
    """num_splits 3 (each CTA a split's steps, float32 partials, merged by lse) against the float64 reference."""
    from mla_jax.pallas_mosaic_gpu.sparse import sparse_decode

    case = SparseCase(SPLIT_SCENARIO, cache_format=cache_format)
    inputs = prepare(case)
    indices = inputs.metadata.indices.copy()
    indices[0, :128] = -1
    metadata = inputs.metadata.replace(indices=indices)
    ref_out, ref_lse = reference.sparse_mla_decode(inputs.q, inputs.kv_cache, metadata, inputs.config,
                                                   cache_format=cache_format)
    inputs = dataclasses.replace(inputs, metadata=metadata, ref_out=ref_out, ref_lse=ref_lse)
    q, kv = jax_inputs(inputs)
    md = SparseMetadata(jnp.asarray(indices), jnp.asarray(metadata.topk_length))
    out, lse = sparse_decode(q, kv, md, inputs.config, cache_format=cache_format, interpret=True, num_splits=3)
    assert_sparse_matches(out, lse, inputs, case, f"mosaic sparse 3 splits {case.id}")


def test_mosaic_sparse_num_splits_heuristic():
    """The split heuristic at the sparse bench grid's shapes (parity.shapes GRIDS["sparse"], topk 2048: 32 steps):
    one wave of CTAs (132 // (T x head tiles)), at least 4 steps a split (at most 8 splits), 1 where the tokens
    fill the SMs; and sparse_decode refuses a bad num_splits by value."""
    from mla_jax.pallas_mosaic_gpu.sparse import sparse_decode, sparse_num_splits
    from parity.shapes import GRIDS

    got = {(s.num_heads, s.batch * s.q_len): sparse_num_splits(s.batch * s.q_len, max(1, s.num_heads // 64), 32)
           for s in GRIDS["sparse"]}
    assert got == {(16, 1): 8, (16, 8): 8, (16, 32): 4, (16, 64): 2, (16, 128): 1, (16, 256): 1,
                   (64, 1): 8, (64, 8): 8, (64, 32): 4, (64, 64): 2, (64, 128): 1,
                   (128, 1): 8, (128, 8): 8, (128, 32): 2, (128, 64): 1, (128, 128): 1, (128, 256): 1}, got
    assert sparse_num_splits(1, 1, 3) == 1  # fewer steps than 2 splits of 4
    assert sparse_num_splits(1, 2, 8) == 2
    inputs = prepare(next(c for c in SPARSE_CASES if c.id == "topk_1-bfloat16"))
    q, kv = jax_inputs(inputs)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"num_splits={bad!r}"):
            sparse_decode(q, kv, inputs.metadata, inputs.config, interpret=True, num_splits=bad)


LOWERING_SHAPES = [(128, 64, 2048, 1), (16, 4, 2048, 8), (16, 1, 2048, 8), (128, 8, 2048, 8)]
"""(heads, tokens, topk, the heuristic's num_splits): DeepSeek-V3.2's decode size (unsplit) and small batches, where
each CTA writes a split's float32 partials."""


def _assert_partials(text, heads, tokens, splits):
    """The module's outputs: float32 partials [splits, T, H, 512] and [splits, T, H] exactly when it splits."""
    partials = f"memref<{splits}x{tokens}x{heads}x512xf32>" in text and f"memref<{splits}x{tokens}x{heads}xf32>" in text
    assert partials == (splits > 1), (splits, partials)


@pytest.mark.parametrize("heads, tokens, topk, splits", LOWERING_SHAPES)
def test_mosaic_sparse_lowers_for_h200(heads, tokens, topk, splits):
    """The compiled kernel (its cp.async gather included) lowers for an abstract H200 at DeepSeek-V3.2's decode size
    and at small batches (the heuristic's splits): 36 16-byte cp.async a thread a gather site (prologue, refill),
    an mbarrier arrival each."""
    from tools.sparse_ptx import sparse_modules

    (text, _), = sparse_modules(heads, tokens, topk)
    assert text.count("nvvm.cp.async.shared.global") == 72, text.count("nvvm.cp.async.shared.global")
    assert text.count("nvvm.cp.async.mbarrier.arrive") == 2
    _assert_partials(text, heads, tokens, splits)


@pytest.mark.parametrize("heads, tokens, topk, splits", LOWERING_SHAPES)
def test_mosaic_sparse_fp8_lowers_for_h200(heads, tokens, topk, splits):
    """The fp8_ds_mla kernel (sparse_fp8.py, its cp.async gather included) lowers for an abstract H200: a gather
    site (prologue, refill) is 22 cp.async a thread (16 latent and 4 rope units of 16 bytes, 2 scales of 4 bytes)
    and an mbarrier arrival; the conversion is two loops (one a warpgroup) of 64-column chunks."""
    from tools.sparse_ptx import sparse_modules

    (text, _), = sparse_modules(heads, tokens, topk, fp8=True)
    assert text.count("nvvm.cp.async.shared.global") == 44, text.count("nvvm.cp.async.shared.global")
    assert text.count("nvvm.cp.async.mbarrier.arrive") == 2
    _assert_partials(text, heads, tokens, splits)


def test_jax_reference_under_jit_takes_new_indices_without_recompiling():
    """The metadata is a pytree of traced arrays: new indices (and topk_length) of the same shapes reuse the
    compiled call, and give the reference's answer."""
    case = next(c for c in SPARSE_CASES if c.id == "topk_length-bfloat16")
    inputs = prepare(case)
    q, kv = jax_inputs(inputs)
    traces = []

    @jax.jit
    def decode(q, kv, md):
        traces.append(1)
        return mla_jax.sparse_mla_decode(q, kv, md, inputs.config)

    decode(q, kv, mla_jax.to_jax_sparse_metadata(inputs.metadata))
    md = inputs.metadata
    flipped = build_sparse_metadata(md.indices[::-1], md.topk_length[::-1], config=inputs.config)
    out, lse = decode(q, kv, mla_jax.to_jax_sparse_metadata(flipped))
    assert len(traces) == 1, "new indices recompiled the jitted decode"
    ref_out, ref_lse = reference.sparse_mla_decode(inputs.q, inputs.kv_cache, flipped, inputs.config)
    expected = dataclasses.replace(inputs, metadata=flipped, ref_out=ref_out, ref_lse=ref_lse)
    assert_sparse_matches(out, lse, expected, case, "jitted with new indices")


# ----------------------------------------------------------------------------------------
# FA3 over one-token pages, against a CPU stand-in
# ----------------------------------------------------------------------------------------


class FakeSparseFA3:
    """FA3's `flash_attn_varlen_func` as the sparse path calls it, on the CPU: checks the keywords and shapes (one
    KV head of one-token pages, int32 metadata, every block-table entry a slot of the cache, even past
    `seqused_k`), computes with the torch reference of the dense decode at page size 1 (each sequence's keys the
    first `seqused_k` block-table entries), returns lse `[H, T]`, and leaves NaN in the rows of sequences with no
    key (what FA3 writes there is not relied on)."""

    def __init__(self, config: MLAConfig):
        self.config = config
        self.calls: list[dict] = []

    @property
    def provider(self):
        return fa3_providers.FA3Provider("fake", self.flash_attn_varlen_func, None)

    def flash_attn_varlen_func(self, *, q, k, v, q_v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, seqused_k,
                               block_table, softmax_scale, causal, return_softmax_lse, fa_version,
                               scheduler_metadata, num_splits):
        self.calls.append(dict(locals()))
        from mla_torch import reference as torch_reference

        L, R = self.config.kv_lora_rank, self.config.qk_rope_head_dim
        T = q.shape[0]
        assert fa_version == 3 and causal is True and return_softmax_lse is True and max_seqlen_q == 1
        assert k.shape[1:] == (1, 1, R) and v.shape[1:] == (1, 1, L) and k.shape[0] == v.shape[0], (k.shape, v.shape)
        assert q.shape[-1] == R and q_v.shape[-1] == L
        assert torch.equal(cu_seqlens_q, torch.arange(T + 1, dtype=torch.int32))
        for name, x in (("cu_seqlens_q", cu_seqlens_q), ("seqused_k", seqused_k), ("block_table", block_table)):
            assert x.dtype == torch.int32, (name, x.dtype)
        assert block_table.shape == (T, max_seqlen_k) and block_table.is_contiguous()
        assert int(block_table.min()) >= 0 and int(block_table.max()) < k.shape[0], "a block-table entry off the cache"
        kv = torch.cat([v[:, :, 0], k[:, :, 0]], dim=-1)  # [slots, 1, 576]
        cfg = self.config.replace(page_size=1, softmax_scale=softmax_scale)
        out, lse = torch_reference.mla_decode(q_v, q, kv, cu_seqlens_q, seqused_k, block_table, cfg)
        out[seqused_k == 0], lse[seqused_k == 0] = float("nan"), float("nan")
        return out, lse.T.contiguous()


class TestFA3StandIn(SparseCases):
    """The whole FA3 path (mla_torch.sparse_mla_decode(impl="fa3")) with FA3 replaced by `FakeSparseFA3`."""

    @pytest.fixture(autouse=True)
    def _fake_fa3(self, monkeypatch):
        self.fakes = []

        def require_fa3(device=None):
            fake = FakeSparseFA3(self.config)
            self.fakes.append(fake)
            return fake.provider

        monkeypatch.setattr(fa3_providers, "require_fa3", require_fa3)
        monkeypatch.setattr(fa3_sparse, "unsupported_reason",
                            lambda config, device=None, cache_format="auto": fa3_sparse.config_reason(config, cache_format))

    def unsupported_reason(self, config, cache_format):
        return fa3_sparse.config_reason(config, cache_format)

    def decode(self, inputs):
        self.config = inputs.config
        q, kv = torch_inputs(inputs)
        return mla_torch.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, impl="fa3")


def test_fa3_block_table_is_the_used_entries_in_order_then_the_first_repeated():
    indices = torch.tensor([[5, -1, 7, 5, -1], [-1, -1, -1, -1, -1], [9, 8, 7, 6, 5], [1, 2, 3, 4, 6]], dtype=torch.int32)
    topk_length = torch.tensor([5, 5, 2, 0], dtype=torch.int32)
    block_table, seqused_k = fa3_sparse.compact_block_table(indices, topk_length, num_slots=16)
    assert seqused_k.tolist() == [3, 0, 2, 0]
    assert block_table.tolist() == [[5, 7, 5, 5, 5], [0] * 5, [9, 8, 9, 9, 9], [0] * 5]
    assert block_table.dtype == torch.int32
    # a slot past the cache (unvalidated GPU indices) is clamped into it, before the int32 cast
    wide = torch.tensor([[3, 2**40, 20]], dtype=torch.int64)
    assert fa3_sparse.compact_block_table(wide, None, num_slots=16)[0].tolist() == [[3, 15, 15]]


def test_fa3_call_is_vllms_and_batch_invariant_takes_one_split(monkeypatch):
    """The call vLLM's FlashAttnMLASparseImpl makes (one-token pages, a sequence a token, max_seqlen_k = topk, no
    schedule, FA3's split heuristic), plus the LSE; num_splits 1 under batch_invariant."""
    case = next(c for c in SPARSE_CASES if c.id == "topk_length-bfloat16")
    inputs = prepare(case)
    q, kv = torch_inputs(inputs)
    for invariant, splits in ((False, 0), (True, 1)):
        config = inputs.config.replace(batch_invariant=invariant)
        fake = FakeSparseFA3(config)
        monkeypatch.setattr(fa3_providers, "require_fa3", lambda device=None: fake.provider)
        out, lse = fa3_sparse.sparse_mla_decode(q, kv, torch.from_numpy(inputs.metadata.indices),
                                                torch.from_numpy(inputs.metadata.topk_length), config)
        (call,) = fake.calls
        assert call["num_splits"] == splits and call["scheduler_metadata"] is None
        assert call["max_seqlen_k"] == case.scenario.topk and call["softmax_scale"] == config.softmax_scale
        md = inputs.metadata
        used = [int((md.indices[t, :n] != -1).sum()) for t, n in enumerate(md.topk_length)]
        assert call["seqused_k"].tolist() == used
        assert_sparse_matches(out, lse, inputs, case, f"fa3 stand-in, batch_invariant={invariant}")


def test_fa3_refuses_what_it_does_not_run():
    cfg = MLAConfig(num_heads=16)
    assert "cache_format='fp8_ds_mla'" in fa3_sparse.config_reason(cfg, "fp8_ds_mla")
    assert "dtype='float32'" in fa3_sparse.config_reason(cfg.replace(dtype="float32"))
    assert "kv_lora_rank=256" in fa3_sparse.config_reason(cfg.replace(kv_lora_rank=256))
    q = torch.zeros((1, 16, 576), dtype=torch.bfloat16)
    kv = torch.zeros((64, 2, 576), dtype=torch.bfloat16).transpose(0, 1)  # [2, 64, 576], not contiguous
    with pytest.raises(ValueError, match=r"kv_cache must be contiguous"):
        fa3_sparse.sparse_mla_decode(q, kv, torch.zeros((1, 1), dtype=torch.int32), None, cfg)


# ----------------------------------------------------------------------------------------
# FlashMLA's fp8 kernel, against a CPU stand-in
# ----------------------------------------------------------------------------------------


class FakeFlashMLA:
    """FlashMLA's interface as the sparse path calls it, on the CPU: checks what the V3.2 kernel on Hopper checks
    (bf16 q of 64 or 128 heads as `[b, s_q, h, 576]`, `uint8 [N, P, 1, 656]` rows 656 bytes apart, int32
    indices `[b, s_q, topk]` with topk a multiple of 64, no topk_length, not causal, no block table), computes
    each entry as a key with the torch reference, and gives a query with no key out 0 and lse +inf, as FlashMLA."""

    def __init__(self):
        self.calls: list[dict] = []

    def get_mla_metadata(self, *args, **kwargs):
        assert not args and not kwargs
        return object(), None

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                               topk_length=None, **rest):
        self.calls.append(dict(locals()))
        assert not rest and block_table is None and cache_seqlens is None and num_splits is None
        assert is_fp8_kvcache is True and causal is False and topk_length is None and head_dim_v == 512
        b, s_q, h, d = q.shape
        assert q.dtype == torch.bfloat16 and d == 576 and h in (64, 128) and s_q == 1
        assert k_cache.dtype == torch.uint8 and k_cache.shape[2:] == (1, 656) and k_cache.stride(1) == 656
        assert indices.dtype == torch.int32 and indices.shape[:2] == (b, s_q) and indices.shape[2] % 64 == 0
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        assert int(indices.min()) >= -1 and int(indices.max()) < num_slots, "an index off the cache"
        cfg = MLAConfig(num_heads=h, page_size=k_cache.shape[1], softmax_scale=softmax_scale)
        out, lse = torch_sparse_reference.sparse_mla_decode(
            q[:, 0, :, :512], q[:, 0, :, 512:], k_cache[:, :, 0], indices[:, 0], None, cfg, cache_format="fp8_ds_mla")
        lse = torch.where(lse == float("-inf"), float("inf"), lse)
        return out[:, None], lse[:, :, None]  # [b, s_q, h, 512], [b, h, s_q]


class TestFlashMLAStandIn(SparseCases):
    """The whole FlashMLA path (mla_torch.sparse_mla_decode(impl="flashmla")) with FlashMLA replaced by
    `FakeFlashMLA`."""

    @pytest.fixture(autouse=True)
    def _fake_flashmla(self, monkeypatch):
        self.fake = FakeFlashMLA()
        monkeypatch.setattr(flashmla, "_find_flashmla", lambda: (self.fake, None))
        monkeypatch.setattr(flashmla, "_device_reason", lambda device=None: None)

    def unsupported_reason(self, config, cache_format):
        return flashmla.config_reason(config, cache_format)

    def decode(self, inputs):
        q, kv = torch_inputs(inputs)
        return mla_torch.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, impl="flashmla",
                                           cache_format="fp8_ds_mla")


def _out_of_range(inputs):
    """The case's metadata with token 0's first three entries out of range (past the cache, int32's max, -7): what
    unvalidated GPU indices could hold."""
    idx = np.array(inputs.metadata.indices)
    num_slots = int(np.prod(inputs.kv_cache.shape[:2]))
    idx[0, :3] = [num_slots + 5, 2**31 - 1, -7]
    return inputs.metadata.replace(indices=idx.astype(np.int32))


@pytest.mark.parametrize("impl", ["reference", "fa3", "flashmla"])
def test_torch_paths_never_read_past_the_cache_on_unvalidated_indices(impl, monkeypatch):
    """Indices out of range that nobody validated (check_values=False, as for GPU tensors): a wrong answer for
    that token at most, never a read past the cache (the stand-ins assert every slot they are handed is in it), and
    the other tokens' results unchanged."""
    fmt = "fp8_ds_mla" if impl == "flashmla" else "auto"
    case = next(c for c in SPARSE_CASES if c.id == "minus_one_scattered-bfloat16" + ("-fp8_ds_mla" if fmt != "auto" else ""))
    inputs = prepare(case)
    if impl == "fa3":
        fake = FakeSparseFA3(inputs.config)
        monkeypatch.setattr(fa3_providers, "require_fa3", lambda device=None: fake.provider)
        monkeypatch.setattr(fa3_sparse, "unsupported_reason", lambda *a, **k: None)
    if impl == "flashmla":
        monkeypatch.setattr(flashmla, "_find_flashmla", lambda: (FakeFlashMLA(), None))
        monkeypatch.setattr(flashmla, "_device_reason", lambda device=None: None)
    q, kv = torch_inputs(inputs)
    good = mla_torch.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, impl=impl, cache_format=fmt)
    out, lse = mla_torch.sparse_mla_decode(q, kv, _out_of_range(inputs), inputs.config, impl=impl, cache_format=fmt,
                                           check_values=False)
    # (token 0 reads clamped slots, which hold NaN here like every slot no valid entry names: its answer is wrong)
    assert torch.equal(out[1:], good[0][1:]) and torch.equal(lse[1:], good[1][1:])


@pytest.mark.parametrize("impl", ["xla", "pallas_triton", "pallas_mosaic_gpu"])
def test_jax_paths_never_read_past_the_cache_on_traced_indices(impl):
    """The same under jax.jit, where the indices are traced and not validated: every path clamps or skips such an
    entry, and the other tokens' results are unchanged."""
    inputs = prepare(next(c for c in SPARSE_CASES if c.id == "minus_one_scattered-bfloat16"))
    q, kv = jax_inputs(inputs)
    run = jax.jit(lambda q, kv, md: mla_jax.sparse_mla_decode(q, kv, md, inputs.config, impl=impl))
    good = run(q, kv, inputs.metadata)
    out, lse = run(q, kv, _out_of_range(inputs))
    np.testing.assert_array_equal(np.asarray(out[1:], np.float32), np.asarray(good[0][1:], np.float32))
    np.testing.assert_array_equal(np.asarray(lse[1:]), np.asarray(good[1][1:]))


def test_flashmla_gets_padded_heads_and_rows_with_topk_length_as_minus_one():
    case = next(c for c in SPARSE_CASES if c.id == "topk_length-bfloat16-fp8_ds_mla")
    inputs = prepare(case)
    q, kv = torch_inputs(inputs)
    fake = FakeFlashMLA()
    md = inputs.metadata
    out, lse = flashmla.sparse_mla_decode(q, kv, torch.from_numpy(md.indices), torch.from_numpy(md.topk_length),
                                          inputs.config, interface=fake)
    (call,) = fake.calls
    assert call["q"].shape == (5, 1, 64, 576) and not call["q"][:, :, 16:].any()
    rows = call["indices"][:, 0]
    assert rows.shape == (5, 128)
    for t, n in enumerate(md.topk_length):
        assert torch.equal(rows[t, :n], torch.from_numpy(md.indices[t, :n])) and (rows[t, n:] == -1).all()
    assert_sparse_matches(out, lse, inputs, case, "flashmla stand-in")


def test_flashmla_pads_topk_to_64_and_heads_to_128():
    case = next(c for c in SPARSE_CASES if c.id == "heads_128-bfloat16-fp8_ds_mla")
    inputs = prepare(case)
    q, kv = torch_inputs(inputs)
    few = torch.from_numpy(inputs.metadata.indices[:, :3])
    fake = FakeFlashMLA()
    cfg = inputs.config.replace(num_heads=100)
    flashmla.sparse_mla_decode(q[:, :100], kv, few, None, cfg, interface=fake)
    (call,) = fake.calls
    assert call["q"].shape == (3, 1, 128, 576) and call["indices"].shape == (3, 1, 64)
    assert torch.equal(call["indices"][:, 0, :3], few) and (call["indices"][:, 0, 3:] == -1).all()


def test_flashmla_refuses_what_it_does_not_run():
    cfg = MLAConfig(num_heads=16)
    assert "cache_format='auto'" in flashmla.config_reason(cfg, "auto")
    assert "dtype='float16'" in flashmla.config_reason(cfg.replace(dtype="float16"))
    assert "num_heads=256" in flashmla.config_reason(cfg.replace(num_heads=256))
    assert "batch_invariant" in flashmla.config_reason(cfg.replace(batch_invariant=True))
    assert flashmla.padded_heads(1) == 64 and flashmla.padded_heads(64) == 64 and flashmla.padded_heads(65) == 128


def test_impls_refuse_a_problem_they_do_not_run_by_name():
    inputs = prepare(next(c for c in SPARSE_CASES if c.id == "topk_1-bfloat16"))
    q, kv = torch_inputs(inputs)
    with pytest.raises(NotImplementedError, match=r"impl='flashmla' cannot run this problem: .*cache_format='auto'"):
        mla_torch.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, impl="flashmla")
    with pytest.raises(NotImplementedError, match=r"impl='fa3' cannot run this problem"):
        mla_torch.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, impl="fa3")


# ----------------------------------------------------------------------------------------
# The layout in torch and jnp, and bad input through both entry points
# ----------------------------------------------------------------------------------------


def test_torch_and_jax_dequantize_bit_for_bit():
    rng = np.random.default_rng(3)
    b = rng.integers(0, 256, size=(3, 5, 656), dtype=np.uint8)  # every byte pattern, NaN and inf included
    b[..., 512:528] = quantize_sparse_fp8(rng.standard_normal((3, 5, 576)))[..., 512:528]  # and real scales
    expected = dequantize_sparse_fp8(b)
    for name, got in (("torch", torch_sparse_reference.dequantize_sparse_fp8(torch.from_numpy(b)).numpy()),
                      ("jax", np.asarray(jax_sparse_reference.dequantize_sparse_fp8(jnp.asarray(b))))):
        assert got.shape == expected.shape and got.dtype == np.float32, name
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), err_msg=name)
        same = np.isnan(expected) | (got.view(np.uint32) == expected.view(np.uint32))
        assert same.all(), f"{name}: {int((~same).sum())} values differ"


SMALL_CFG = MLAConfig(num_heads=2, page_size=4, dtype="float32")


def _call_torch(q, kv, md, config, **kw):
    return mla_torch.sparse_mla_decode(torch.from_numpy(q), torch.from_numpy(kv), md, config, **kw)


def _call_jax(q, kv, md, config, **kw):
    return mla_jax.sparse_mla_decode(jnp.asarray(q), jnp.asarray(kv), md, config, **kw)


CALLS = [pytest.param(_call_torch, id="torch"), pytest.param(_call_jax, id="jax")]
_Q = np.zeros((2, 2, 576), np.float32)
_KV = np.zeros((2, 4, 576), np.float32)
_MD = SparseMetadata(np.array([[0, 1], [2, -1]], np.int32))


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("q, kv, md, kw, message", [
    (_Q, _KV, SparseMetadata(np.array([[0, 8], [0, 1]], np.int32)), {},
     r"a slot in \[0, num_blocks \* page_size = 8\), got indices\[0, 1\]=8"),
    (_Q, _KV, SparseMetadata(np.array([[0, 1], [0, -3]], np.int64)), {}, r"got indices\[1, 1\]=-3"),
    (_Q, _KV, _MD.replace(topk_length=np.array([2, 3], np.int32)), {},
     r"topk_length values must be in \[0, topk=2\], got topk_length\[1\]=3"),
    (_Q, _KV, SparseMetadata(np.array([[0.0, 1.0], [2.0, 3.0]])), {},
     r"indices must have an integer dtype, got indices.dtype=float64"),
    (_Q, _KV, _MD.replace(topk_length=np.array([1.0, 2.0])), {},
     r"topk_length must have an integer dtype, got topk_length.dtype=float64"),
    (_Q, _KV, SparseMetadata(np.array([0, 1], np.int32)), {},
     r"indices must be 2-D \[num_tokens, topk\], got indices.shape=\(2,\)"),
    (_Q, _KV, SparseMetadata(np.zeros((3, 2), np.int32)), {},
     r"q token count must equal the rows of indices, metadata.num_tokens=3, got q.shape\[0\]=2"),
    (_Q[:, :1], _KV, _MD, {}, r"q must have num_heads=2 heads, got q.shape\[1\]=1"),
    (_Q.astype(np.float16), _KV, _MD, {}, r"q dtype must be config.dtype='float32', got q.dtype=float16"),
    (_Q, _KV[:, :2], _MD, {}, r"kv_cache must be \[num_blocks, page_size=4, 576\], got kv_cache.shape=\(2, 2, 576\)"),
    (_Q, _KV.astype(np.float16), _MD, {}, r"kv_cache dtype must be config.dtype='float32'.*got kv_cache.dtype=float16"),
    (_Q, _KV, _MD, dict(cache_format="fp8"), r"unknown cache_format='fp8'; expected one of \('auto', 'fp8_ds_mla'\)"),
    (_Q, _KV, _MD, dict(cache_format="fp8_ds_mla"),
     r"with cache_format='fp8_ds_mla' kv_cache must be \[num_blocks, page_size=4, 656\], got kv_cache.shape=\(2, 4, 576\)"),
    (_Q, np.zeros((2, 4, 656), np.float32), _MD, dict(cache_format="fp8_ds_mla"),
     r"kv_cache must be uint8 \(656 bytes a token\), got kv_cache.dtype=float32"),
    (_Q, _KV, _MD, dict(impl="pallas"), r"unknown impl='pallas'"),
    (_Q, _KV, "indices", {}, r"metadata must be an mla_spec.SparseMetadata, got metadata=str"),
])
def test_entry_points_refuse_naming_the_value(call, q, kv, md, kw, message):
    with pytest.raises(ValueError, match=message):
        call(q, kv, md, SMALL_CFG, **kw)


def test_jax_entry_point_takes_interpret_as_the_dense_one():
    """interpret: a bool, or None (interpret mode where JAX has no GPU, as mla_jax.mla_decode); anything else is
    refused by name (a truthy string would turn interpret mode on)."""
    with pytest.raises(ValueError, match=r"interpret must be a bool or None, got interpret='yes'"):
        _call_jax(_Q, _KV, _MD, SMALL_CFG.replace(dtype="bfloat16"), impl="pallas_triton", interpret="yes")
    cfg = SMALL_CFG.replace(num_heads=8, dtype="bfloat16")
    q = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8, 576)), jnp.bfloat16)
    kv = jnp.asarray(np.random.default_rng(1).standard_normal((2, 4, 576)), jnp.bfloat16)
    out, lse = mla_jax.sparse_mla_decode(q, kv, _MD, cfg, impl="pallas_triton")  # (interpret mode where JAX has no GPU)
    ref_out, ref_lse = mla_jax.sparse_mla_decode(q, kv, _MD, cfg)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), atol=1e-3)


@pytest.mark.parametrize("call", CALLS)
def test_entry_points_refuse_an_fp8_e4m3_config_and_other_head_dims_for_fp8_ds_mla(call):
    with pytest.raises(ValueError, match=r"takes kv_cache_dtype='auto' \(its fp8 cache is cache_format='fp8_ds_mla'\), "
                                         r"got kv_cache_dtype='fp8_e4m3'"):
        call(_Q, _KV, _MD, SMALL_CFG.replace(kv_cache_dtype="fp8_e4m3"))
    small = MLAConfig(num_heads=2, kv_lora_rank=256, page_size=4, dtype="float32")
    with pytest.raises(ValueError, match=r"holds kv_lora_rank=512 and qk_rope_head_dim=64, got kv_lora_rank=256"):
        call(np.zeros((2, 2, 320), np.float32), np.zeros((2, 4, 656), np.uint8), _MD, small, cache_format="fp8_ds_mla")


def test_torch_entry_point_refuses_non_tensors_and_meta_tensors():
    with pytest.raises(ValueError, match=r"must be torch tensors, got kv_cache=ndarray"):
        mla_torch.sparse_mla_decode(torch.from_numpy(_Q), _KV, _MD, SMALL_CFG)
    with pytest.raises(ValueError, match=r"^kv_cache must hold data .*device='meta'"):
        mla_torch.sparse_mla_decode(torch.from_numpy(_Q), torch.empty(_KV.shape, device="meta"), _MD, SMALL_CFG)


def test_check_values_reads_host_indices_and_can_be_turned_off():
    """check_values defaults to reading host arrays (a CPU tensor here); off, the bad slot is not refused but clamped
    into the cache by the gather (slot 99 of 8 reads slot 7: a wrong answer for token 0, no read past the cache)."""
    md = SparseMetadata(torch.tensor([[0, 99], [1, 2]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"got indices\[0, 1\]=99"):
        mla_torch.sparse_mla_decode(torch.from_numpy(_Q), torch.from_numpy(_KV), md, SMALL_CFG)
    kv = torch.randn(_KV.shape)
    out, lse = mla_torch.sparse_mla_decode(torch.from_numpy(_Q), kv, md, SMALL_CFG, check_values=False)
    clamped = mla_torch.sparse_mla_decode(torch.from_numpy(_Q), kv, md.replace(indices=torch.tensor(
        [[0, 7], [1, 2]], dtype=torch.int32)), SMALL_CFG)
    assert torch.equal(out, clamped[0]) and torch.equal(lse, clamped[1])


# ----------------------------------------------------------------------------------------
# GPU: FA3 and FlashMLA themselves
# ----------------------------------------------------------------------------------------


@pytest.mark.gpu
class TestFA3GPU(SparseCases):
    def unsupported_reason(self, config, cache_format):
        return mla_torch.sparse_unsupported_reason("fa3", config, "cuda", cache_format=cache_format)

    def decode(self, inputs):
        q, kv = torch_inputs(inputs, "cuda")
        out, lse = mla_torch.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, impl="fa3")
        torch.cuda.synchronize()
        return out, lse


@pytest.mark.gpu
class TestFlashMLAGPU(SparseCases):
    def unsupported_reason(self, config, cache_format):
        return mla_torch.sparse_unsupported_reason("flashmla", config, "cuda", cache_format=cache_format)

    def decode(self, inputs):
        q, kv = torch_inputs(inputs, "cuda")
        out, lse = mla_torch.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, impl="flashmla",
                                               cache_format="fp8_ds_mla")
        torch.cuda.synchronize()
        return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("impl, cache_format", [("fa3", "auto"), ("flashmla", "fp8_ds_mla")])
def test_gpu_deepseek_v32_size(impl, cache_format):
    """DeepSeek-V3.2's decode shape: 128 heads, topk 2048, 64 query tokens (32 requests x 2 tokens), page 64,
    indices from GPU tensors (values not read on the host), against the torch reference on the GPU."""
    cfg = MLAConfig(num_heads=128, page_size=64)
    reason = mla_torch.sparse_unsupported_reason(impl, cfg, "cuda", cache_format=cache_format)
    if reason is not None:
        pytest.skip(reason)
    gen = torch.Generator(device="cuda").manual_seed(0)
    num_blocks, T, topk = 256, 64, 2048
    rows = torch.randn((num_blocks * 64, 576), generator=gen, device="cuda").to(torch.bfloat16)
    kv = rows.view(num_blocks, 64, 576)
    if cache_format == "fp8_ds_mla":
        kv = torch.from_numpy(quantize_sparse_fp8(rows.float().cpu().numpy()).reshape(num_blocks, 64, 656)).cuda()
    indices = torch.stack([torch.randperm(num_blocks * 64, generator=gen, device="cuda")[:topk] for _ in range(T)])
    indices = torch.where(torch.rand((T, topk), generator=gen, device="cuda") < 0.05, -1, indices).to(torch.int32)
    topk_length = torch.randint(1, topk + 1, (T,), generator=gen, device="cuda", dtype=torch.int32)
    q = torch.randn((T, 128, 576), generator=gen, device="cuda").to(torch.bfloat16)
    md = SparseMetadata(indices=indices, topk_length=topk_length)
    out, lse = mla_torch.sparse_mla_decode(q, kv, md, cfg, impl=impl, cache_format=cache_format)
    ref_out, ref_lse = mla_torch.sparse_mla_decode(q, kv, md, cfg, cache_format=cache_format)
    torch.cuda.synchronize()
    from parity.compare import compare_out_lse

    c_out, c_lse = compare_out_lse(to_numpy(out), to_numpy(lse), to_numpy(ref_out).astype(np.float64),
                                   to_numpy(ref_lse).astype(np.float64), "bfloat16")
    assert c_out.ok, f"{impl}: {c_out.message}"
    assert c_lse.ok, f"{impl}: {c_lse.message}"


def test_torch_inputs_keep_the_case_values():
    """The test's casts lose nothing: the torch and jax inputs hold the case's (dtype-rounded) values."""
    for case in (SPARSE_CASES[0], next(c for c in SPARSE_CASES if c.fp8)):
        inputs = prepare(case)
        q, kv = torch_inputs(inputs)
        assert np.array_equal(q.float().numpy(), round_to(inputs.q, case.dtype))
        if case.fp8:
            assert np.array_equal(kv.numpy(), inputs.kv_cache)
        else:
            assert np.array_equal(kv.float().numpy(), inputs.kv_cache, equal_nan=True)

