"""mla_torch.fa3: the port of vLLM's FlashAttnMLA backend on FA3.

CPU part (always runs): the seed's classes, names and error messages; the builder's
reorder threshold, 992 capture-size check, persistent scheduler-metadata buffer and
max_num_splits rule; metadata conversion; the provider lookup and its reasons; and the
whole builder -> Impl plumbing against a CPU stand-in for FA3 (`FakeFA3`, keyword-only,
computing with the torch reference), so a wrong or missing FA3 argument fails here.

GPU part (`gpu` marker; skipped with the reason where CUDA or FA3 is missing): FA3 vs
the torch reference on every parity scenario in bf16 and fp16, bounded split counts,
CUDA-graph capture and replay with other batches, and FA3 vs FlashMLA at page size 64.
"""

from __future__ import annotations

import inspect
import re
import sys
import types

import numpy as np
import pytest
import torch

import mla_torch
from mla_spec import Bucket, MLAConfig, build_decode_metadata, capture_size_buckets, pad_to_bucket
from mla_spec import reference as np_reference
from mla_spec.config import FP8_KV_CACHE_MSG, NON_DECODER_MSG, UNSUPPORTED_FEATURES_MSG
from mla_torch import fa3
from mla_torch.fa3 import impl as fa3_impl
from mla_torch.fa3 import providers as fa3_providers
from mla_torch import reference as torch_reference
from parity.compare import compare, compare_out_lse
from parity.scenarios import SCENARIOS, Scenario, make_batch

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FA3_REASON = fa3.fa3_unavailable_reason()
needs_no_fa3 = pytest.mark.skipif(FA3_REASON is None, reason="FA3 is available here; this checks the unavailable path")


# ----------------------------------------------------------------------------------------
# A CPU stand-in for FA3 with the seed's keyword interface
# ----------------------------------------------------------------------------------------


class FakeFA3:
    """Records every call; computes with mla_torch.reference; returns lse [H, T] as FA3."""

    def __init__(self, config: MLAConfig, *, schedule_size=None):
        self.config = config
        self.schedule_size = schedule_size  # force a schedule length (buffer-overflow test)
        self.sched_calls: list[dict] = []
        self.varlen_calls: list[dict] = []

    @property
    def provider(self) -> fa3.FA3Provider:
        return fa3.FA3Provider("fake", self.flash_attn_varlen_func, self.get_scheduler_metadata)

    def get_scheduler_metadata(self, *, batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                               cache_seqlens, qkv_dtype, headdim_v, page_size, cu_seqlens_q, causal, num_splits):
        self.sched_calls.append(dict(locals()))
        # FA3's layout: semaphore + round_up(B, 4) * V, V = prepare + dynamic split + head swizzle
        vectors = 1 + int(num_splits > 1) + int(causal and max_seqlen_q > 1)
        n = self.schedule_size or 1 + fa3.round_up(batch_size, 4) * vectors
        return torch.arange(1, n + 1, dtype=torch.int32, device=cache_seqlens.device)  # nonzero everywhere

    def flash_attn_varlen_func(self, *, q, k, v, q_v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, seqused_k,
                               block_table, softmax_scale, causal, return_softmax_lse, fa_version,
                               scheduler_metadata, num_splits):
        self.varlen_calls.append(dict(locals()))
        L, R = self.config.kv_lora_rank, self.config.qk_rope_head_dim
        assert fa_version == 3 and causal is True
        assert k.dim() == 4 and k.shape[2] == 1 and k.shape[3] == R, k.shape
        assert v.dim() == 4 and v.shape[2] == 1 and v.shape[3] == L, v.shape
        assert q.shape[-1] == R and q_v.shape[-1] == L and max_seqlen_q >= 1
        for name, t in (("cu_seqlens_q", cu_seqlens_q), ("seqused_k", seqused_k), ("block_table", block_table)):
            assert t.dtype == torch.int32, (name, t.dtype)
        kv = torch.cat([v[:, :, 0], k[:, :, 0]], dim=-1)
        cfg = self.config.replace(softmax_scale=softmax_scale)
        out, lse = torch_reference.mla_decode(q_v, q, kv, cu_seqlens_q, seqused_k, block_table, cfg)
        end = int(cu_seqlens_q[-1])  # FA3 writes no row past the batch's tokens: NaN stands for what they hold
        out[end:], lse[end:] = float("nan"), float("nan")
        lse = lse.T.contiguous()  # FA3: [H, T]
        return (out, lse) if return_softmax_lse else out


def _impl_args(**changes):
    args = dict(
        num_heads=16, head_size=576, scale=0.1352, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
        kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
    )
    args.update(changes)
    return args


def _torch_batch(batch, device="cpu", dtype=None):
    tdt = TORCH_DTYPES[dtype or batch.config.dtype]
    q = torch.from_numpy(batch.q).to(device=device, dtype=tdt)
    kv = torch.from_numpy(batch.kv_cache).to(device=device, dtype=tdt)
    return q, kv


def _np(x):
    return x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _assert_matches(out, lse, ref_out, ref_lse, dtype, what):
    c_out, c_lse = compare_out_lse(_np(out), _np(lse), _np(ref_out), _np(ref_lse), dtype)
    assert c_out.ok, f"{what}: {c_out.message}"
    assert c_lse.ok, f"{what}: {c_lse.message}"


# ----------------------------------------------------------------------------------------
# CPU: backend, classes, the seed's messages
# ----------------------------------------------------------------------------------------


def test_backend_names_and_classes():
    B = fa3.FlashAttnMLABackend
    assert B.get_name() == "FLASH_ATTN_MLA"
    assert B.get_metadata_cls() is fa3.FlashAttnMLAMetadata
    assert B.get_builder_cls() is fa3.FlashAttnMLAMetadataBuilder
    assert B.get_impl_cls() is fa3.FlashAttnMLAImpl
    assert B.supported_dtypes == [torch.float16, torch.bfloat16]
    assert B.supported_kv_cache_dtypes == ["auto", "float16", "bfloat16"]
    assert B.get_supported_kernel_block_sizes() == [fa3.MultipleOf(16)]
    assert fa3.FlashAttnMLAImpl.can_return_lse_for_decode is True
    assert fa3.FlashAttnMLAImpl.forward_mqa is fa3.FlashAttnMLAImpl._forward_decode


@pytest.mark.parametrize("cap, ok", [((9, 0), True), ((9, 2), True), (90, True), ((8, 0), False), ((8, 9), False),
                                     ((10, 0), False), (types.SimpleNamespace(major=9, minor=0), True)])
def test_supports_compute_capability(cap, ok):
    assert fa3.FlashAttnMLABackend.supports_compute_capability(cap) is ok


