"""Bad input on the torch side (mla_torch): the builder's metadata conversion, the FA3 Impl's
constructor and forward, the full-CUDA-graph split bound, the `mla_decode` entry and the
torch DCP entry. Each refusal is a ValueError (NotImplementedError for the seed's unsupported
features) naming the argument and the offending value; the valid paths next to them still run.
FA3 itself is replaced by the CPU stand-in of tests/test_fa3.py (`FakeFA3`)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import mla_torch
from mla_spec import MLAConfig
from mla_spec import dcp as sdcp
from mla_spec import reference as np_reference
from mla_spec.config import FP8_KV_CACHE_MSG
from mla_torch import dcp as tdcp
from mla_torch import fa3
from parity.scenarios import SCENARIOS, Scenario, make_batch
from test_fa3 import FakeFA3, _assert_matches, _impl_args, _md, _torch_batch


# ----------------------------------------------------------------------------------------
# 1. cpu_int32 (mla_torch.fa3.metadata; FlashAttnMLAMetadataBuilder.build, FA3DecodeGraph.load)
# ----------------------------------------------------------------------------------------


def _builder(cfg, **kw):
    return fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", fa3_provider=FakeFA3(cfg).provider, **kw)


@pytest.mark.parametrize("make", [lambda v: np.asarray(v, np.float64), lambda v: torch.tensor(v, dtype=torch.float32),
                                  lambda v: [float(x) for x in v]])
def test_build_refuses_float_seq_lens_instead_of_truncating(make):
    cfg = MLAConfig(num_heads=16, page_size=16)
    md, nb = _md(cfg, [9, 65], [1, 1])
    bad = md.replace(seq_lens=make([8.9, 64.5]))
    with pytest.raises(ValueError, match=r"seq_lens must hold integers, got seq_lens\.dtype=(torch\.)?float"):
        _builder(cfg).build(bad, num_blocks=nb)


@pytest.mark.parametrize("to", [np.asarray, torch.as_tensor])
def test_build_refuses_values_outside_int32_instead_of_wrapping(to):
    cfg = MLAConfig(num_heads=16, page_size=16)
    md, nb = _md(cfg, [9, 65], [1, 1])
    seq = np.asarray(md.seq_lens, np.int64)
    seq[1] += 2**32  # would wrap to 65 as int32
    with pytest.raises(ValueError, match=re.escape(f"got seq_lens[1]={65 + 2**32}")):
        _builder(cfg).build(md.replace(seq_lens=to(seq)), num_blocks=nb)
    bt = np.asarray(md.block_table, np.int64)
    bt[0, 0] = -(2**31) - 1
    with pytest.raises(ValueError, match=re.escape(f"block_table must fit in int32 [-2147483648, 2147483647], "
                                                   f"got block_table[0, 0]={-(2**31) - 1}")):
        _builder(cfg).build(md.replace(block_table=to(bt)), num_blocks=nb)
    with pytest.raises(ValueError, match=r"query_start_loc must hold integers, got query_start_loc\.dtype=bool"):
        _builder(cfg).build(md.replace(query_start_loc=np.array([False, True, True])), num_blocks=nb)


def test_build_still_takes_int64_and_uint_metadata():
    cfg = MLAConfig(num_heads=16, page_size=16)
    md, nb = _md(cfg, [9, 65], [1, 1])
    for given in (md.replace(seq_lens=np.asarray(md.seq_lens, np.int64)),
                  md.replace(seq_lens=torch.as_tensor(np.asarray(md.seq_lens), dtype=torch.int64)),
                  md.replace(block_table=np.asarray(md.block_table, np.uint16))):
        out = _builder(cfg).build(given, num_blocks=nb)
        assert out.decode.seq_lens.dtype == torch.int32 and out.decode.seq_lens.tolist() == [9, 65]
        assert out.decode.block_table.tolist() == np.asarray(md.block_table).tolist()


# ----------------------------------------------------------------------------------------
# 2. FlashAttnMLAImpl's constructor
# ----------------------------------------------------------------------------------------


def _impl(**changes):
    cfg = MLAConfig(num_heads=16)
    return fa3.FlashAttnMLAImpl(**_impl_args(fa3_provider=FakeFA3(cfg).provider, **changes))


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "bogus", "FP8", "", None, 8])
def test_impl_refuses_unknown_kv_cache_dtype(kv_cache_dtype):
    with pytest.raises(ValueError, match=re.escape(f"unknown kv_cache_dtype={kv_cache_dtype!r}")):
        _impl(kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"])
def test_impl_keeps_the_seeds_not_implemented_error_for_fp8(kv_cache_dtype):
    with pytest.raises(NotImplementedError) as e:
        _impl(kv_cache_dtype=kv_cache_dtype)
    assert str(e.value) == FP8_KV_CACHE_MSG


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "float16"])
def test_impl_takes_the_backends_kv_cache_dtypes(kv_cache_dtype):
    assert _impl(kv_cache_dtype=kv_cache_dtype).kv_cache_dtype == kv_cache_dtype


@pytest.mark.parametrize("num_heads", [0, -4, 16.0, "16", None, True])
def test_impl_refuses_bad_num_heads(num_heads):
    with pytest.raises(ValueError, match=re.escape(f"num_heads must be an int >= 1, got num_heads={num_heads!r}")):
        _impl(num_heads=num_heads)


@pytest.mark.parametrize("scale", [-1.0, 0.0, float("nan"), float("inf"), "abc", None, True])
def test_impl_refuses_bad_scale(scale):
    with pytest.raises(ValueError, match=re.escape(f"must be a finite float > 0, got scale={scale!r}")):
        _impl(scale=scale)


def test_impl_takes_numpy_numbers():
    impl = _impl(num_heads=np.int64(16), scale=np.float32(0.125))
    assert impl.num_heads == 16 and type(impl.num_heads) is int
    assert impl.scale == 0.125 and type(impl.scale) is float


# ----------------------------------------------------------------------------------------
# 3. FlashAttnMLAImpl.forward_mqa / _forward_decode
# ----------------------------------------------------------------------------------------


def _forward_case(name="single_token", dtype="bfloat16", **impl_changes):
    batch = make_batch(SCENARIOS[name], dtype)
    cfg = batch.config
    fake = FakeFA3(cfg)
    builder = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", fa3_provider=fake.provider)
    impl = fa3.FlashAttnMLAImpl.from_config(cfg, "cpu", fa3_provider=fake.provider, **impl_changes)
    q, kv = _torch_batch(batch)
    return batch, fake, impl, q, kv, builder.build(batch.metadata, num_blocks=kv.shape[0])


def test_forward_refuses_wrong_head_count():
    _, _, impl, q, kv, md = _forward_case()
    with pytest.raises(ValueError, match=re.escape("q must be [num_tokens, num_heads=16, 576], got q.shape=(1, 8, 576)")):
        impl.forward_mqa(q[:, :8], kv, md, None)
    with pytest.raises(ValueError, match=re.escape("q_pe must be [num_tokens, num_heads=16, 64], got q_pe.shape=(1, 16, 32)")):
        impl.forward_mqa((q[..., :512], q[..., 512:544]), kv, md, None)
    with pytest.raises(ValueError, match=re.escape("q must be [num_tokens, num_heads=16, 576], got q.shape=(1, 16, 512)")):
        impl.forward_mqa(q[..., :512], kv, md, None)


def test_forward_expects_the_all_gathered_heads_under_dcp():
    batch = make_batch(SCENARIOS["single_token"], "bfloat16")
    cfg = batch.config
    fake = FakeFA3(cfg)
    impl = fa3.FlashAttnMLAImpl.from_config(cfg.replace(dcp_world_size=2), "cpu", fa3_provider=fake.provider)
    md = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", fa3_provider=fake.provider).build(batch.metadata)
    q, kv = _torch_batch(batch)
    with pytest.raises(ValueError, match=r"num_heads=32, 576\], got q\.shape=\(1, 16, 576\)"):
        impl.forward_mqa(q, kv, md, None)


def test_forward_refuses_wrong_dtypes():
    _, _, impl, q, kv, md = _forward_case()
    with pytest.raises(ValueError, match=re.escape("got q.dtype=torch.float32")):
        impl.forward_mqa(q.float(), kv, md, None)
    with pytest.raises(ValueError, match=re.escape(
            "kv_c_and_k_pe_cache dtype must be torch.bfloat16 with kv_cache_dtype='auto' and q.dtype=torch.bfloat16, "
            "got kv_c_and_k_pe_cache.dtype=torch.float8_e4m3fn")):
        impl.forward_mqa(q, kv.to(torch.float8_e4m3fn), md, None)
    with pytest.raises(ValueError, match=re.escape("got kv_c_and_k_pe_cache.dtype=torch.float16")):
        impl.forward_mqa(q, kv.half(), md, None)
    with pytest.raises(ValueError, match=r"q_nope and q_pe must agree on tokens and dtype"):
        impl.forward_mqa((q[..., :512], q[..., 512:].half()), kv, md, None)
    # kv_cache_dtype="float16" pins the cache's dtype whatever q's is
    _, _, impl16, q, kv, md = _forward_case(dtype="bfloat16")
    impl16.kv_cache_dtype = "float16"
    with pytest.raises(ValueError, match=re.escape(
            "kv_c_and_k_pe_cache dtype must be torch.float16 with kv_cache_dtype='float16', "
            "got kv_c_and_k_pe_cache.dtype=torch.bfloat16")):
        impl16.forward_mqa(q, kv, md, None)


def test_forward_refuses_a_cache_paged_unlike_the_schedule():
    _, fake, impl, q, kv, md = _forward_case()
    assert md.decode.page_size == 64
    with pytest.raises(ValueError, match=re.escape("page_size=64, got kv_c_and_k_pe_cache.shape=(20, 16, 576)")):
        impl.forward_mqa(q, kv.reshape(-1, 16, 576), md, None)
    with pytest.raises(ValueError, match=re.escape("got kv_c_and_k_pe_cache.shape=(5, 64, 512)")):
        impl.forward_mqa(q, kv[..., :512], md, None)
    with pytest.raises(ValueError, match=r"kv_c_and_k_pe_cache must be a torch.Tensor, got kv_c_and_k_pe_cache=ndarray"):
        impl.forward_mqa(q, kv.float().numpy(), md, None)
    with pytest.raises(ValueError, match=r"fewer tokens than attn_metadata.num_decode_tokens=1"):
        impl.forward_mqa(q[:0], kv, md, None)
    assert not fake.varlen_calls  # nothing reached FA3


@pytest.mark.parametrize("name", ["spec_decode_page_16", "decode_mixed_lengths"])
@pytest.mark.parametrize("packed", [True, False])
def test_forward_valid_path_still_matches_the_reference(name, packed):
    batch, fake, impl, q, kv, md = _forward_case(name, "float16")
    qq = q if packed else (q[..., :512], q[..., 512:])
    out, lse = impl.forward_mqa(qq, kv, md, None)
    assert len(fake.varlen_calls) == 1
    _assert_matches(out, lse, *np_reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config),
                    "float16", name)


def test_forward_takes_a_padded_graph_q_buffer():
    """FA3DecodeGraph passes its persistent q (max_num_tokens rows) with a smaller batch."""
    _, _, impl, q, kv, md = _forward_case()
    out, _ = impl.forward_mqa(torch.cat([q, q, q]), kv, md, None)
    assert out.shape == (3, 16, 512)


# ----------------------------------------------------------------------------------------
# 4. The full-CUDA-graph split bound
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", [33, 64, 10**6])
def test_full_cuda_graph_refuses_more_splits_than_the_bound(requested):
    cfg = MLAConfig(num_heads=16, page_size=16, max_num_splits_for_cuda_graph=32)
    fake = FakeFA3(cfg)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=True, fa3_provider=fake.provider)
    md, nb = _md(cfg, [9, 65], [1, 1])
    with pytest.raises(ValueError, match=re.escape(
            f"max_num_splits={requested} exceeds max_num_splits_for_cuda_graph=32")):
        b.build(md.replace(max_num_splits=requested), num_blocks=nb)
    assert not fake.sched_calls  # FA3 was never asked
    for ok in (0, 1, 32):  # 0: the seed's rule (the bound); up to the bound: as requested
        out = b.build(md.replace(max_num_splits=ok), num_blocks=nb)
        assert out.decode.max_num_splits == (ok or 32) == fake.sched_calls[-1]["num_splits"]
    eager = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", fa3_provider=fake.provider)
    assert eager.build(md.replace(max_num_splits=requested), num_blocks=nb).decode.max_num_splits == requested


def test_full_cuda_graph_batch_invariant_stays_at_one_split():
    cfg = MLAConfig(num_heads=16, page_size=16, max_num_splits_for_cuda_graph=32, batch_invariant=True)
    fake = FakeFA3(cfg)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=True, fa3_provider=fake.provider)
    md, nb = _md(cfg, [9, 65], [1, 1])
    assert b.build(md.replace(max_num_splits=64), num_blocks=nb).decode.max_num_splits == 1


# ----------------------------------------------------------------------------------------
# 5. mla_torch.mla_decode's entry
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def batch32():
    return make_batch(SCENARIOS["spec_decode_page_16"], "float32")


@pytest.mark.parametrize("impl", ["reference", "fa3", "auto"])
def test_mla_decode_refuses_bad_metadata_and_config_types(batch32, impl):
    q, kv = torch.from_numpy(batch32.q), torch.from_numpy(batch32.kv_cache)
    with pytest.raises(ValueError, match=r"metadata must be an mla_spec.DecodeMetadata, got metadata=NoneType"):
        mla_torch.mla_decode(q, kv, None, batch32.config, impl=impl)
    for bad, shown in ((None, "NoneType"), ({"num_heads": 16}, "dict")):
        with pytest.raises(ValueError, match=rf"config must be an mla_spec.MLAConfig, got config={shown}"):
            mla_torch.mla_decode(q, kv, batch32.metadata, bad, impl=impl)


def test_fa3_mla_decode_refuses_bad_types(batch32):
    q, kv = torch.from_numpy(batch32.q), torch.from_numpy(batch32.kv_cache)
    with pytest.raises(ValueError, match=r"config must be an mla_spec.MLAConfig, got config=NoneType"):
        fa3.mla_decode(q, kv, batch32.metadata, None)
    with pytest.raises(ValueError, match=r"metadata must be an mla_spec.DecodeMetadata, got metadata=dict"):
        fa3.mla_decode(q, kv, {}, batch32.config)
    with pytest.raises(ValueError, match=r"kv_cache must be a torch.Tensor, got kv_cache=ndarray"):
        fa3.mla_decode(q, batch32.kv_cache, batch32.metadata, batch32.config)


def test_mla_decode_refuses_meta_tensors(batch32):
    q, kv = torch.from_numpy(batch32.q), torch.from_numpy(batch32.kv_cache)
    with pytest.raises(ValueError, match=r"got a tensor on device='meta'"):
        mla_torch.mla_decode(q.to("meta"), kv.to("meta"), batch32.metadata, batch32.config)
    with pytest.raises(ValueError, match=r"got a tensor on device='meta'"):
        mla_torch.mla_decode(q, kv.to("meta"), batch32.metadata, batch32.config)


def test_mla_decode_valid_path_still_runs(batch32):
    q, kv = torch.from_numpy(batch32.q), torch.from_numpy(batch32.kv_cache)
    out, lse = mla_torch.mla_decode(q, kv, batch32.metadata, batch32.config, k_scale=np.float32(1.0))
    _assert_matches(out, lse, *np_reference.mla_decode(batch32.q, batch32.kv_cache, batch32.metadata, batch32.config),
                    "float32", "mla_decode")


# ----------------------------------------------------------------------------------------
# 6. mla_torch.dcp_mla_decode_local
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dcp_case():
    sc = Scenario("dcp", seq_lens=(1, 17, 97, 200), query_lens=(1, 1, 1, 1), num_heads=16, page_size=16)
    batch = make_batch(sc, "float32", dcp_world_size=2)
    shards = sdcp.shard_batch(batch.kv_cache, batch.metadata, batch.config, permute_blocks=True)
    ref = np_reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config.replace(dcp_world_size=1))
    return batch, shards, ref


@pytest.mark.parametrize("k_scale", [1.0, 1, np.float32(1.0), np.float64(1.0), torch.tensor(1.0)])
def test_dcp_takes_scalars_equal_to_one_with_an_auto_cache(dcp_case, k_scale):
    batch, shards, ref = dcp_case
    q, kv = torch.from_numpy(batch.q), torch.from_numpy(shards.kv_cache)
    out, lse = tdcp.dcp_mla_decode_local(q, kv, shards.metadata, batch.config, k_scale=k_scale)
    _assert_matches(out, lse, *ref, "float32", f"dcp k_scale={k_scale!r}")


@pytest.mark.parametrize("k_scale", [np.float32(2.0), torch.tensor(2.0), 0.5])
def test_dcp_refuses_other_scales_with_an_auto_cache(dcp_case, k_scale):
    batch, shards, _ = dcp_case
    q, kv = torch.from_numpy(batch.q), torch.from_numpy(shards.kv_cache)
    with pytest.raises(ValueError, match=re.escape(f"it must be 1.0, got k_scale={float(k_scale)!r}")):
        tdcp.dcp_mla_decode_local(q, kv, shards.metadata, batch.config, k_scale=k_scale)


def test_dcp_checks_max_seq_len(dcp_case):
    batch, shards, _ = dcp_case
    q, kv = torch.from_numpy(batch.q), torch.from_numpy(shards.kv_cache)
    md = shards.metadata
    with pytest.raises(ValueError, match=r"max_seq_len must be >= 1, got max_seq_len=0"):
        tdcp.dcp_mla_decode_local(q, kv, md.replace(max_seq_len=0), batch.config)
    with pytest.raises(ValueError, match=r"max_seq_len must be an int, got max_seq_len=100.0"):
        tdcp.dcp_mla_decode_local(q, kv, md.replace(max_seq_len=100.0), batch.config)
    longest = int(np.asarray(md.seq_lens).max())
    assert md.max_seq_len == longest == 100
    with pytest.raises(ValueError, match=re.escape(f"metadata_shards.max_seq_len=1 < {longest}")):
        tdcp.dcp_mla_decode_local(q, kv, md.replace(max_seq_len=1), batch.config)
    tdcp.dcp_mla_decode_local(q, kv, md.replace(max_seq_len=4096), batch.config)  # an upper bound is fine


def test_dcp_refuses_bad_types_and_shapes(dcp_case):
    batch, shards, _ = dcp_case
    q, kv = torch.from_numpy(batch.q), torch.from_numpy(shards.kv_cache)
    with pytest.raises(ValueError, match=r"metadata must be an mla_spec.DecodeMetadata, got metadata=NoneType"):
        tdcp.dcp_mla_decode_local(q, kv, None, batch.config)
    with pytest.raises(ValueError, match=r"config must be an mla_spec.MLAConfig, got config=NoneType"):
        tdcp.dcp_mla_decode_local(q, kv, shards.metadata, None)
    with pytest.raises(ValueError, match=r"q must have num_heads=16 heads, got q.shape\[1\]=8"):
        tdcp.dcp_mla_decode_local(q[:, :8], kv, shards.metadata, batch.config)
    with pytest.raises(ValueError, match=r"got kv_cache.dtype=float64"):
        tdcp.dcp_mla_decode_local(q, kv.double(), shards.metadata, batch.config)
    assert math.isfinite(float(tdcp.dcp_mla_decode_local(q, kv, shards.metadata, batch.config)[1].max()))
