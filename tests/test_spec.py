"""mla_spec: config validation, metadata builder and validation, decode/prefill split."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mla_spec
import mla_spec.dcp
from mla_spec import DecodeMetadata, MLAConfig, build_decode_metadata, split_decodes_and_prefills
from mla_spec.config import FP8_KV_CACHE_MSG, NON_DECODER_MSG, UNSUPPORTED_FEATURES_MSG

# ----------------------------------------------------------------------------- MLAConfig


def test_config_defaults_are_deepseek_v3():
    c = MLAConfig(num_heads=128)
    assert (c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim) == (512, 64, 128, 128)
    assert c.head_dim == 576
    assert c.page_size == 64
    assert c.softmax_scale == pytest.approx(192**-0.5)
    assert c.reorder_batch_threshold == 512
    assert c.max_num_splits_for_cuda_graph == 32


def test_config_is_frozen_and_hashable():
    c = MLAConfig(num_heads=16)
    with pytest.raises(Exception):
        c.num_heads = 8
    assert hash(c) == hash(MLAConfig(num_heads=16))


def test_reorder_threshold_is_1_with_dcp():
    assert MLAConfig(num_heads=16, dcp_world_size=2).reorder_batch_threshold == 1
    with pytest.raises(ValueError, match="reorder_batch_threshold=512"):
        MLAConfig(num_heads=16, dcp_world_size=2, reorder_batch_threshold=512)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_heads=0), "num_heads=0"),
        (dict(num_heads=-3), "num_heads=-3"),
        (dict(num_heads=16, page_size=0), "page_size=0"),
        (dict(num_heads=16, page_size=2.5), "page_size=2.5"),
        (dict(num_heads=True), "num_heads=True"),
        (dict(num_heads=16, softmax_scale=0.0), "softmax_scale=0.0"),
        (dict(num_heads=16, softmax_scale=-1.0), "softmax_scale=-1.0"),
        (dict(num_heads=16, softmax_scale=float("nan")), "softmax_scale=nan"),
        (dict(num_heads=16, dtype="int8"), "dtype='int8'"),
        (dict(num_heads=16, kv_cache_dtype="fp4"), "kv_cache_dtype='fp4'"),
        (dict(num_heads=16, max_num_splits_for_cuda_graph=0), "max_num_splits_for_cuda_graph=0"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(".", r"\.")):
        MLAConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs", [dict(alibi_slopes=(0.5,)), dict(sliding_window=128), dict(logits_soft_cap=30.0)]
)
def test_config_rejects_seed_unsupported_features(kwargs):
    with pytest.raises(NotImplementedError, match="alibi_slopes, sliding_window, logits_soft_cap"):
        MLAConfig(num_heads=16, **kwargs)
    assert "FlashAttnMLAImpl" in UNSUPPORTED_FEATURES_MSG


@pytest.mark.parametrize("attn_type", ["encoder", "encoder_only", "encoder_decoder"])
def test_config_rejects_non_decoder(attn_type):
    with pytest.raises(NotImplementedError, match="Encoder self-attention") as e:
        MLAConfig(num_heads=16, attn_type=attn_type)
    assert str(e.value) == NON_DECODER_MSG


def test_fp8_config_takes_a_float8_e4m3fn_cache():
    """The shared layer accepts an fp8 cache with kv_cache_dtype="fp8_e4m3" and names a mismatch
    either way; FA3 alone refuses fp8, with the seed's message (tests/test_fp8.py, test_fa3.py)."""
    c = MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3")
    assert c.is_fp8_kv_cache
    from mla_spec import validate_inputs

    md = build_decode_metadata(seq_lens=[4], query_lens=[1], block_table=[[0]], config=c)
    shapes = dict(q_shapes=((1, 16, 576),), q_dtypes=("bfloat16",), kv_cache_shape=(1, 64, 576))
    validate_inputs(c, md, kv_cache_dtype="float8_e4m3fn", **shapes)
    with pytest.raises(ValueError, match="kv_cache dtype must be float8_e4m3fn with kv_cache_dtype='fp8_e4m3', "
                                         "got kv_cache.dtype=bfloat16"):
        validate_inputs(c, md, kv_cache_dtype="bfloat16", **shapes)
    with pytest.raises(ValueError, match="kv_cache_dtype='auto', got kv_cache.dtype=float8_e4m3fn"):
        validate_inputs(c.replace(kv_cache_dtype="auto"), md, kv_cache_dtype="float8_e4m3fn", **shapes)
    assert FP8_KV_CACHE_MSG == "FlashAttnMLA V1 with FP8 KV cache not yet supported"