def test_decode_metadata_dataclass_defaults():
    t = torch.zeros(1, dtype=torch.int32)
    d = fa3.FlashAttnMLADecodeMetadata(block_table=t, seq_lens=t, query_start_loc=t, max_query_len=1, max_seq_len=1)
    assert d.scheduler_metadata is None and d.max_num_splits == 0
    m = fa3.FlashAttnMLAMetadata(num_reqs=1, num_actual_tokens=1, num_decodes=1, num_decode_tokens=1)
    assert m.decode is None


@pytest.mark.parametrize("change", [dict(alibi_slopes=[0.5] * 16), dict(sliding_window=128),
                                    dict(logits_soft_cap=30.0)])
def test_impl_rejects_unsupported_features_with_seed_message(change):
    with pytest.raises(NotImplementedError) as e:
        fa3.FlashAttnMLAImpl(**_impl_args(**change))
    assert str(e.value) == UNSUPPORTED_FEATURES_MSG
    assert str(e.value) == ("FlashAttnMLAImpl does not support one of the following: "
                            "alibi_slopes, sliding_window, logits_soft_cap")


@pytest.mark.parametrize("attn_type", ["encoder", "encoder_only", "encoder_decoder"])
def test_impl_rejects_non_decoder_with_seed_message(attn_type):
    with pytest.raises(NotImplementedError) as e:
        fa3.FlashAttnMLAImpl(**_impl_args(attn_type=attn_type))
    assert str(e.value) == NON_DECODER_MSG
    assert str(e.value) == ("Encoder self-attention and encoder/decoder cross-attention "
                            "are not implemented for FlashAttnMLAImpl")


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_impl_rejects_fp8_kv_cache_with_seed_message(kv_cache_dtype):
    with pytest.raises(NotImplementedError) as e:
        fa3.FlashAttnMLAImpl(**_impl_args(kv_cache_dtype=kv_cache_dtype))
    assert str(e.value) == FP8_KV_CACHE_MSG == "FlashAttnMLA V1 with FP8 KV cache not yet supported"


def test_impl_argument_errors_name_the_value():
    args = _impl_args()
    del args["kv_lora_rank"]
    with pytest.raises(ValueError, match=r"kv_lora_rank"):
        fa3.FlashAttnMLAImpl(**args)
    with pytest.raises(ValueError, match=r"unknown MLA arguments \['kv_lora_rnak'\]"):
        fa3.FlashAttnMLAImpl(**_impl_args(kv_lora_rnak=512))
    with pytest.raises(ValueError, match=r"head_size=512"):
        fa3.FlashAttnMLAImpl(**_impl_args(head_size=512))
    with pytest.raises(ValueError, match=r"num_kv_heads=2"):
        fa3.FlashAttnMLAImpl(**_impl_args(num_kv_heads=2))


@needs_no_fa3
@pytest.mark.parametrize("device", [None, "cpu"])
def test_impl_without_fa3_says_why(device):
    with pytest.raises(fa3.FA3UnavailableError) as e:
        fa3.FlashAttnMLAImpl(**_impl_args(device=device))
    msg = str(e.value)
    assert msg.startswith("FlashAttnMLA is not supported on this device: ")
    assert msg.endswith(fa3.fa3_unavailable_reason(device))
    if device == "cpu":
        assert "device='cpu' is not a CUDA device" in msg
    assert isinstance(e.value, RuntimeError)


def test_impl_state_from_config():
    cfg = MLAConfig(num_heads=8, softmax_scale=0.25)
    fake = FakeFA3(cfg)
    impl = fa3.FlashAttnMLAImpl.from_config(cfg, "cpu", fa3_provider=fake.provider)
    assert (impl.num_heads, impl.head_size, impl.scale, impl.num_kv_heads) == (8, 576, 0.25, 1)
    assert (impl.kv_lora_rank, impl.qk_rope_head_dim) == (512, 64)
    assert impl.need_to_return_lse_for_decode is True and impl.dcp_world_size == 1


# ----------------------------------------------------------------------------------------
# CPU: builder
# ----------------------------------------------------------------------------------------


def test_builder_reorder_batch_threshold():
    assert fa3.FlashAttnMLAMetadataBuilder.reorder_batch_threshold == 512
    b = fa3.FlashAttnMLAMetadataBuilder(MLAConfig(num_heads=16), "cpu")
    assert b.reorder_batch_threshold == 512
    b = fa3.FlashAttnMLAMetadataBuilder(MLAConfig(num_heads=16, dcp_world_size=2), "cpu")
    assert b.reorder_batch_threshold == 1
    # the threshold is per builder: the class default stays 512
    assert fa3.FlashAttnMLAMetadataBuilder.reorder_batch_threshold == 512


def test_builder_capture_size_larger_than_992_is_rejected_in_full_cuda_graph_mode():
    cfg = MLAConfig(num_heads=16, max_capture_size=993)
    msg = "Capture size larger than 992 is not supported for full cuda graph."
    assert fa3.CAPTURE_SIZE_MSG == msg
    with pytest.raises(ValueError, match=re.escape(msg)) as e:
        fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=True)
    assert "max_capture_size=993" in str(e.value)
    fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu")  # fine without full cuda graphs
    fa3.FlashAttnMLAMetadataBuilder(cfg.replace(max_capture_size=992), "cpu", use_full_cuda_graph=True)


@pytest.mark.parametrize("max_num_seqs, max_capture_size, size", [(256, 512, 1 + 512 * 4), (1024, 8, 1 + 1024 * 4),
                                                                   (5, 3, 1 + 8 * 4), (1, 1, 1 + 4 * 4)])
def test_full_cuda_graph_scheduler_buffer(max_num_seqs, max_capture_size, size):
    cfg = MLAConfig(num_heads=16, max_num_seqs=max_num_seqs, max_capture_size=max_capture_size,
                    max_num_splits_for_cuda_graph=24)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=True)
    assert fa3.scheduler_metadata_buffer_size(max(max_num_seqs, max_capture_size)) == size
    assert b.scheduler_metadata.shape == (size,) and b.scheduler_metadata.dtype == torch.int32
    assert int(b.scheduler_metadata.abs().sum()) == 0
    assert b.max_num_splits == 24
    eager = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu")
    assert eager.scheduler_metadata is None and eager.max_num_splits == 0


