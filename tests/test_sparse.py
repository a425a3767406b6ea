"""The sparse decode's implementations on the shared cases (tests/sparse_cases.py).

The torch reference and the jnp reference (eager and jitted) on every case; the fp8_ds_mla layout read by torch
and jnp bit for bit as by NumPy; bad input through both entry points, each message naming the offending value.
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
from mla_torch import sparse_reference as torch_sparse_reference
from parity.scenarios import round_to
from tests.cases import to_numpy
from tests.sparse_cases import SPARSE_CASES, SparseCases, SparseInputs, assert_sparse_matches, prepare

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


class TestJaxReference(SparseCases):
    def unsupported_reason(self, config, cache_format):
        return mla_jax.sparse_unsupported_reason("reference", config, cache_format=cache_format)

    def decode(self, inputs):
        q, kv = jax_inputs(inputs)
        return mla_jax.sparse_mla_decode(q, kv, inputs.metadata, inputs.config, cache_format=inputs.cache_format)


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
    with pytest.raises(ValueError, match=r"must hold data .*device='meta'"):
        mla_torch.sparse_mla_decode(torch.from_numpy(_Q), torch.empty(_KV.shape, device="meta"), _MD, SMALL_CFG)


def test_check_values_reads_host_indices_and_can_be_turned_off():
    """check_values defaults to reading host arrays (a CPU tensor here); off, the bad slot reaches the gather."""
    md = SparseMetadata(torch.tensor([[0, 99], [1, 2]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"got indices\[0, 1\]=99"):
        mla_torch.sparse_mla_decode(torch.from_numpy(_Q), torch.from_numpy(_KV), md, SMALL_CFG)
    with pytest.raises(IndexError):  # unchecked, the reference's gather is the one to refuse it
        mla_torch.sparse_mla_decode(torch.from_numpy(_Q), torch.from_numpy(_KV), md, SMALL_CFG, check_values=False)


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