# ----------------------------------------------------------------------------- builder

CFG = MLAConfig(num_heads=16, page_size=16)


def test_builder_makes_int32_metadata():
    md = build_decode_metadata(seq_lens=[5, 40, 17], query_lens=[1, 3, 2], block_table=[[7], [1, 2, 4], [3, 5]],
                               config=CFG, num_blocks=8)
    assert md.query_start_loc.tolist() == [0, 1, 4, 6]
    assert md.seq_lens.tolist() == [5, 40, 17]
    assert md.block_table.tolist() == [[7, 0, 0], [1, 2, 4], [3, 5, 0]]
    assert (md.max_query_len, md.max_seq_len, md.num_decode_tokens) == (3, 40, 6)
    for a in (md.query_start_loc, md.seq_lens, md.block_table):
        assert a.dtype == np.int32
    assert md.num_reqs == 3 and md.max_blocks == 3


def test_builder_accepts_2d_array_block_table():
    bt = np.array([[3, 1], [2, 0]], np.int64)
    md = build_decode_metadata(seq_lens=[20, 3], query_lens=[1, 1], block_table=bt, config=CFG, num_blocks=4)
    assert md.block_table.dtype == np.int32 and md.block_table.tolist() == bt.tolist()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(seq_lens=[4, 5], query_lens=[1], block_table=[[0], [1]]), "same length"),
        (dict(seq_lens=[4], query_lens=[5], block_table=[[0]]), "q_len=5 > seq_len=4"),
        (dict(seq_lens=[4], query_lens=[0], block_table=[[0]]), "q_len=0"),
        (dict(seq_lens=[-4], query_lens=[1], block_table=[[0]]), r"seq_lens\[0\]=-4"),
        (dict(seq_lens=[4], query_lens=[-1], block_table=[[0]]), r"query_lens\[0\]=-1"),
        (dict(seq_lens=[40], query_lens=[1], block_table=[[0, 1]]), "too few blocks"),
        (dict(seq_lens=[4], query_lens=[1], block_table=[[-2]]), r"negative block id: block_table\[0, 0\]=-2"),
        (dict(seq_lens=[4], query_lens=[1], block_table=[[9]]), r"block_table\[0, 0\]=9 >= num_blocks=8"),
        (dict(seq_lens=[4], query_lens=[1], block_table=[[0], [1]]), "one row per request"),
        (dict(seq_lens=[4], query_lens=[1], block_table=np.zeros((1, 1, 1), np.int32)), "2-D"),
        (dict(seq_lens=[4], query_lens=[1], block_table=np.zeros((1, 1), np.float32)), "integers"),
        (dict(seq_lens=[4.5], query_lens=[1], block_table=[[0]]), "integers"),
        (dict(seq_lens=[], query_lens=[], block_table=[]), "at least one request"),
        (dict(seq_lens=[[4]], query_lens=[[1]], block_table=[[0]]), "1-D"),
        (dict(seq_lens=[600], query_lens=[513], block_table=[list(range(38))]), "reorder_batch_threshold=512"),
        (dict(seq_lens=[4], query_lens=[1], block_table=None), "block_table must be a 2-D integer array or one list "
                                                               "of block ids per request, got block_table=None"),
        (dict(seq_lens=[4], query_lens=[1], block_table=3), "got block_table=3"),
        (dict(seq_lens=[4], query_lens=[1], block_table="0"), "got block_table='0'"),
    ],
)
def test_builder_rejects_bad_batches(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_decode_metadata(config=CFG, num_blocks=8 if "600" not in str(kwargs) else 64, **kwargs)


def test_block_ids_past_last_page_are_not_checked():
    # Padding entries beyond a request's pages may be anything (vLLM pads with 0; a user may use -1).
    md = build_decode_metadata(seq_lens=[16, 40], query_lens=[1, 1], block_table=[[2, -1, -1], [1, 3, 4]],
                               config=CFG, num_blocks=5)
    assert md.block_table[0, 1] == -1


# ----------------------------------------------------------------------------- validate()


def _md(**changes):
    md = build_decode_metadata(seq_lens=[5, 40], query_lens=[1, 3], block_table=[[3], [1, 2, 4]], config=CFG,
                               num_blocks=5)
    return md.replace(**changes)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(query_start_loc=np.array([1, 2, 5], np.int32)), r"query_start_loc\[0\]=1"),
        (dict(query_start_loc=np.array([0, 3, 2], np.int32)), "q_len=-1"),
        (dict(query_start_loc=np.array([0, 1], np.int32)), "num_reqs \\+ 1"),
        (dict(query_start_loc=np.array([0.0, 1.0, 4.0])), "integer dtype"),
        (dict(seq_lens=np.array([5, 40, 3], np.int32)), "num_reqs \\+ 1"),
        (dict(seq_lens=np.array([[5, 40]], np.int32)), "1-D"),
        (dict(block_table=np.array([3, 1], np.int32)), "2-D"),
        (dict(block_table=np.zeros((2, 0), np.int32)), "at least one column"),
        (dict(block_table=np.ones((3, 3), np.int32)), "one row per request"),
        (dict(max_query_len=0), "max_query_len=0"),
        (dict(max_query_len=2), "max_query_len=2 < 3"),
        (dict(max_seq_len=39), "max_seq_len=39 < 40"),
        (dict(max_query_len=50), "max_query_len must be <= max_seq_len"),
        (dict(num_decode_tokens=5), "num_decode_tokens=5"),
        (dict(max_num_splits=-1), "max_num_splits=-1"),
        (dict(seq_lens=np.array([0, 40], np.int32)), r"seq_lens\[0\]=0"),
        (dict(block_table=np.array([[3, 0], [1, 2]], np.int32)), "too few blocks"),
        (dict(seq_lens=[5, 40]), "must be an array"),
    ],
)
def test_validate_names_the_broken_invariant(changes, match):
    with pytest.raises(ValueError, match=match):
        _md(**changes).validate(CFG, num_blocks=5)