def _md(cfg, seq_lens, query_lens, **kw):
    P = cfg.page_size
    bt, nxt = [], 1
    for s in seq_lens:
        n = -(-s // P)
        bt.append(list(range(nxt, nxt + n)))
        nxt += n
    return build_decode_metadata(seq_lens=seq_lens, query_lens=query_lens, block_table=bt, config=cfg, **kw), nxt


@pytest.mark.parametrize("graph, num_tokens, expected", [(True, 4, 32), (True, 5, 0), (False, 4, 0), (False, 5, 0)])
def test_max_num_splits_rule(graph, num_tokens, expected):
    """The seed: num_splits is bounded only in full-cuda-graph mode and only for batches up
    to the capture size; otherwise 0 (FA3's heuristic)."""
    cfg = MLAConfig(num_heads=16, page_size=16, max_num_seqs=8, max_capture_size=4)
    fake = FakeFA3(cfg)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=graph, fa3_provider=fake.provider)
    md, _ = _md(cfg, [30] * num_tokens, [1] * num_tokens)
    out = b.build(md)
    assert out.decode.max_num_splits == expected
    assert fake.sched_calls[-1]["num_splits"] == expected
    # metadata.max_num_splits > 0 asks for that count (as the seed's batch-invariant mode forces 1)
    out = b.build(md.replace(max_num_splits=1))
    assert out.decode.max_num_splits == 1 and fake.sched_calls[-1]["num_splits"] == 1


def test_schedule_call_matches_the_seed():
    cfg = MLAConfig(num_heads=16, page_size=16, dtype="float16")
    fake = FakeFA3(cfg)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", fa3_provider=fake.provider)
    md, _ = _md(cfg, [17, 33, 200], [1, 3, 2])
    out = b.build(md.replace(max_seq_len=256))  # an upper bound is passed through as given
    call = fake.sched_calls[-1]
    assert call["batch_size"] == 3 and call["max_seqlen_q"] == 3 and call["max_seqlen_k"] == 256
    assert (call["num_heads_q"], call["num_heads_kv"], call["headdim"], call["headdim_v"]) == (16, 1, 64, 512)
    assert call["qkv_dtype"] is torch.float16 and call["page_size"] == 16 and call["causal"] is True
    assert call["cache_seqlens"] is out.decode.seq_lens and call["cu_seqlens_q"] is out.decode.query_start_loc
    assert out.decode.max_seq_len == 256 and out.decode.max_query_len == 3


def test_schedule_heads_include_dcp_world_size():
    cfg = MLAConfig(num_heads=16, page_size=16, dcp_world_size=4)
    fake = FakeFA3(cfg)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", fa3_provider=fake.provider)
    md, _ = _md(cfg, [17, 33], [1, 1])
    b.build(md)
    assert fake.sched_calls[-1]["num_heads_q"] == 64


def test_full_cuda_graph_schedule_is_copied_into_the_persistent_buffer_and_tail_zeroed():
    cfg = MLAConfig(num_heads=16, page_size=16, max_num_seqs=16, max_capture_size=16)
    fake = FakeFA3(cfg)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=True, fa3_provider=fake.provider)
    b.scheduler_metadata.fill_(-7)  # stale values from an earlier, larger batch
    md, _ = _md(cfg, [17, 33, 200], [1, 2, 2])
    out = b.build(md)
    n = 1 + 4 * 3  # 3 requests -> round_up 4; prepare + dynamic split + head swizzle
    sm = out.decode.scheduler_metadata
    assert sm.shape == (n,) and sm.data_ptr() == b.scheduler_metadata.data_ptr()
    assert torch.equal(b.scheduler_metadata[:n], torch.arange(1, n + 1, dtype=torch.int32))
    assert int(b.scheduler_metadata[n:].abs().sum()) == 0
    # a smaller batch next: same buffer, shorter slice, longer zero tail
    md2, _ = _md(cfg, [5], [1])
    out2 = b.build(md2)
    n2 = 1 + 4 * 2
    assert out2.decode.scheduler_metadata.shape == (n2,)
    assert out2.decode.scheduler_metadata.data_ptr() == b.scheduler_metadata.data_ptr()
    assert int(b.scheduler_metadata[n2:].abs().sum()) == 0


def test_schedule_larger_than_the_buffer_raises_naming_both_sizes():
    cfg = MLAConfig(num_heads=16, page_size=16, max_num_seqs=4, max_capture_size=4)
    fake = FakeFA3(cfg, schedule_size=100)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=True, fa3_provider=fake.provider)
    md, _ = _md(cfg, [17], [1])
    with pytest.raises(ValueError, match=r"Scheduler metadata size 100 exceeds buffer size 17"):
        b.build(md)


def test_build_converts_metadata_to_int32_tensors():
    cfg = MLAConfig(num_heads=16, page_size=16)
    fake = FakeFA3(cfg)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", fa3_provider=fake.provider)
    md, nb = _md(cfg, [17, 33, 200], [1, 3, 2])
    for given in (md, mla_torch.to_torch_metadata(md, "cpu"),
                  md.replace(block_table=md.block_table.astype(np.int64), seq_lens=md.seq_lens.astype(np.int64))):
        out = b.build(given, num_blocks=nb)
        assert isinstance(out, fa3.FlashAttnMLAMetadata)
        assert (out.num_reqs, out.num_decodes, out.num_decode_tokens, out.num_actual_tokens) == (3, 3, 6, 6)
        d = out.decode
        for name in ("query_start_loc", "seq_lens", "block_table"):
            t = getattr(d, name)
            assert isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.device.type == "cpu"
            np.testing.assert_array_equal(t.numpy(), np.asarray(getattr(md, name)))
        assert d.max_query_len == 3 and d.max_seq_len == 200 and d.max_num_splits == 0
        assert isinstance(d.max_query_len, int) and isinstance(d.max_seq_len, int)


def test_build_validates_metadata():
    cfg = MLAConfig(num_heads=16, page_size=16)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", fa3_provider=FakeFA3(cfg).provider)
    md, nb = _md(cfg, [17, 33], [1, 1])
    with pytest.raises(ValueError, match=r"block id out of range"):
        b.build(md, num_blocks=2)
    bad = md.replace(seq_lens=np.array([17, 0], np.int32))
    with pytest.raises(ValueError, match=r"seq_lens\[1\]=0"):
        b.build(bad)
    with pytest.raises(ValueError, match=r"mla_spec.DecodeMetadata"):
        b.build({"seq_lens": md.seq_lens})
    with pytest.raises(ValueError, match=r"MLAConfig"):
        fa3.FlashAttnMLAMetadataBuilder({"num_heads": 16}, "cpu")


@needs_no_fa3
def test_builder_looks_up_fa3_lazily():
    cfg = MLAConfig(num_heads=16, page_size=16)
    b = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu")  # no FA3 needed to construct
    assert b.reorder_batch_threshold == 512
    md, _ = _md(cfg, [17], [1])
    with pytest.raises(fa3.FA3UnavailableError, match=r"not a CUDA device"):
        b.build(md)


# ----------------------------------------------------------------------------------------
# CPU: the Impl's FA3 call, through a stand-in
# ----------------------------------------------------------------------------------------


