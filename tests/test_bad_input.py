"""Every entry point rejects bad input with a ValueError/NotImplementedError that
names the value, before any kernel runs."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import mla_jax
import mla_torch
from mla_spec import MLAConfig, reference
from parity.scenarios import SCENARIOS, make_batch

BATCH = make_batch(SCENARIOS["spec_decode_page_16"], "float32")  # seq (8, 64, 200), q (8, 5, 2), P=16
NUM_BLOCKS = BATCH.kv_cache.shape[0]


def _numpy_entry(q, kv, md, cfg):
    return reference.mla_decode(q, kv, md, cfg)


def _torch_entry(q, kv, md, cfg):
    conv = (lambda x: torch.from_numpy(np.ascontiguousarray(x)))
    q = tuple(conv(x) for x in q) if isinstance(q, tuple) else conv(q)
    return mla_torch.mla_decode(q, conv(kv), md, cfg)


def _jax_entry(q, kv, md, cfg):
    q = tuple(jnp.asarray(x) for x in q) if isinstance(q, tuple) else jnp.asarray(q)
    return mla_jax.mla_decode(q, jnp.asarray(kv), md, cfg)


ENTRIES = {"numpy": _numpy_entry, "torch": _torch_entry, "jax": _jax_entry}


def _qsl(qlens):
    return np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)


def _case(**kw):
    q = kw.pop("q", BATCH.q)
    kv = kw.pop("kv", BATCH.kv_cache)
    cfg = kw.pop("cfg", BATCH.config)
    md = BATCH.metadata.replace(**kw.pop("md", {}))
    assert not kw
    return q, kv, md, cfg


def _set(a, index, value):
    a = a.copy()
    a[index] = value
    return a


bt = BATCH.metadata.block_table
CASES = {
    "q_len > seq_len": (_case(md=dict(seq_lens=np.array([7, 64, 200], np.int32))), ValueError,
                        "q_len=8 > seq_len=7"),
    "q_len 0": (_case(md=dict(query_start_loc=_qsl([8, 0, 7]))), ValueError, "q_len=0"),
    "negative seq_len": (_case(md=dict(seq_lens=np.array([8, -64, 200], np.int32))), ValueError,
                         r"seq_lens\[1\]=-64"),
    "too few blocks": (_case(md=dict(seq_lens=np.array([8, 64, 260], np.int32), max_seq_len=260)), ValueError,
                       "too few blocks"),
    "negative block id": (_case(md=dict(block_table=_set(bt, (1, 1), -5))), ValueError,
                          r"negative block id: block_table\[1, 1\]=-5"),
    "block id beyond cache": (_case(md=dict(block_table=_set(bt, (2, 3), NUM_BLOCKS))), ValueError,
                              rf"block_table\[2, 3\]={NUM_BLOCKS} >= num_blocks={NUM_BLOCKS}"),
    "length arrays differ": (_case(md=dict(seq_lens=np.array([8, 64], np.int32))), ValueError, "num_reqs \\+ 1"),
    "block_table 1-D": (_case(md=dict(block_table=bt[0])), ValueError, "block_table must be 2-D"),
    "block_table float": (_case(md=dict(block_table=bt.astype(np.float32))), ValueError, "integer dtype"),
    "q width 575": (_case(q=BATCH.q[..., :575]), ValueError, r"q width must be .* 576, got q.shape=\(15, 16, 575\)"),
    "q_pe width 32": (_case(q=(BATCH.q_nope, BATCH.q_pe[..., :32])), ValueError, r"q_pe must be \[T, num_heads, 64\]"),
    "q tokens != metadata": (_case(q=BATCH.q[:14]), ValueError, r"q.shape\[0\]=14"),
    "q heads != config": (_case(q=BATCH.q[:, :8]), ValueError, r"num_heads=16 heads, got q.shape\[1\]=8"),
    "q 2-D": (_case(q=BATCH.q[0]), ValueError, r"q must be \[T, num_heads, 576\]"),
    "kv page size != config": (_case(kv=BATCH.kv_cache[:, :8]), ValueError, "page_size=16"),
    "kv width != 576": (_case(kv=BATCH.kv_cache[..., :512]), ValueError, "kv_cache must be"),
    "max_query_len 0": (_case(md=dict(max_query_len=0)), ValueError, "max_query_len=0"),
    "prefill in decode batch": (_case(cfg=BATCH.config.replace(reorder_batch_threshold=4)), ValueError,
                                "reorder_batch_threshold=4"),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("case", list(CASES))
def test_entry_points_reject_bad_input(entry, case):
    (q, kv, md, cfg), exc, match = CASES[case]
    with pytest.raises(exc, match=match):
        ENTRIES[entry](q, kv, md, cfg)


def test_the_valid_case_runs_on_every_entry():
    """The cases above differ from this valid batch in one thing each."""
    for entry in ENTRIES.values():
        out, lse = entry(BATCH.q, BATCH.kv_cache, BATCH.metadata, BATCH.config)
        assert np.isfinite(np.asarray(lse)).all()


@pytest.mark.parametrize("entry", ["torch", "jax"])
def test_fp8_config_needs_an_fp8_cache(entry):
    """kv_cache_dtype="fp8_e4m3" takes a float8_e4m3fn cache (tests/test_fp8.py runs it); a float32
    cache is a ValueError naming its dtype. The float64 NumPy reference takes any float array of
    fp8 values, as it takes bf16 values in float32 arrays."""
    cfg = BATCH.config.replace(kv_cache_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match="kv_cache dtype must be float8_e4m3fn with kv_cache_dtype='fp8_e4m3', "
                                         "got kv_cache.dtype=float32"):
        ENTRIES[entry](BATCH.q, BATCH.kv_cache, BATCH.metadata, cfg)


@pytest.mark.parametrize("entry", ["torch", "jax"])
def test_q_dtype_must_match_config(entry):
    cfg = BATCH.config.replace(dtype="bfloat16")
    with pytest.raises(ValueError, match="q dtype must be config.dtype='bfloat16', got q.dtype=float32"):
        ENTRIES[entry](BATCH.q, BATCH.kv_cache, BATCH.metadata, cfg)


def test_kv_dtype_must_match_q():
    cfg = BATCH.config.replace(dtype="bfloat16")
    q = torch.from_numpy(BATCH.q).bfloat16()
    with pytest.raises(ValueError, match="got kv_cache.dtype=float16"):
        mla_torch.mla_decode(q, torch.from_numpy(BATCH.kv_cache).half(), BATCH.metadata, cfg)
    with pytest.raises(ValueError, match="got kv_cache.dtype=float16"):
        mla_jax.mla_decode(jnp.asarray(BATCH.q, jnp.bfloat16), jnp.asarray(BATCH.kv_cache, jnp.float16),
                           BATCH.metadata, cfg)


@pytest.mark.parametrize("entry", ["torch", "jax"])
def test_unknown_impl_is_named(entry):
    f = {"torch": mla_torch.mla_decode, "jax": mla_jax.mla_decode}[entry]
    with pytest.raises(ValueError, match="impl='cuda_magic'"):
        q = torch.from_numpy(BATCH.q) if entry == "torch" else jnp.asarray(BATCH.q)
        kv = torch.from_numpy(BATCH.kv_cache) if entry == "torch" else jnp.asarray(BATCH.kv_cache)
        f(q, kv, BATCH.metadata, BATCH.config, impl="cuda_magic")


def test_non_array_inputs_are_rejected():
    with pytest.raises(ValueError, match="torch tensors, got list"):
        mla_torch.mla_decode([[1.0]], torch.zeros(1), BATCH.metadata, BATCH.config)
    with pytest.raises(ValueError, match="must be arrays, got list"):
        mla_jax.mla_decode([[1.0]], jnp.zeros(1), BATCH.metadata, BATCH.config)


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        (dict(num_heads=0), ValueError),
        (dict(num_heads=16, page_size=0), ValueError),
        (dict(num_heads=16, softmax_scale=-0.1), ValueError),
        (dict(num_heads=16, dtype="float64"), ValueError),
        (dict(num_heads=16, kv_cache_dtype="int8"), ValueError),
        (dict(num_heads=16, alibi_slopes=(1.0,)), NotImplementedError),
        (dict(num_heads=16, sliding_window=4096), NotImplementedError),
        (dict(num_heads=16, logits_soft_cap=50.0), NotImplementedError),
        (dict(num_heads=16, attn_type="encoder_decoder"), NotImplementedError),
    ],
)
def test_bad_configs_never_reach_an_entry_point(kwargs, exc):
    with pytest.raises(exc):
        MLAConfig(**kwargs)