def test_validate_checks_block_range_only_with_num_blocks():
    md = _md()
    md.validate(CFG)  # no cache size given: ids 1..4 are fine
    with pytest.raises(ValueError, match=r"block_table\[1, 2\]=4 >= num_blocks=4"):
        md.validate(CFG, num_blocks=4)


def test_validate_shape_only_mode_skips_values():
    md = _md(seq_lens=np.array([0, 40], np.int32))
    md.validate(CFG, check_values=False)  # traced arrays: only shapes and static ints
    with pytest.raises(ValueError):
        md.validate(CFG)


def test_metadata_rejects_page_size_mismatch_via_block_count():
    cfg64 = CFG.replace(page_size=64)
    _md().validate(cfg64, num_blocks=5)  # 40 tokens need 1 page of 64: fine
    with pytest.raises(ValueError, match=r"seq_lens\[0\]=5 needs 5 blocks of page_size=1"):
        _md().validate(CFG.replace(page_size=1), num_blocks=5)


# ----------------------------------------------------------------------------- decode/prefill split


def test_split_orders_decodes_first():
    split = split_decodes_and_prefills([1, 600, 3, 1000, 512], CFG)
    assert split.order.tolist() == [0, 2, 4, 1, 3]
    assert (split.num_decodes, split.num_prefills) == (3, 2)
    assert (split.num_decode_tokens, split.num_prefill_tokens) == (516, 1600)


def test_split_with_dcp_keeps_only_single_token_decodes():
    split = split_decodes_and_prefills([1, 2, 1], MLAConfig(num_heads=16, dcp_world_size=2))
    assert split.order.tolist() == [0, 2, 1] and split.num_decodes == 2


# ----------------------------------------------------------------------------- properties