def _run_fake(batch, *, packed=True, use_full_cuda_graph=False, **impl_args):
    cfg = batch.config
    fake = FakeFA3(cfg)
    builder = fa3.FlashAttnMLAMetadataBuilder(cfg, "cpu", use_full_cuda_graph=use_full_cuda_graph,
                                              fa3_provider=fake.provider)
    impl = fa3.FlashAttnMLAImpl.from_config(cfg, "cpu", fa3_provider=fake.provider, **impl_args)
    q, kv = _torch_batch(batch)
    attn_metadata = builder.build(batch.metadata, num_blocks=kv.shape[0])
    qq = q if packed else (q[..., : cfg.kv_lora_rank], q[..., cfg.kv_lora_rank :])
    out, lse = impl._forward_decode(qq, kv, attn_metadata)
    return fake, q, kv, attn_metadata, out, lse


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_forward_decode_passes_the_seed_arguments_and_matches_the_reference(name):
    batch = make_batch(SCENARIOS[name], "bfloat16")
    fake, q, kv, md, out, lse = _run_fake(batch)
    (call,) = fake.varlen_calls
    L = batch.config.kv_lora_rank
    T, H = q.shape[:2]
    # q_pe / q_nope are views of q; k / v are views of the cache with a head dim of 1
    assert call["q"].data_ptr() == q.data_ptr() + L * q.element_size() and call["q"].shape == (T, H, 64)
    assert call["q_v"].data_ptr() == q.data_ptr() and call["q_v"].shape == (T, H, L)
    assert call["k"].data_ptr() == kv.data_ptr() + L * kv.element_size()
    assert call["k"].shape == (kv.shape[0], kv.shape[1], 1, 64) and call["v"].shape == (kv.shape[0], kv.shape[1], 1, L)
    assert call["v"].data_ptr() == kv.data_ptr()
    assert call["cu_seqlens_q"] is md.decode.query_start_loc and call["seqused_k"] is md.decode.seq_lens
    assert call["block_table"] is md.decode.block_table
    assert call["scheduler_metadata"] is md.decode.scheduler_metadata
    assert call["num_splits"] == md.decode.max_num_splits == 0
    assert call["max_seqlen_q"] == max(batch.scenario.query_lens)
    assert call["max_seqlen_k"] == max(batch.scenario.seq_lens)
    assert call["softmax_scale"] == batch.config.softmax_scale and call["return_softmax_lse"] is True
    assert out.shape == (T, H, L) and out.dtype == torch.bfloat16
    assert lse.shape == (T, H) and lse.dtype == torch.float32  # FA3's [H, T], transposed
    ref_out, ref_lse = np_reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    _assert_matches(out, lse, ref_out, ref_lse, "bfloat16", name)


def test_forward_decode_tuple_q_and_no_lse():
    batch = make_batch(SCENARIOS["spec_decode"], "bfloat16")
    _, _, _, _, out1, lse1 = _run_fake(batch)
    fake, q, _, _, out2, lse2 = _run_fake(batch, packed=False)
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)
    assert fake.varlen_calls[0]["q"].data_ptr() == q.data_ptr() + 512 * q.element_size()
    fake, _, _, _, out3, lse3 = _run_fake(batch, need_to_return_lse_for_decode=False)
    assert lse3 is None and torch.equal(out3, out1)
    assert fake.varlen_calls[0]["return_softmax_lse"] is False


def test_forward_decode_with_a_custom_softmax_scale():
    batch = make_batch(SCENARIOS["decode_mixed_lengths"], "bfloat16", softmax_scale=0.05)
    fake, _, _, _, out, lse = _run_fake(batch)
    assert fake.varlen_calls[0]["softmax_scale"] == 0.05
    _assert_matches(out, lse, *np_reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config),
                    "bfloat16", "softmax_scale=0.05")


def test_forward_decode_in_full_cuda_graph_mode_bounds_splits():
    batch = make_batch(SCENARIOS["spec_decode"], "bfloat16", max_num_splits_for_cuda_graph=16)
    fake, _, _, md, out, lse = _run_fake(batch, use_full_cuda_graph=True)
    assert fake.varlen_calls[0]["num_splits"] == 16
    assert fake.varlen_calls[0]["scheduler_metadata"].data_ptr() == md.decode.scheduler_metadata.data_ptr()
    _assert_matches(out, lse, *np_reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config),
                    "bfloat16", "full cuda graph mode")


def test_forward_decode_clamps_max_seqlen_q_and_raises_value_errors():
    batch = make_batch(SCENARIOS["single_token"], "bfloat16")
    fake, q, kv, md, _, _ = _run_fake(batch)
    impl = fa3.FlashAttnMLAImpl.from_config(batch.config, "cpu", fa3_provider=fake.provider)
    md.decode.max_query_len = 0  # as during vLLM's graph capture
    impl._forward_decode(q, kv, md)
    assert fake.varlen_calls[-1]["max_seqlen_q"] == 1
    with pytest.raises(ValueError, match=r"kv_c_and_k_pe_cache is empty"):
        impl._forward_decode(q, kv[:0], md)
    with pytest.raises(ValueError, match=r"attn_metadata.decode is None"):
        impl._forward_decode(q, kv, fa3.FlashAttnMLAMetadata(1, 1, 1, 1, decode=None))
    assert impl.forward_mqa(q, kv, md, None)[0].shape == (1, 16, 512)


# ----------------------------------------------------------------------------------------
# CPU: FA3DecodeGraph's host side (padding, pinned schedule), through the stand-in
# ----------------------------------------------------------------------------------------


def test_decode_graph_pads_the_batch_and_pins_the_schedule():
    cfg = MLAConfig(num_heads=16, page_size=16, max_num_seqs=8, max_capture_size=32)
    a = make_batch(Scenario("a", seq_lens=(40, 97, 300, 130), query_lens=(2, 4, 8, 3), page_size=16), "bfloat16",
                   max_num_seqs=8, max_capture_size=32)
    b = make_batch(Scenario("b", seq_lens=(310, 5), query_lens=(3, 5), page_size=16), "bfloat16",
                   max_num_seqs=8, max_capture_size=32)
    nb = max(a.kv_cache.shape[0], b.kv_cache.shape[0])
    kv = torch.full((nb, 16, 576), float("nan"), dtype=torch.bfloat16)
    fake = FakeFA3(cfg)
    g = fa3.FA3DecodeGraph(cfg, kv, max_num_reqs=6, max_num_tokens=20, max_blocks_per_req=24, max_query_len=8,
                           fa3_provider=fake.provider)
    for batch in (a, b, a):
        q, kvb = _torch_batch(batch)
        kv.fill_(float("nan"))
        kv[: kvb.shape[0]] = kvb
        out, lse = g.run_eager((q[..., :512], q[..., 512:]) if batch is b else q, batch.metadata)
        R, T = len(batch.scenario.seq_lens), batch.scenario.num_tokens
        call = fake.sched_calls[-1]
        assert call["batch_size"] == 6 and call["max_seqlen_q"] == 8 and call["max_seqlen_k"] == 24 * 16
        assert call["num_splits"] == cfg.max_num_splits_for_cuda_graph
        assert fake.varlen_calls[-1]["q_v"].shape[0] == 20  # the persistent q buffer
        assert g.query_start_loc[R:].tolist() == [T] * (6 + 1 - R)
        assert g.seq_lens[R:].tolist() == [0] * (6 - R)
        assert out.shape == (T, 16, 512) and lse.shape == (T, 16)
        _assert_matches(out, lse, *np_reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config),
                        "bfloat16", batch.scenario.name)
    too_long = make_batch(Scenario("c", seq_lens=(400,), query_lens=(9,), page_size=16), "bfloat16",
                          max_num_seqs=8, max_capture_size=32)
    with pytest.raises(ValueError, match=r"q must be \[17, 16, 576\] torch.bfloat16, got q.shape=\(13, 16, 576\)"):
        g.run_eager(_torch_batch(a)[0][:13], a.metadata)
    with pytest.raises(ValueError, match=r"max query len=9 > 8"):
        g.run_eager(_torch_batch(too_long)[0], too_long.metadata)
    with pytest.raises(ValueError, match=r"max_num_tokens=64 exceeds max_capture_size=32"):
        fa3.FA3DecodeGraph(cfg, kv, max_num_reqs=6, max_num_tokens=64, max_blocks_per_req=24,
                           fa3_provider=fake.provider)
    with pytest.raises(ValueError, match=r"max_num_reqs=33"):
        fa3.FA3DecodeGraph(cfg, kv, max_num_reqs=33, max_num_tokens=20, max_blocks_per_req=24,
                           fa3_provider=fake.provider)
    with pytest.raises(RuntimeError, match=r"before capture"):
        g.replay(*_torch_batch(a)[:1], a.metadata)


# ----------------------------------------------------------------------------------------
# CPU: provider lookup, unsupported_reason, mla_decode without FA3
# ----------------------------------------------------------------------------------------


def test_unsupported_reason_says_why():
    base = MLAConfig(num_heads=16)
    assert "dtype='float32'" in fa3.unsupported_reason(base.replace(dtype="float32"))
    r = fa3.unsupported_reason(base.replace(kv_cache_dtype="fp8_e4m3"))
    assert r.startswith(FP8_KV_CACHE_MSG) and "kv_cache_dtype='fp8_e4m3'" in r
    assert "kv_lora_rank=256" in fa3.unsupported_reason(base.replace(kv_lora_rank=256))
    assert "dcp_world_size=2" in fa3.unsupported_reason(MLAConfig(num_heads=16, dcp_world_size=2))
    assert "not a CUDA device" in fa3.unsupported_reason(base, "cpu")
    assert fa3.unsupported_reason(base) == FA3_REASON  # a valid config: only the machine matters
    # any page size is left to the kernel (FA3's paged path takes any P >= 1)
    assert fa3.unsupported_reason(base.replace(page_size=1)) == FA3_REASON
    assert mla_torch.unsupported_reason("fa3", base, "cpu") == fa3.unsupported_reason(base, "cpu")


@needs_no_fa3
def test_find_fa3_lists_why_each_provider_was_passed_over():
    with pytest.raises(fa3.FA3UnavailableError) as e:
        fa3.find_fa3()
    msg = str(e.value)
    for name in ("flash_attn_interface", "vllm.vllm_flash_attn"):
        assert name in msg
    assert FA3_REASON
    impl, why = mla_torch.select_impl(MLAConfig(num_heads=16))
    assert impl == "reference" and why == {"fa3": FA3_REASON}


@needs_no_fa3
def test_mla_decode_fa3_on_this_machine_says_why():
    batch = make_batch(SCENARIOS["decode_mixed_lengths"], "bfloat16")
    q, kv = _torch_batch(batch)
    with pytest.raises(RuntimeError) as e:
        mla_torch.mla_decode(q, kv, batch.metadata, batch.config, impl="fa3")
    assert isinstance(e.value, fa3.FA3UnavailableError)
    assert fa3.fa3_unavailable_reason("cpu") in str(e.value)
    out, lse, used = mla_torch.mla_decode(q, kv, batch.metadata, batch.config, impl="auto", return_impl=True)
    assert used == "reference" and out.shape == (5, 16, 512)


def test_mla_decode_fa3_path_end_to_end_with_the_stand_in(monkeypatch):
    """api.mla_decode(impl="fa3") -> fa3.mla_decode -> cached builder + Impl -> the FA3 call."""
    batch = make_batch(SCENARIOS["spec_decode_page_16"], "float16")
    fake = FakeFA3(batch.config)
    monkeypatch.setattr(fa3_providers, "require_fa3", lambda device=None: fake.provider)
    fa3_impl._builder_and_impl.cache_clear()
    try:
        q, kv = _torch_batch(batch)
        for _ in range(2):
            out, lse = mla_torch.mla_decode(q, kv, batch.metadata, batch.config, impl="fa3")
        assert fa3_impl._builder_and_impl.cache_info().hits == 1  # built once per (config, device)
        assert len(fake.sched_calls) == 2 and len(fake.varlen_calls) == 2  # one schedule per batch
        assert out.dtype == torch.float16 and lse.shape == (q.shape[0], q.shape[1])
        _assert_matches(out, lse, *np_reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config),
                        "float16", "api -> fa3 (stand-in)")
        bad = batch.metadata.replace(block_table=batch.metadata.block_table + 1000)
        with pytest.raises(ValueError, match=r"block id out of range"):
            fa3.mla_decode(q, kv, bad, batch.config)
    finally:
        fa3_impl._builder_and_impl.cache_clear()


def test_mla_decode_fa3_rejects_an_unsupported_config_first():
    batch = make_batch(SCENARIOS["single_token"], "float32")
    q, kv = _torch_batch(batch)
    with pytest.raises(NotImplementedError, match=r"dtype='float32'"):
        fa3.mla_decode(q, kv, batch.metadata, batch.config)


def test_provider_is_unpackable():
    fake = FakeFA3(MLAConfig(num_heads=16))
    name, varlen, sched = fake.provider
    assert name == "fake" and varlen == fake.flash_attn_varlen_func and sched == fake.get_scheduler_metadata


def _fake_upstream_module(record):
    mod = types.ModuleType("fake_upstream_fa3")

    def _flash_attn_forward(q, k, v, k_new=None, v_new=None, qv=None, out_=None, cu_seqlens_q=None,
                            cu_seqlens_k=None, cu_seqlens_k_new=None, seqused_q=None, seqused_k=None,
                            max_seqlen_q=None, max_seqlen_k=None, page_table=None, kv_batch_idx=None,
                            leftpad_k=None, rotary_cos=None, rotary_sin=None, seqlens_rotary=None, q_descale=None,
                            k_descale=None, v_descale=None, softmax_scale=None, causal=False, window_size_left=-1,
                            window_size_right=-1, attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=1, pack_gqa=None, sm_margin=0):
        record.update(locals())
        return "out", "lse", "out_accum", "lse_accum"

    def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                               cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                               cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                               causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                               num_splits=0, pack_gqa=None, sm_margin=0):
        return None

    mod._flash_attn_forward = _flash_attn_forward
    mod.get_scheduler_metadata = get_scheduler_metadata
    return mod