@st.composite
def batches(draw):
    page = draw(st.sampled_from([1, 3, 16, 64]))
    n = draw(st.integers(1, 6))
    seq = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    q = [draw(st.integers(1, min(s, 8))) for s in seq]
    pages = [-(-s // page) for s in seq]
    num_blocks = sum(pages) + draw(st.integers(1, 3))
    ids = draw(st.permutations(list(range(num_blocks))))
    bt, k = [], 0
    for p in pages:
        bt.append(ids[k : k + p])
        k += p
    return page, seq, q, bt, num_blocks


@settings(max_examples=60, deadline=None)
@given(batches())
def test_builder_roundtrip_property(b):
    page, seq, q, bt, num_blocks = b
    cfg = MLAConfig(num_heads=4, page_size=page)
    md = build_decode_metadata(seq_lens=seq, query_lens=q, block_table=bt, config=cfg, num_blocks=num_blocks)
    assert np.diff(md.query_start_loc).tolist() == q
    assert md.seq_lens.tolist() == seq
    assert md.num_decode_tokens == sum(q) and md.max_query_len == max(q) and md.max_seq_len == max(seq)
    for r, row in enumerate(bt):
        assert md.block_table[r, : len(row)].tolist() == list(row)
    md.validate(cfg, num_blocks=num_blocks)


@settings(max_examples=60, deadline=None)
@given(batches(), st.data())
def test_validate_catches_any_out_of_range_block(b, data):
    page, seq, q, bt, num_blocks = b
    cfg = MLAConfig(num_heads=4, page_size=page)
    md = build_decode_metadata(seq_lens=seq, query_lens=q, block_table=bt, config=cfg, num_blocks=num_blocks)
    r = data.draw(st.integers(0, len(seq) - 1))
    c = data.draw(st.integers(0, len(bt[r]) - 1))
    bad = data.draw(st.one_of(st.integers(-1000, -1), st.integers(num_blocks, num_blocks + 1000)))
    table = md.block_table.copy()
    table[r, c] = bad
    with pytest.raises(ValueError, match=rf"block_table\[{r}, {c}\]={bad}"):
        md.replace(block_table=table).validate(cfg, num_blocks=num_blocks)


@settings(max_examples=60, deadline=None)
@given(batches(), st.data())
def test_validate_catches_q_len_above_seq_len(b, data):
    page, seq, q, bt, num_blocks = b
    cfg = MLAConfig(num_heads=4, page_size=page)
    r = data.draw(st.integers(0, len(seq) - 1))
    q = list(q)
    q[r] = seq[r] + data.draw(st.integers(1, 5))
    with pytest.raises(ValueError, match=f"q_len={q[r]} > seq_len={seq[r]}"):
        build_decode_metadata(seq_lens=seq, query_lens=q, block_table=bt, config=cfg, num_blocks=num_blocks)


def test_decode_metadata_is_a_plain_frozen_dataclass():
    md = _md()
    assert isinstance(md, DecodeMetadata)
    with pytest.raises(Exception):
        md.max_seq_len = 3


def test_replace_derives_defaults_again():
    c = MLAConfig(num_heads=16)
    assert c.replace(dcp_world_size=2).reorder_batch_threshold == 1
    assert c.replace(qk_nope_head_dim=64).softmax_scale == pytest.approx(128**-0.5)
    custom = MLAConfig(num_heads=16, softmax_scale=0.1, reorder_batch_threshold=8)
    assert custom.replace(qk_nope_head_dim=64).softmax_scale == 0.1
    assert custom.replace(num_heads=8).reorder_batch_threshold == 8


def test_config_takes_numpy_ints_as_python_ints():
    """A NumPy int (read from an array, say) is stored as a Python int: equal configs hash alike."""
    c = MLAConfig(num_heads=np.int64(16), page_size=np.int32(64), reorder_batch_threshold=np.int64(4))
    assert c == MLAConfig(num_heads=16, page_size=64, reorder_batch_threshold=4)
    assert type(c.num_heads) is int and type(c.page_size) is int and type(c.reorder_batch_threshold) is int
    with pytest.raises(ValueError, match=r"num_heads must be >= 1, got num_heads=0"):
        MLAConfig(num_heads=np.int64(0))
    with pytest.raises(ValueError, match=r"num_heads must be an int, got num_heads=16.0"):
        MLAConfig(num_heads=16.0)


# ----------------------------------------------------------------------------- a non-config as config

_BUILT = build_decode_metadata(seq_lens=[4], query_lens=[1], block_table=[[0]], config=MLAConfig(num_heads=16),
                               num_blocks=2)
SPEC_CONFIG_TAKERS = {
    "build_decode_metadata": lambda c: build_decode_metadata(seq_lens=[4], query_lens=[1], block_table=[[0]], config=c),
    "split_decodes_and_prefills": lambda c: split_decodes_and_prefills([1, 2], c),
    "DecodeMetadata.validate": lambda c: _BUILT.validate(c),
    "validate_k_scale": lambda c: mla_spec.validate_k_scale(1.0, c),
    "expected_kv_cache_dtype": lambda c: mla_spec.expected_kv_cache_dtype(c),
    "dcp.shard_batch": lambda c: mla_spec.dcp.shard_batch(np.zeros((2, 64, 576), np.float32), _BUILT, c),
    "dcp.local_config": lambda c: mla_spec.dcp.local_config(c),
    "dcp.check_world_size": lambda c: mla_spec.dcp.check_world_size(c, 1),
}


@pytest.mark.parametrize("fn", list(SPEC_CONFIG_TAKERS))
@pytest.mark.parametrize("config, shown", [({"num_heads": 16}, "dict"), (None, "NoneType"), ("MLAConfig", "str")])
def test_spec_functions_name_a_non_config(fn, config, shown):
    """A dict or None as config was an AttributeError on its first field."""
    with pytest.raises(ValueError, match=rf"^config must be an mla_spec.MLAConfig, got config={shown}$"):
        SPEC_CONFIG_TAKERS[fn](config)