def test_upstream_fa3_adapter_maps_the_seed_call(monkeypatch):
    record = {}
    monkeypatch.setitem(sys.modules, "fake_upstream_fa3", _fake_upstream_module(record))
    provider, why = fa3_providers._upstream_provider("fake_upstream_fa3")
    assert provider is not None, why
    sentinel = {k: object() for k in ("q", "k", "v", "q_v", "cu", "seqused", "bt", "sched")}
    res = provider.flash_attn_varlen_func(
        q=sentinel["q"], k=sentinel["k"], v=sentinel["v"], q_v=sentinel["q_v"], max_seqlen_q=3,
        cu_seqlens_q=sentinel["cu"], max_seqlen_k=1030, seqused_k=sentinel["seqused"], block_table=sentinel["bt"],
        softmax_scale=0.1, causal=True, return_softmax_lse=True, fa_version=3,
        scheduler_metadata=sentinel["sched"], num_splits=32,
    )
    assert res == ("out", "lse")
    assert record["q"] is sentinel["q"] and record["qv"] is sentinel["q_v"] and record["page_table"] is sentinel["bt"]
    assert record["cu_seqlens_q"] is sentinel["cu"] and record["seqused_k"] is sentinel["seqused"]
    assert record["scheduler_metadata"] is sentinel["sched"]
    assert (record["max_seqlen_q"], record["max_seqlen_k"], record["num_splits"]) == (3, 1030, 32)
    assert record["causal"] is True and record["softmax_scale"] == 0.1 and record["cu_seqlens_k"] is None
    # the adapter takes exactly the keywords the Impl passes
    impl_kwargs = {"q", "k", "v", "q_v", "max_seqlen_q", "cu_seqlens_q", "max_seqlen_k", "seqused_k",
                   "block_table", "softmax_scale", "causal", "return_softmax_lse", "fa_version",
                   "scheduler_metadata", "num_splits"}
    assert impl_kwargs <= set(inspect.signature(provider.flash_attn_varlen_func).parameters)
    with pytest.raises(ValueError, match=r"fa_version=2"):
        provider.flash_attn_varlen_func(q=None, k=None, v=None, max_seqlen_q=1, cu_seqlens_q=None,
                                        max_seqlen_k=1, fa_version=2)


def test_upstream_fa3_without_mla_head_dims_is_passed_over(monkeypatch):
    record = {}
    monkeypatch.setitem(sys.modules, "fake_upstream_fa3", _fake_upstream_module(record))
    cfg_mod = types.ModuleType("flash_attn_config")
    cfg_mod.CONFIG = {"build_flags": {"FLASHATTENTION_DISABLE_HDIMDIFF64": True}}
    monkeypatch.setitem(sys.modules, "flash_attn_config", cfg_mod)
    provider, why = fa3_providers._upstream_provider("fake_upstream_fa3")
    assert provider is None and "FLASHATTENTION_DISABLE_HDIMDIFF64" in why
    old = types.ModuleType("fake_old_fa3")
    old.flash_attn_varlen_func = lambda q, k, v: None
    monkeypatch.setitem(sys.modules, "fake_old_fa3", old)
    provider, why = fa3_providers._upstream_provider("fake_old_fa3")
    assert provider is None and "too old for MLA" in why


def test_vllm_provider_without_q_v_is_passed_over(monkeypatch):
    mod = types.ModuleType("fake_vllm_fa")
    mod.flash_attn_varlen_func = lambda q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, block_table=None: None
    mod.get_scheduler_metadata = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "fake_vllm_fa", mod)
    provider, why = fa3_providers._vllm_provider("fake_vllm_fa")
    assert provider is None and "q_v" in why and "(64, 512)" in why


# ----------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------


def _require_fa3():
    reason = fa3.fa3_unavailable_reason()
    if reason is not None:
        pytest.skip(f"FA3 unavailable: {reason}")


def _reference_on(batch, device):
    """The torch reference in float32 on the same (dtype-representable) values."""
    cfg32 = batch.config.replace(dtype="float32")
    q32, kv32 = _torch_batch(batch, device, "float32")
    out, lse = mla_torch.mla_decode(q32, kv32, batch.metadata, cfg32, impl="reference")
    return out.cpu().numpy(), lse.cpu().numpy()


def _fa3_or_skip_page_size(fn, config):
    """Runs `fn`; a page size vLLM does not declare (not a multiple of 16) that FA3 rejects
    is skipped with FA3's message. Anything else propagates."""
    try:
        res = fn()
        torch.cuda.synchronize()
        return res
    except RuntimeError as e:
        if config.page_size % 16:
            pytest.skip(f"FA3 rejects page_size={config.page_size}: {e}")
        raise


@pytest.mark.gpu
def test_gpu_fa3_provider_and_capability():
    _require_fa3()
    provider = fa3.find_fa3()
    assert provider.name in ("flash_attn_interface", "flash_attn_3.flash_attn_interface", "vllm.vllm_flash_attn")
    assert fa3.FlashAttnMLABackend.supports_compute_capability(torch.cuda.get_device_capability())
    assert fa3.unsupported_reason(MLAConfig(num_heads=16), "cuda") is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_gpu_fa3_matches_reference(name, dtype):
    """Every parity scenario (q_len 1..8, 16 and 128 heads, page sizes 1/16/64, permuted
    block tables) in bf16 and fp16. Unused blocks hold NaN; the tails of last pages hold
    +-1e4 garbage: FA3 multiplies masked (zero) probabilities by those rows in some tile
    configurations, so NaN there would propagate (as measured on the H200),
    while garbage that leaked into the softmax would still fail the comparison."""
    _require_fa3()
    batch = make_batch(SCENARIOS[name], dtype, page_tail="finite")
    q, kv = _torch_batch(batch, "cuda")
    out, lse, used = _fa3_or_skip_page_size(
        lambda: mla_torch.mla_decode(q, kv, batch.metadata, batch.config, impl="fa3", return_impl=True), batch.config)
    T, H = q.shape[:2]
    assert used == "fa3"
    assert out.shape == (T, H, 512) and out.dtype == q.dtype and out.device.type == "cuda"
    assert lse.shape == (T, H) and lse.dtype == torch.float32
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "NaN from an unused block leaked"
    _assert_matches(out, lse, *_reference_on(batch, "cuda"), dtype, f"FA3 {name} {dtype}")


@pytest.mark.gpu
def test_gpu_fa3_tuple_q_is_the_same_call():
    _require_fa3()
    batch = make_batch(SCENARIOS["spec_decode"], "bfloat16", page_tail="finite")
    q, kv = _torch_batch(batch, "cuda")
    out1, lse1 = mla_torch.mla_decode(q, kv, batch.metadata, batch.config, impl="fa3")
    out2, lse2 = mla_torch.mla_decode((q[..., :512], q[..., 512:]), kv, batch.metadata, batch.config, impl="fa3")
    q_nope, q_pe = q[..., :512].contiguous(), q[..., 512:].contiguous()
    out3, lse3 = mla_torch.mla_decode((q_nope, q_pe), kv, batch.metadata, batch.config, impl="fa3")
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)
    assert torch.equal(out1, out3) and torch.equal(lse1, lse3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["decode_mixed_lengths", "spec_decode", "page_size_16", "heads_128",
                                  "heads_128_spec"])
def test_gpu_fa3_bounded_splits(name):
    """Full-cuda-graph mode, eagerly: the persistent schedule and num_splits = 32 (FA3's
    dynamic split) give the reference's answer too."""
    _require_fa3()
    batch = make_batch(SCENARIOS[name], "bfloat16", page_tail="finite", max_num_seqs=8, max_capture_size=64)
    q, kv = _torch_batch(batch, "cuda")
    builder = fa3.FlashAttnMLAMetadataBuilder(batch.config, "cuda", use_full_cuda_graph=True)
    impl = fa3.FlashAttnMLAImpl.from_config(batch.config, "cuda")
    md = builder.build(batch.metadata, num_blocks=kv.shape[0])
    assert md.decode.max_num_splits == 32
    assert md.decode.scheduler_metadata.data_ptr() == builder.scheduler_metadata.data_ptr()
    n = md.decode.scheduler_metadata.shape[0]
    assert n <= fa3.scheduler_metadata_buffer_size(len(batch.scenario.seq_lens)), (
        f"FA3's schedule ({n}) is longer than the seed's bound 1 + round_up(B, 4) * 4"
    )
    out, lse = impl._forward_decode(q, kv, md)
    torch.cuda.synchronize()
    _assert_matches(out, lse, *_reference_on(batch, "cuda"), "bfloat16", f"FA3 splits=32 {name}")


def _graph_batches(num_heads, q_lens_a, q_lens_b, q_lens_c):
    over = dict(max_num_seqs=8, max_capture_size=64)
    a = make_batch(Scenario("graph_a", seq_lens=(40, 97, 300, 1030), query_lens=q_lens_a, num_heads=num_heads),
                   "bfloat16", seed=1, page_tail="finite", **over)
    b = make_batch(Scenario("graph_b", seq_lens=(1100, 5), query_lens=q_lens_b, num_heads=num_heads),
                   "bfloat16", seed=2, page_tail="finite", **over)
    c = make_batch(Scenario("graph_c", seq_lens=(64, 8, 700, 129, 2000), query_lens=q_lens_c, num_heads=num_heads),
                   "bfloat16", seed=3, page_tail="finite", **over)
    return a, b, c


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads, max_query_len", [(16, 1), (16, 8), (128, 1), (128, 4)])
def test_gpu_cuda_graph_replay_matches_eager(num_heads, max_query_len):
    """Capture once on batch A, replay with B (fewer requests, other lengths) and C (more
    requests), then A again: each replay matches eager FA3 and the reference, and A's
    replay is bitwise repeatable."""
    _require_fa3()
    ql = (lambda *x: tuple(min(v, max_query_len) for v in x))
    a, b, c = _graph_batches(num_heads, ql(2, 4, 8, 3), ql(3, 5), ql(1, 8, 2, 8, 4))
    cfg = a.config
    nb = max(x.kv_cache.shape[0] for x in (a, b, c))
    kv = torch.full((nb, cfg.page_size, cfg.head_dim), float("nan"), dtype=torch.bfloat16, device="cuda")
    max_tokens = max(x.scenario.num_tokens for x in (a, b, c))
    g = fa3.FA3DecodeGraph(cfg, kv, max_num_reqs=5, max_num_tokens=max_tokens, max_blocks_per_req=40,
                           max_query_len=max_query_len)

    def put(batch):
        q, kvb = _torch_batch(batch, "cuda")
        kv.fill_(float("nan"))
        kv[: kvb.shape[0]] = kvb
        return q

    results = {}
    for i, batch in enumerate((a, b, c, a)):
        q = put(batch)
        out, lse = g.capture(q, batch.metadata) if i == 0 else g.replay(q, batch.metadata)
        torch.cuda.synchronize()
        out, lse = out.clone(), lse.clone()
        what = f"graph replay {i} ({batch.scenario.name}, H={num_heads}, max_query_len={max_query_len})"
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), what
        ref = _reference_on(batch, "cuda")
        _assert_matches(out, lse, *ref, "bfloat16", what)
        e_out, e_lse = mla_torch.mla_decode(q, kv, batch.metadata, batch.config, impl="fa3")
        _assert_matches(out, lse, e_out, e_lse, "bfloat16", f"{what} vs eager FA3")
        if batch.scenario.name in results:
            p_out, p_lse = results[batch.scenario.name]
            assert torch.equal(out, p_out) and torch.equal(lse, p_lse), f"{what}: replay is not repeatable"
        results[batch.scenario.name] = (out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads", [16, 128])
@pytest.mark.parametrize("q_len", [1, 2, 4])
def test_gpu_fa3_agrees_with_flashmla_at_page_64(num_heads, q_len):
    """A second anchor: vLLM's FlashMLA build on the same batch (uniform q_len: FlashMLA
    takes q as [B, q_len, H, 576] and returns lse [B, H, q_len])."""
    _require_fa3()
    try:
        from vllm.third_party.flashmla import flash_mla_interface as fm
    except Exception as e:  # noqa: BLE001 - any import failure means "no FlashMLA here"
        pytest.skip(f"FlashMLA does not import: {type(e).__name__}: {e}")
    sc = Scenario(f"flashmla_q{q_len}", seq_lens=(17, 33, 97, 1030, 4100), query_lens=(q_len,) * 5,
                  num_heads=num_heads, page_size=64)
    batch = make_batch(sc, "bfloat16", page_tail="finite")
    q, kv = _torch_batch(batch, "cuda")
    out, lse = mla_torch.mla_decode(q, kv, batch.metadata, batch.config, impl="fa3")
    B, H, T = len(sc.seq_lens), num_heads, sc.num_tokens
    seq_lens = torch.as_tensor(batch.metadata.seq_lens, dtype=torch.int32, device="cuda")
    block_table = torch.as_tensor(batch.metadata.block_table, dtype=torch.int32, device="cuda")
    q4 = q.view(B, q_len, H, 576)
    k4 = kv.view(kv.shape[0], 64, 1, 576)
    if "cache_seqlens" in inspect.signature(fm.get_mla_metadata).parameters:  # builds whose metadata call takes the lengths
        sched, splits = fm.get_mla_metadata(seq_lens, q_len * H, 1)
    else:
        sched, splits = fm.get_mla_metadata()
    m_out, m_lse = fm.flash_mla_with_kvcache(q4, k4, block_table, seq_lens, 512, sched, splits,
                                             softmax_scale=batch.config.softmax_scale, causal=True)
    torch.cuda.synchronize()
    assert m_out.shape == (B, q_len, H, 512) and m_lse.shape == (B, H, q_len)
    m_out = m_out.reshape(T, H, 512)
    m_lse = m_lse.permute(0, 2, 1).reshape(T, H)
    ref = _reference_on(batch, "cuda")
    _assert_matches(m_out, m_lse, *ref, "bfloat16", "FlashMLA vs reference")
    _assert_matches(out, lse, *ref, "bfloat16", "FA3 vs reference")
    _assert_matches(out, lse, m_out, m_lse, "bfloat16", "FA3 vs FlashMLA")
    c = compare(_np(out), _np(m_out), name="FA3 vs FlashMLA out", rel_tol=4e-3)
    assert c.ok, c.message


# ----------------------------------------------------------------------------------------
# Buckets: padded metadata through the Impl and FA3DecodeGraph (CPU, stand-in); vLLM's capture sizes
# ----------------------------------------------------------------------------------------


def _padded(batch, cfg, extra_tokens=3):
    md = batch.metadata
    bucket = Bucket(num_reqs=md.num_reqs + 2, num_tokens=md.num_decode_tokens + extra_tokens,
                    max_blocks=md.max_blocks + 2, max_seq_len=md.max_seq_len + 64, max_query_len=8)
    return bucket, pad_to_bucket(md, bucket, cfg)


def test_padded_bucket_rows_are_zero_and_minus_inf_through_the_graph_and_the_impl(monkeypatch):
    """A batch padded to a bucket: the real rows match the reference, and the padding rows (whose q is NaN, and
    which FA3 leaves unwritten: NaN in the stand-in) are out 0, lse -inf, through FA3DecodeGraph and through
    mla_torch.mla_decode(impl="fa3")."""
    cfg = MLAConfig(num_heads=16, page_size=16, max_num_seqs=8, max_capture_size=32)
    a = make_batch(Scenario("a", seq_lens=(40, 97, 130), query_lens=(2, 4, 3), page_size=16), "bfloat16",
                   max_num_seqs=8, max_capture_size=32)
    bucket, md = _padded(a, cfg)
    T = a.metadata.num_decode_tokens
    q, kv = _torch_batch(a)
    q = torch.cat([q, torch.full((bucket.num_tokens - T,) + tuple(q.shape[1:]), float("nan"), dtype=q.dtype)])
    fake = FakeFA3(cfg)
    ref_out, ref_lse = np_reference.mla_decode(a.q, a.kv_cache, a.metadata, a.config)
    g = fa3.FA3DecodeGraph(cfg, kv, max_num_reqs=bucket.num_reqs, max_num_tokens=bucket.num_tokens,
                           max_blocks_per_req=bucket.max_blocks, max_query_len=8, fa3_provider=fake.provider)
    monkeypatch.setattr(fa3_providers, "require_fa3", lambda device: None)
    monkeypatch.setattr(fa3_impl, "_builder_and_impl",
                        lambda config, device: (fa3.FlashAttnMLAMetadataBuilder(config, device, fa3_provider=fake.provider),
                                                fa3.FlashAttnMLAImpl.from_config(config, device, fa3_provider=fake.provider)))
    for what, (out, lse) in (("graph", g.run_eager(q, md)), ("impl", fa3.mla_decode(q, kv, md, cfg))):
        assert g.query_start_loc.tolist() == [0, 2, 6, 9, 9, 9], what  # padding requests repeat the token count
        assert out.shape == (bucket.num_tokens, 16, 512) and lse.shape == (bucket.num_tokens, 16), what
        _assert_matches(out[:T], lse[:T], ref_out, ref_lse, "bfloat16", what)
        assert (out[T:] == 0).all() and (lse[T:] == float("-inf")).all(), what


def test_capture_size_buckets_are_vllms_sizes():
    sizes = [b.num_tokens for b in capture_size_buckets(256, max_blocks=64, max_seq_len=4096)]
    assert sizes == [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
    assert [b.num_tokens for b in capture_size_buckets(4, max_blocks=8, max_seq_len=128)] == [1, 2, 4, 8]
    b = capture_size_buckets(2, max_blocks=8, max_seq_len=128, max_query_len=2)
    assert [x.num_reqs for x in b] == [1, 2, 4] and {x.max_query_len for x in b} == {2}
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1, got max_num_seqs=0"):
        capture_size_buckets(0, max_blocks=8, max_seq_len=128)


@pytest.mark.gpu
def test_bucket_graphs_capture_once_per_bucket_and_match_the_reference():
    """mla_torch.BucketGraphs on FA3: batches of changing sizes through three buckets; one capture a bucket, every
    replay against the torch reference, padding rows 0 / -inf."""
    if FA3_REASON is not None:
        pytest.skip(FA3_REASON)
    cfg = MLAConfig(num_heads=16, page_size=16)
    buckets = [Bucket(num_reqs=n, num_tokens=3 * n, max_blocks=16, max_seq_len=256, max_query_len=3) for n in (2, 4, 8)]
    rng = np.random.default_rng(0)
    kv = torch.randn((1 + 8 * 16, 16, 576), dtype=torch.bfloat16, device="cuda")
    graphs = mla_torch.BucketGraphs(cfg, kv, buckets)
    for step, n in enumerate([1, 2, 3, 5, 8, 4, 2, 7, 1, 6]):
        seq = rng.integers(4, 250, size=n)
        qlen = rng.integers(1, 4, size=n)
        bt = rng.permutation(np.arange(1, kv.shape[0]))[: n * 16].reshape(n, 16)
        md = build_decode_metadata(seq_lens=seq, query_lens=qlen, block_table=bt, config=cfg, num_blocks=kv.shape[0])
        q = torch.randn((md.num_decode_tokens, 16, 576), dtype=torch.bfloat16, device="cuda")
        out, lse = graphs(q, md)
        torch.cuda.synchronize()
        ref = torch_reference.mla_decode(q[..., :512], q[..., 512:], kv, torch.from_numpy(md.query_start_loc),
                                         torch.from_numpy(md.seq_lens), torch.from_numpy(md.block_table), cfg)
        _assert_matches(out, lse, *ref, "bfloat16", f"step {step}")
    assert graphs.num_captured == 3
