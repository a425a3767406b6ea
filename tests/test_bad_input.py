"""Every entry point rejects bad input with a ValueError/NotImplementedError that
names the value, before any kernel runs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import mla_jax
import mla_spec
import mla_torch
from mla_jax import dcp as jdcp
from mla_jax import combine, pallas_triton
from mla_spec import MLAConfig, reference
from mla_spec.config import K_SCALE_MAX
from mla_spec import dcp as sdcp
from mla_torch import dcp as tdcp
from parity.scenarios import SCENARIOS, Scenario, make_batch, make_fp8_batch

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
    "q 3-tuple": (_case(q=(BATCH.q_nope, BATCH.q_pe, BATCH.q_pe)), ValueError,
                  r"q must be one array or a \(q_nope, q_pe\) pair, got a tuple of 3"),
    "q 1-tuple": (_case(q=(BATCH.q,)), ValueError, r"q must be one array or a \(q_nope, q_pe\) pair, got a tuple of 1"),
    "block_table None": (_case(md=dict(block_table=None)), ValueError, "block_table must be an array, got block_table=NoneType"),
    "seq_lens None": (_case(md=dict(seq_lens=None)), ValueError, "seq_lens must be an array, got seq_lens=NoneType"),
    "query_start_loc list": (_case(md=dict(query_start_loc=BATCH.metadata.query_start_loc.tolist())), ValueError,
                             "query_start_loc must be an array, got query_start_loc=list"),
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
    with pytest.raises(ValueError, match="torch tensors, got q=list"):
        mla_torch.mla_decode([[1.0]], torch.zeros(1), BATCH.metadata, BATCH.config)
    with pytest.raises(ValueError, match="must be arrays, got q=list"):
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


# ----------------------------------------------------------------------------------------
# Values that a careless int32 cast, float parse or broadcast would wrap, overflow or crash on.
# ----------------------------------------------------------------------------------------

C16 = MLAConfig(num_heads=16, page_size=16, dtype="float32")


@pytest.mark.parametrize(
    "block_table, num_blocks, match",
    [
        ([[2**32 + 3]], 8, r"block_table\[0, 0\]=4294967299"),  # would wrap to block 3
        (np.array([[2**32 + 3]], np.int64), 8, r"block_table\[0, 0\]=4294967299"),
        ([[2**31]], None, r"block_table\[0, 0\]=2147483648"),  # named as given, not wrapped to -2147483648
        (np.array([[2**63]], np.uint64), 8, r"block_table\[0, 0\]=9223372036854775808"),  # would wrap to 0
        ([[2**64]], 8, r"block_table\[0, 0\]=18446744073709551616"),  # NumPy's object dtype
        ([[1], [5, -2**31 - 1]], None, r"block_table\[1, 1\]=-2147483649"),  # in a padding column too
    ],
)
def test_builder_block_ids_outside_int32_are_named_not_wrapped(block_table, num_blocks, match):
    seq_lens = [4] * len(block_table)
    with pytest.raises(ValueError, match="block ids must fit in int32, got " + match):
        mla_spec.build_decode_metadata(seq_lens=seq_lens, query_lens=[1] * len(seq_lens), block_table=block_table,
                                       config=C16, num_blocks=num_blocks)


@pytest.mark.parametrize("block_table", [[[1.0]], [[3.7]], np.array([[2.0]])])
def test_builder_float_block_ids_are_rejected(block_table):
    with pytest.raises(ValueError, match="block_table.* must hold integers"):
        mla_spec.build_decode_metadata(seq_lens=[4], query_lens=[1], block_table=block_table, config=C16, num_blocks=8)


def test_builder_int32_edge_block_ids_still_build():
    md = mla_spec.build_decode_metadata(seq_lens=[4, 4], query_lens=[1, 1], config=C16,
                                        block_table=np.array([[2**31 - 1], [3]], np.uint64))
    assert md.block_table.dtype == np.int32 and md.block_table[:, 0].tolist() == [2**31 - 1, 3]


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_wide_metadata_values_are_named_before_the_int32_cast(entry):
    """int64 metadata straight into an entry point: 2**32 + id must not run as block `id`."""
    bt64 = BATCH.metadata.block_table.astype(np.int64)
    bt64[0, 0] += 2**32
    q, kv, md, cfg = _case(md=dict(block_table=bt64))
    with pytest.raises(ValueError, match=rf"block_table values must fit in int32, got block_table\[0, 0\]={bt64[0, 0]}"):
        ENTRIES[entry](q, kv, md, cfg)


# --- merge_partials (mla_jax.dcp, and the float64 definition in mla_spec.dcp) ---

W, T, H, L = 2, 5, 4, 8
MERGE_BAD = {
    "lses [W,T,1]": ((W, T, H, L), (W, T, 1), "float32", r"lses.shape=\(2, 5, 1\)"),
    "lses [T,H]": ((W, T, H, L), (T, H), "float32", r"lses.shape=\(5, 4\)"),
    "outs 3-D": ((T, H, L), (T, H), "float32", r"outs.shape=\(5, 4, 8\)"),
    "outs T mismatch": ((W, T + 1, H, L), (W, T, H), "float32", r"outs.shape=\(2, 6, 4, 8\)"),
    "W = 0": ((0, T, H, L), (0, T, H), "float32", r"at least one shard.*outs.shape=\(0, 5, 4, 8\)"),
    "int outs": ((W, T, H, L), (W, T, H), "int32", "outs.dtype=int32"),
}


@pytest.mark.parametrize("merge", ["jax", "numpy"])
@pytest.mark.parametrize("case", list(MERGE_BAD))
def test_merge_partials_checks_shapes_and_dtypes(merge, case):
    out_shape, lse_shape, dtype, match = MERGE_BAD[case]
    outs, lses = np.zeros(out_shape, dtype), np.zeros(lse_shape, np.float32)
    if merge == "jax":
        outs, lses, fn = jnp.asarray(outs), jnp.asarray(lses), jdcp.merge_partials
    else:
        fn = sdcp.merge_partials
    with pytest.raises(ValueError, match=match):
        fn(outs, lses)


def test_merge_partials_still_merges_under_jit():
    rng = np.random.default_rng(0)
    outs = rng.standard_normal((W, T, H, L)).astype(np.float32)
    lses = rng.standard_normal((W, T, H)).astype(np.float32)
    lses[1, 0] = -np.inf  # an empty shard
    ref_out, ref_lse = sdcp.merge_partials(outs, lses)
    out, lse = jax.jit(jdcp.merge_partials)(jnp.asarray(outs), jnp.asarray(lses))
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"lses.shape=\(2, 5, 1\)"):
        jax.jit(jdcp.merge_partials)(jnp.asarray(outs), jnp.asarray(lses[..., :1]))


# --- DCP: per-shard lengths must be those of the interleaved layout ---

def _dcp_case(world_size, seq_lens=(1, 2, 3, 5, 40)):
    sc = Scenario("dcp", seq_lens=seq_lens, query_lens=(1,) * len(seq_lens), num_heads=4, page_size=16)
    batch = make_batch(sc, "float32", dcp_world_size=world_size)
    return batch, sdcp.shard_batch(batch.kv_cache, batch.metadata, batch.config, permute_blocks=True)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_validate_shards_takes_every_interleaved_sharding(world_size):
    batch, shards = _dcp_case(world_size)  # shard_batch validates its output
    sdcp.validate_shards(batch.config, shards.metadata, world_size=world_size,
                         num_blocks_local=shards.kv_cache.shape[1])
    assert (np.asarray(shards.metadata.seq_lens).sum(axis=0) == batch.metadata.seq_lens).all()


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("delta", [-2, -1, +1, +2])
def test_validate_shards_rejects_lengths_off_the_interleaved_layout(world_size, delta):
    """A shard cut short would give a finite wrong answer; a shard too long would read unfilled slots.
    The stacked metadata does not carry the global length, so lengths that are the interleaved
    layout of another length (e.g. the last shard one shorter: a request one token shorter) are
    valid; every other change is named."""
    batch, shards = _dcp_case(world_size)
    lens = np.asarray(shards.metadata.seq_lens)
    for s in range(world_size):
        bad = lens.copy()
        bad[s, 4] += delta  # request 4: 40 tokens
        # (max_seq_len kept an upper bound: test_validate_shards_refuses_max_seq_len_below_the_longest_shard)
        md = shards.metadata.replace(seq_lens=bad, max_seq_len=max(int(shards.metadata.max_seq_len), int(bad.max())))
        col = bad[:, 4]
        # interleaved <=> non-increasing over the shards, first and last within one token
        if (np.diff(col) <= 0).all() and col[0] - col[-1] <= 1:
            sdcp.validate_shards(batch.config, md, world_size=world_size, num_blocks_local=shards.kv_cache.shape[1])
            continue
        with pytest.raises(ValueError, match=rf"request 4 .*got metadata_shards.seq_lens\[:, 4\]="
                                             rf"{re.escape(str(col.tolist()))}.*expected"):
            sdcp.validate_shards(batch.config, md, world_size=world_size, num_blocks_local=shards.kv_cache.shape[1])


def test_dcp_entry_points_reject_off_layout_shards_and_run_the_valid_sharding():
    batch, shards = _dcp_case(2, seq_lens=(8, 64, 200, 930))
    lens = np.asarray(shards.metadata.seq_lens)  # [[4, 32, 100, 465], [4, 32, 100, 465]]
    shrunk, longer = lens.copy(), lens.copy()
    shrunk[1, 3] -= 100
    longer[1, 3] = lens[0, 3] + 1
    q, kv = torch.from_numpy(batch.q), torch.from_numpy(shards.kv_cache)
    for bad, shown in ((shrunk, "[465, 365]"), (longer, "[465, 466]")):
        md = shards.metadata.replace(seq_lens=bad)
        with pytest.raises(ValueError, match=re.escape(f"metadata_shards.seq_lens[:, 3]={shown}")):
            tdcp.dcp_mla_decode_local(q, kv, md, batch.config)
        # (mla_jax.dcp_mla_decode runs the same validate_shards; a 2-device mesh needs the XLA flag that
        # tests/test_dcp.py's subprocess sets, so it is not called here)
    out, lse = tdcp.dcp_mla_decode_local(q, kv, shards.metadata, batch.config)
    ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    np.testing.assert_allclose(out.double().numpy(), ref_out, atol=1e-4)
    np.testing.assert_allclose(lse.double().numpy(), ref_lse, atol=1e-4)


# --- scales used in float32: finite, > 0 and a normal float32 ---

FP8_BATCH, FP8_K_SCALE = make_fp8_batch(SCENARIOS["single_token"], "bfloat16")


def _fp8_entry(entry, k_scale):
    b = FP8_BATCH
    if entry == "numpy":
        return reference.mla_decode(b.q, b.kv_cache, b.metadata, b.config, k_scale=k_scale)
    if entry == "torch":
        return mla_torch.mla_decode(torch.from_numpy(b.q).bfloat16(), torch.from_numpy(b.kv_cache).to(torch.float8_e4m3fn),
                                    b.metadata, b.config, k_scale=k_scale)
    return mla_jax.mla_decode(jnp.asarray(b.q, jnp.bfloat16), jnp.asarray(b.kv_cache, jnp.float8_e4m3fn), b.metadata,
                              b.config, k_scale=k_scale, impl=entry.removeprefix("jax_"))


@pytest.mark.parametrize("entry", ["numpy", "torch", "jax_xla", "jax_pallas_triton"])
@pytest.mark.parametrize(
    "k_scale, shown",
    [(1e39, "1e+39"), (1e300, "1e+300"), (1e-60, "1e-60"), (np.float32(1e-40), "9.99994610111476e-41"),
     (np.array(1e39), "1e+39"), (10**400, "1" + "0" * 400)],
    ids=["1e39", "1e300", "1e-60", "subnormal-f32", "0d-f64-1e39", "int-10**400"],
)
def test_k_scale_outside_float32_normal_range_is_named(entry, k_scale, shown):
    """1e39 gave NaN out/lse in every impl, 1e-60 silently became 0."""
    with pytest.raises(ValueError, match=rf"k_scale must be finite, > 0 and a normal float32 .*got k_scale={re.escape(shown)}$"):
        _fp8_entry(entry, k_scale)


def test_k_scale_at_its_edges_is_taken():
    lo, hi = np.finfo(np.float32).tiny, K_SCALE_MAX
    for v in (float(lo), hi, np.float32(lo), np.float32(hi), FP8_K_SCALE):
        assert mla_spec.validate_k_scale(v, FP8_BATCH.config) == float(v)


def test_k_scale_max_keeps_the_largest_fp8_value_finite_in_float32():
    fp8_max = np.float32(float(jnp.finfo(jnp.float8_e4m3fn).max))
    assert fp8_max == 448
    with np.errstate(over="ignore"):
        assert np.isfinite(fp8_max * np.float32(K_SCALE_MAX))
        assert np.isinf(fp8_max * np.nextafter(np.float32(K_SCALE_MAX), np.float32(np.inf)))


@pytest.mark.parametrize("entry", ["numpy", "torch", "jax_xla", "jax_pallas_triton"])
@pytest.mark.parametrize(
    "k_scale, shown",
    [(1e36, "1e+36"), (float(np.finfo(np.float32).max), "3.4028234663852886e+38"), (np.float32(1e36), "9.999999616903162e+35"),
     (10**36, "1" + "0" * 36)],
    ids=["1e36", "float32-max", "f32-1e36", "int-10**36"],
)
def test_k_scale_that_overflows_the_largest_fp8_value_is_named(entry, k_scale, shown):
    """A normal float32 k_scale above float32 max / 448 passed, and 448 * k_scale was inf in float32: NaN out
    (1e36 gave NaN out in the torch reference and the JAX impls)."""
    with pytest.raises(ValueError, match=rf"k_scale must be <= 7.59559e\+35 \(float32 max / 448, .*got k_scale={re.escape(shown)}$"):
        _fp8_entry(entry, k_scale)


@pytest.mark.parametrize("scale, shown", [(1e300, "1e+300"), (1e39, "1e+39"), (1e-300, "1e-300"), (1e-39, "1e-39")])
def test_softmax_scale_outside_float32_normal_range_is_named(scale, shown):
    with pytest.raises(ValueError, match=rf"softmax_scale must be finite, > 0 and a normal float32 .*got "
                                         rf"softmax_scale={re.escape(shown)}$"):
        MLAConfig(num_heads=16, softmax_scale=scale)


@pytest.mark.parametrize("scale", [np.float32(0.1), np.float64(0.25), np.float16(0.5), 2, np.int64(3)])
def test_numpy_scalar_softmax_scale_is_taken_as_a_python_float(scale):
    cfg = MLAConfig(num_heads=16, softmax_scale=scale)
    assert type(cfg.softmax_scale) is float and cfg.softmax_scale == float(scale)
    assert cfg == MLAConfig(num_heads=16, softmax_scale=float(scale))  # one config, one jit cache entry


@pytest.mark.parametrize("scale", ["0.1", True, object(), [0.1]])
def test_non_number_softmax_scale_is_named(scale):
    with pytest.raises(ValueError, match="softmax_scale must be a finite float > 0, got softmax_scale="):
        MLAConfig(num_heads=16, softmax_scale=scale)


@pytest.mark.parametrize("slopes", ["ab", 1.0, [0.5, "x"], [None]])
def test_non_float_alibi_slopes_are_named(slopes):
    with pytest.raises(ValueError, match=rf"alibi_slopes must be a sequence of floats, got alibi_slopes={re.escape(repr(slopes))}"):
        MLAConfig(num_heads=16, alibi_slopes=slopes)


@pytest.mark.parametrize("slopes", [(0.5,), [np.float32(0.5)], np.array([0.25, 0.5])])
def test_float_alibi_slopes_still_get_the_seeds_error(slopes):
    with pytest.raises(NotImplementedError, match="alibi_slopes, sliding_window, logits_soft_cap"):
        MLAConfig(num_heads=16, alibi_slopes=slopes)


# --- metadata / config of the wrong type: a ValueError naming the argument, not an AttributeError ---

JAX_Q, JAX_KV = jnp.asarray(BATCH.q), jnp.asarray(BATCH.kv_cache)
WRONG_TYPES = [
    (None, BATCH.config, "metadata=NoneType"),
    ({"seq_lens": [8]}, BATCH.config, "metadata=dict"),
    (BATCH.metadata, None, "config=NoneType"),
    (BATCH.metadata, {"num_heads": 16}, "config=dict"),
]


@pytest.mark.parametrize("metadata, config, match", WRONG_TYPES)
def test_jax_and_numpy_entries_name_a_wrong_metadata_or_config_type(metadata, config, match):
    with pytest.raises(ValueError, match=match):
        mla_jax.mla_decode(JAX_Q, JAX_KV, metadata, config)
    with pytest.raises(ValueError, match=match):
        mla_jax.mla_decode(JAX_Q, JAX_KV, metadata, config, impl="pallas_triton")
    with pytest.raises(ValueError, match=match):
        reference.mla_decode(BATCH.q, BATCH.kv_cache, metadata, config)


@pytest.mark.parametrize("metadata, config, match", WRONG_TYPES)
def test_dcp_entries_name_a_wrong_metadata_or_config_type(metadata, config, match):
    match = match.replace("metadata=", "metadata_shards=")
    with pytest.raises(ValueError, match=match):
        jdcp.dcp_mla_decode(JAX_Q, JAX_KV[None], metadata, config, mesh=jdcp.make_dcp_mesh(1))
    with pytest.raises(ValueError, match=match):
        sdcp.validate_shards(config, metadata, world_size=1, num_blocks_local=NUM_BLOCKS)


def test_validate_shards_refuses_max_seq_len_below_the_longest_shard():
    """The stacked max_seq_len is an upper bound of every shard's length, on both stacks (validate_shards)."""
    config = mla_spec.MLAConfig(num_heads=16, page_size=16, dtype="float32", dcp_world_size=2)
    kv = np.zeros((8, 16, config.head_dim), np.float32)
    md = mla_spec.build_decode_metadata(seq_lens=[30, 7], query_lens=[1, 1], block_table=[[0, 1], [2]],
                                        config=config.replace(dcp_world_size=1), num_blocks=8)
    shards = mla_spec.dcp.shard_batch(kv, md, config)
    longest = int(np.asarray(shards.metadata.seq_lens).max())
    assert longest == 15
    mla_spec.dcp.validate_shards(config, shards.metadata, world_size=2, num_blocks_local=shards.kv_cache.shape[1])
    with pytest.raises(ValueError, match=re.escape(f"metadata_shards.max_seq_len=14 < {longest}")):
        mla_spec.dcp.validate_shards(config, shards.metadata.replace(max_seq_len=14), world_size=2,
                                     num_blocks_local=shards.kv_cache.shape[1])


# --- the float64 reference takes real float arrays only ---

@pytest.mark.parametrize(
    "q, kv, match",
    [
        (BATCH.q, np.nan_to_num(BATCH.kv_cache).astype(np.int32), r"kv_cache must have a float dtype, got kv_cache.dtype=int32"),
        (BATCH.q, BATCH.kv_cache > 0, r"kv_cache must have a float dtype, got kv_cache.dtype=bool"),
        (BATCH.q.astype(np.int64), BATCH.kv_cache, r"q must have a float dtype, got q.dtype=int64"),
        (BATCH.q.astype(np.complex64), BATCH.kv_cache, r"q must have a float dtype, got q.dtype=complex64"),
        ((BATCH.q_nope, BATCH.q_pe.astype(np.complex128)), BATCH.kv_cache,
         r"q_pe must have a float dtype, got q_pe.dtype=complex128"),
        (BATCH.q.astype(object), BATCH.kv_cache, r"q must have a float dtype, got q.dtype=object"),
    ],
    ids=["int cache", "bool cache", "int q", "complex q", "complex q_pe", "object q"],
)
def test_reference_refuses_non_float_arrays(q, kv, match):
    """An integer cache was run as is, and a complex q silently lost its imaginary part."""
    with pytest.raises(ValueError, match=match):
        reference.mla_decode(q, kv, BATCH.metadata, BATCH.config)


def test_reference_still_takes_every_float_dtype():
    for dtype in (np.float16, np.float32, jnp.bfloat16):
        out, _ = reference.mla_decode(BATCH.q.astype(dtype), BATCH.kv_cache.astype(dtype), BATCH.metadata, BATCH.config)
        assert out.dtype == np.float64 and np.isfinite(out).all()


# --- q as a (q_nope, q_pe) tuple with entries that are not arrays ---

Q_PARTS = {
    "numpy": (lambda q: reference.mla_decode(q, BATCH.kv_cache, BATCH.metadata, BATCH.config), lambda x: x),
    "torch": (lambda q: mla_torch.mla_decode(q, torch.from_numpy(BATCH.kv_cache), BATCH.metadata, BATCH.config),
              torch.from_numpy),
    "jax": (lambda q: mla_jax.mla_decode(q, JAX_KV, BATCH.metadata, BATCH.config), jnp.asarray),
}


@pytest.mark.parametrize("entry", list(Q_PARTS))
@pytest.mark.parametrize("bad, shown", [(None, "NoneType"), ("q_nope", "str")])
@pytest.mark.parametrize("slot", [0, 1])
def test_q_pair_entries_that_are_not_arrays_are_named(entry, bad, shown, slot):
    call, conv = Q_PARTS[entry]
    q = [conv(BATCH.q_nope), conv(BATCH.q_pe)]
    q[slot] = bad
    name = ("q_nope", "q_pe")[slot]
    with pytest.raises(ValueError, match=rf"got {name}={shown}$"):
        call(tuple(q))


# --- interpret= must be a bool (a truthy string turned interpret mode on) ---

JAX_MD = mla_jax.to_jax_metadata(BATCH.metadata)


def _mosaic():
    from mla_jax import pallas_mosaic_gpu

    return pallas_mosaic_gpu


INTERPRET_TAKERS = {
    "mla_decode pallas_triton": (lambda v: mla_jax.mla_decode(JAX_Q, JAX_KV, BATCH.metadata, BATCH.config,
                                                              impl="pallas_triton", interpret=v), "a bool or None"),
    "mla_decode xla": (lambda v: mla_jax.mla_decode(JAX_Q, JAX_KV, BATCH.metadata, BATCH.config, interpret=v),
                       "a bool or None"),
    "mla_decode pallas_mosaic_gpu": (
        lambda v: mla_jax.mla_decode(JAX_Q, JAX_KV, BATCH.metadata, BATCH.config, impl="pallas_mosaic_gpu",
                                     interpret=v), "a bool or None or a plgpu.InterpretGPUParams"),
    "pallas_triton.mla_decode": (lambda v: pallas_triton.mla_decode(JAX_Q, None, JAX_KV, JAX_MD, BATCH.config,
                                                                            interpret=v), "a bool"),
    "pallas_mosaic_gpu.mla_decode": (lambda v: _mosaic().mla_decode(JAX_Q, None, JAX_KV, JAX_MD, BATCH.config,
                                                                    interpret=v),
                                     "a bool or a plgpu.InterpretGPUParams"),
    "dcp_mla_decode": (lambda v: jdcp.dcp_mla_decode(JAX_Q, JAX_KV[None], BATCH.metadata, BATCH.config,
                                                     mesh=jdcp.make_dcp_mesh(1), impl="pallas_triton", interpret=v),
                       "a bool or None"),
}


@pytest.mark.parametrize("fn", list(INTERPRET_TAKERS))
@pytest.mark.parametrize("value", ["no", "False", 1, 0.0, np.bool_(True), [True]], ids=repr)
def test_interpret_must_be_a_bool(fn, value):
    call, expected = INTERPRET_TAKERS[fn]
    with pytest.raises(ValueError, match=rf"^interpret must be {re.escape(expected)}, got interpret={re.escape(repr(value))}$"):
        call(value)


def test_check_interpret_takes_bools_none_and_mosaic_params_where_asked():
    from mla_jax.api import check_interpret

    for v in (True, False):
        check_interpret(v)
    check_interpret(None, allow_none=True)
    check_interpret(_mosaic().plgpu.InterpretGPUParams(), allow_params=True)
    with pytest.raises(ValueError, match="interpret must be a bool, got interpret=None"):
        check_interpret(None)
    with pytest.raises(ValueError, match="interpret must be a bool, got interpret=InterpretGPUParams"):
        check_interpret(_mosaic().plgpu.InterpretGPUParams())


# --- a non-config as config: the kernels and helpers of both stacks ---

def _config_takers():
    from mla_torch import fa3

    q_t, kv_t = torch.from_numpy(BATCH.q), torch.from_numpy(BATCH.kv_cache)
    return {
        "pallas_triton.mla_decode": lambda c: pallas_triton.mla_decode(JAX_Q, None, JAX_KV, JAX_MD, c),
        "pallas_triton.unsupported_reason": lambda c: pallas_triton.unsupported_reason(c),
        "pallas_mosaic_gpu.mla_decode": lambda c: _mosaic().mla_decode(JAX_Q, None, JAX_KV, JAX_MD, c),
        "pallas_mosaic_gpu.unsupported_reason": lambda c: _mosaic().unsupported_reason(c),
        "mla_jax.unsupported_reason": lambda c: mla_jax.unsupported_reason("pallas_triton", c),
        "mla_jax.select_impl": lambda c: mla_jax.select_impl(c),
        "mla_jax.split_q": lambda c: mla_jax.split_q(JAX_Q, c),
        "mla_torch.unsupported_reason": lambda c: mla_torch.unsupported_reason("fa3", c),
        "mla_torch.select_impl": lambda c: mla_torch.select_impl(c),
        "mla_torch.split_q": lambda c: mla_torch.split_q(q_t, c),
        "fa3.unsupported_reason": lambda c: fa3.unsupported_reason(c),
        "FlashAttnMLAImpl.from_config": lambda c: fa3.FlashAttnMLAImpl.from_config(c, "cpu"),
        "FlashAttnMLAMetadataBuilder": lambda c: fa3.FlashAttnMLAMetadataBuilder(c, "cpu"),
        "FA3DecodeGraph": lambda c: fa3.FA3DecodeGraph(c, kv_t, max_num_reqs=1, max_num_tokens=1, max_blocks_per_req=1),
    }


CONFIG_TAKERS = _config_takers()


@pytest.mark.parametrize("fn", list(CONFIG_TAKERS))
@pytest.mark.parametrize("config, shown", [({"num_heads": 16}, "dict"), (None, "NoneType")])
def test_kernels_and_helpers_name_a_non_config(fn, config, shown):
    """These were AttributeErrors on the config's first field (or, for select_impl on a CPU, no error at all)."""
    with pytest.raises(ValueError, match=rf"^config must be an mla_spec.MLAConfig, got config={shown}$"):
        CONFIG_TAKERS[fn](config)


# --- metadata in NumPy views of any strides ---

def _reversed_view(a):
    """`a`'s values in a view with negative strides."""
    return a[::-1].copy()[::-1]


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_negative_stride_metadata_views_are_taken(entry):
    """torch.from_numpy refuses negative strides: mla_torch had refused such metadata, which the others take."""
    md = BATCH.metadata
    flipped = md.replace(**{name: _reversed_view(getattr(md, name)) for name in ("query_start_loc", "seq_lens",
                                                                                 "block_table")})
    assert all(s < 0 for s in flipped.block_table.strides[:1] + flipped.seq_lens.strides)
    out, lse = ENTRIES[entry](BATCH.q, BATCH.kv_cache, flipped, BATCH.config)
    want_out, want_lse = ENTRIES[entry](BATCH.q, BATCH.kv_cache, md, BATCH.config)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want_out))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(want_lse))
    if entry == "torch":
        t = mla_torch.to_torch_metadata(flipped, "cpu")
        assert t.block_table.tolist() == md.block_table.tolist()


# --- merge_attn_states (torch) checks what merge_partials (JAX) checks ---

MERGES = {
    "jax": (jdcp.merge_partials, jnp.asarray, "merge_partials"),
    "numpy": (sdcp.merge_partials, np.asarray, "merge_partials"),
    "torch": (tdcp.merge_attn_states, torch.from_numpy, "merge_attn_states"),
}


@pytest.mark.parametrize("case", list(MERGE_BAD))
def test_merge_attn_states_checks_shapes_and_dtypes_as_merge_partials(case):
    """Integer outs and lses had merged into truncated integers; W = 0 and unequal shapes ended in torch's errors."""
    out_shape, lse_shape, dtype, match = MERGE_BAD[case]
    outs, lses = torch.zeros(out_shape, dtype=getattr(torch, dtype)), torch.zeros(lse_shape)
    with pytest.raises(ValueError, match=match):
        tdcp.merge_attn_states(outs, lses)
    with pytest.raises(ValueError, match="merge_attn_states takes float lses, got lses.dtype=int64"):
        tdcp.merge_attn_states(torch.zeros(W, T, H, L), torch.zeros(W, T, H, dtype=torch.int64))


@pytest.mark.parametrize("merge", list(MERGES))
def test_merges_check_sequences_of_partials(merge):
    fn, conv, name = MERGES[merge]
    one_out, one_lse = conv(np.zeros((T, H, L), np.float32)), conv(np.zeros((T, H), np.float32))
    with pytest.raises(ValueError, match=rf"^{name} needs at least one shard \(W >= 1\), got an empty outs \(len\(outs\)=0\)$"):
        fn([], [])
    short_out, short_lse = conv(np.zeros((T - 1, H, L), np.float32)), conv(np.zeros((T - 1, H), np.float32))
    with pytest.raises(ValueError, match=re.escape(f"{name} takes W partials of one shape, got outs[1].shape="
                                                   f"{(T - 1, H, L)} != outs[0].shape={(T, H, L)}")):
        fn([one_out, short_out], [one_lse, short_lse])
    with pytest.raises(ValueError, match=re.escape(f"got lses[2].shape={(T - 1, H)} != lses[0].shape={(T, H)}")):
        fn([one_out] * 3, [one_lse, one_lse, short_lse])
    out, lse = fn([one_out, one_out], (one_lse, one_lse))  # the valid sequence still merges
    assert tuple(out.shape) == (T, H, L) and tuple(lse.shape) == (T, H)


@pytest.mark.parametrize("merge", ["jax", "torch"])
def test_merges_take_float_out_dtypes_by_name_and_name_the_rest(merge):
    """A string out_dtype had ended in torch's "Invalid device string"."""
    fn, conv, name = MERGES[merge]
    outs, lses = conv(np.zeros((W, T, H, L), np.float32)), conv(np.zeros((W, T, H), np.float32))
    for given in ("bfloat16", "float16"):
        out, _ = fn(outs, lses, out_dtype=given)
        assert mla_spec.dtype_name(out.dtype) == given
    int32 = torch.int32 if merge == "torch" else jnp.int32
    for bad, shown in (("int32", "'int32'"), ("nonsense", "'nonsense'"), (int32, "int32"), (5, "5")):
        with pytest.raises(ValueError, match=rf"^{name} takes a float out_dtype, got out_dtype={re.escape(shown)}$"):
            fn(outs, lses, out_dtype=bad)


# ----------------------------------------------------------------------------- converters, schedules, foreign arrays


def _wide(md, field, index, value):
    arr = np.asarray(getattr(md, field)).astype(np.int64)
    arr[index] = value
    return md.replace(**{field: arr})


@pytest.mark.parametrize("field,index", [("block_table", (0, 0)), ("seq_lens", (1,)), ("query_start_loc", (2,))])
def test_metadata_converters_refuse_values_the_int32_cast_would_wrap(field, index):
    bad = _wide(BATCH.metadata, field, index, 2**32 + 3)
    where = ", ".join(map(str, index))
    msg = re.escape(f"{field} values must fit in int32, got {field}[{where}]={2**32 + 3}")
    with pytest.raises(ValueError, match=msg):
        mla_jax.to_jax_metadata(bad)
    with pytest.raises(ValueError, match=msg):
        mla_torch.to_torch_metadata(bad, "cpu")
    with pytest.raises(ValueError, match=msg):  # (an int64 tensor: the same check on its values)
        mla_torch.to_torch_metadata(bad.replace(**{field: torch.from_numpy(getattr(bad, field))}), "cpu")
    # in range, the int64 arrays convert
    fine = _wide(BATCH.metadata, field, index, np.asarray(getattr(BATCH.metadata, field))[index])
    assert mla_jax.to_jax_metadata(fine).block_table.dtype == jnp.int32
    assert mla_torch.to_torch_metadata(fine, "cpu").block_table.dtype == torch.int32


def test_sparse_converters_refuse_values_the_int32_cast_would_wrap():
    md = mla_spec.SparseMetadata(np.array([[0, 5, -1], [2**32 + 7, 2, 3]], np.int64))
    msg = re.escape(f"indices values must fit in int32, got indices[1, 0]={2**32 + 7}")
    with pytest.raises(ValueError, match=msg):
        mla_jax.to_jax_sparse_metadata(md)
    with pytest.raises(ValueError, match=msg):
        mla_torch.to_torch_sparse_metadata(md, "cpu")


def test_a_prebuilt_schedule_of_other_lengths_is_refused_where_the_lengths_are_concrete():
    cfg = MLAConfig(num_heads=16, page_size=16, dtype="float32")
    table = [[3, 1], [0, 2, 4]]
    short = mla_spec.build_decode_metadata(seq_lens=[5, 10], query_lens=[1, 1], block_table=table, config=cfg,
                                           num_blocks=5)
    long = mla_spec.build_decode_metadata(seq_lens=[20, 40], query_lens=[1, 1], block_table=table, config=cfg,
                                          num_blocks=5)
    tuning = pallas_triton.TritonConfig(block_h=16, block_kv=16, num_parts=2)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 16, 576), dtype=np.float32))
    kv = jnp.asarray(rng.standard_normal((5, 16, 576), dtype=np.float32))
    stale = long.replace(scheduler_metadata=pallas_triton.with_schedule(short, cfg, tuning=tuning).scheduler_metadata)
    with pytest.raises(ValueError, match="work schedule built for other lengths"):
        mla_jax.mla_decode(q, kv, stale, cfg, impl="pallas_triton", tuning=tuning, interpret=True)
    # the schedule of these lengths runs, and matches the reference
    ahead = pallas_triton.with_schedule(mla_jax.to_jax_metadata(long), cfg, tuning=tuning)
    out, lse = mla_jax.mla_decode(q, kv, ahead, cfg, impl="pallas_triton", tuning=tuning, interpret=True)
    ref_out, ref_lse = reference.mla_decode(np.asarray(q), np.asarray(kv), long, cfg)
    np.testing.assert_allclose(np.asarray(out), ref_out, atol=1e-4)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, atol=1e-4)


def test_a_prebuilt_schedule_for_other_token_counts_is_refused():
    """with_schedule builds the combine's rows per token for num_tokens tokens: a call with another count refuses
    the schedule (ValueError naming both), and so does combine_slots given rows of another shape."""
    cfg = MLAConfig(num_heads=16, page_size=16, dtype="float32")
    md = mla_spec.build_decode_metadata(seq_lens=[20, 40], query_lens=[1, 1], block_table=[[3, 1], [0, 2, 4]],
                                        config=cfg, num_blocks=5)
    tuning = pallas_triton.TritonConfig(block_h=16, block_kv=16, num_parts=2)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 16, 576), dtype=np.float32))
    kv = jnp.asarray(rng.standard_normal((5, 16, 576), dtype=np.float32))
    ahead = pallas_triton.with_schedule(mla_jax.to_jax_metadata(md), cfg, num_tokens=4, tuning=tuning)
    assert ahead.scheduler_metadata.token_slots.shape == (4, 3)
    with pytest.raises(ValueError, match=re.escape("token_slots of shape (4, 3); the call has num_tokens=2")):
        mla_jax.mla_decode(q, kv, ahead, cfg, impl="pallas_triton", tuning=tuning, interpret=True)
    o_part, lse_part = jnp.zeros((3, 1, 16, 512)), jnp.zeros((3, 1, 16))
    with pytest.raises(ValueError, match=re.escape("token_slots must have shape (2, 3) (one row per token), got "
                                                   "token_slots.shape=(4, 3)")):
        combine.combine_slots(o_part, lse_part, jnp.asarray([0, 1, 3]), jnp.asarray([0, 1, 2]), jnp.float32,
                              num_tokens=2, token_slots=ahead.scheduler_metadata.token_slots, interpret=True)


def test_jax_entry_points_refuse_torch_tensors_naming_them():
    q, kv, md, cfg = _case()
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))
    msg = lambda name: re.escape(f"{name} must be a NumPy or JAX array, got {name}=torch.Tensor")
    with pytest.raises(ValueError, match=msg("q")):
        mla_jax.mla_decode(t(q), jnp.asarray(kv), md, cfg)
    with pytest.raises(ValueError, match=msg("kv_cache")):
        mla_jax.mla_decode(jnp.asarray(q), t(kv), md, cfg)
    with pytest.raises(ValueError, match=msg("block_table")):
        mla_jax.mla_decode(jnp.asarray(q), jnp.asarray(kv), md.replace(block_table=t(md.block_table)), cfg)
    cache = jnp.zeros((2, 16, 576), jnp.float32)
    with pytest.raises(ValueError, match=msg("slot_mapping")):
        mla_jax.write_kv(cache, jnp.ones((3, 512)), jnp.ones((3, 64)), torch.tensor([0, 5, 32]),
                         MLAConfig(num_heads=16, page_size=16, dtype="float32"))
    sparse_cfg = MLAConfig(num_heads=16, page_size=16, dtype="float32")
    indices = torch.tensor([[0, 5, -1], [32, 2, 3]], dtype=torch.int32)  # (32: outside the 2 x 16 slots)
    with pytest.raises(ValueError, match=msg("indices")):
        mla_jax.sparse_mla_decode(jnp.zeros((2, 16, 576)), jnp.zeros((2, 16, 576)), mla_spec.SparseMetadata(indices),
                                  sparse_cfg)


@pytest.mark.parametrize("impl", [["xla"], {"xla": 1}])
def test_jax_unhashable_impl_is_a_value_error(impl):
    q, kv, md, cfg = _case()
    with pytest.raises(ValueError, match="unknown impl="):
        mla_jax.mla_decode(jnp.asarray(q), jnp.asarray(kv), md, cfg, impl=impl)
    with pytest.raises(ValueError, match="unknown impl="):
        mla_jax.unsupported_reason(impl, cfg)


@pytest.mark.parametrize("k_scale", [0.0, -1.0, float("nan"), float("inf"), 1e-45, 2 * K_SCALE_MAX, True])
def test_quantizers_refuse_a_bad_k_scale(k_scale):
    x = np.array([1.0, -2.0, 3.0], np.float32)
    for quantize, arr in ((mla_spec.quantize_fp8, x), (mla_torch.quantize_fp8, torch.from_numpy(x)),
                          (mla_jax.quantize_fp8, jnp.asarray(x))):
        with pytest.raises(ValueError, match="k_scale"):
            quantize(arr, k_scale)


@pytest.mark.parametrize("amax,match", [(float("nan"), "amax must be finite"), (-3.0, "amax must be finite"),
                                        (float("inf"), "amax must be finite"), (1e300, "amax=1e\\+300 gives no"),
                                        (1e-40, "amax=1e-40 gives no")])
def test_fp8_k_scale_refuses_an_amax_without_a_usable_scale(amax, match):
    with pytest.raises(ValueError, match=match):
        mla_spec.fp8_k_scale(amax)
    assert mla_spec.fp8_k_scale(0.0) == 1.0 and mla_spec.fp8_k_scale(448.0) == 1.0


def test_shard_batch_checks_the_cache_against_the_config():
    cfg1 = MLAConfig(num_heads=16, page_size=16, dtype="float32")
    cfg2 = cfg1.replace(dcp_world_size=2)
    md = mla_spec.build_decode_metadata(seq_lens=[20, 40], query_lens=[1, 1], block_table=[[3, 1], [0, 2, 4]],
                                        config=cfg1, num_blocks=5)
    kv = np.zeros((5, 16, 576), np.float32)
    for bad in (np.zeros((5, 32, 576), np.float32), kv[..., :100], kv[0], kv[:, :8]):
        with pytest.raises(ValueError, match=re.escape(f"got kv_cache.shape={bad.shape}")):
            sdcp.shard_batch(bad, md, cfg2)
    with pytest.raises(ValueError, match="got kv_cache.dtype=int32"):
        sdcp.shard_batch(kv.astype(np.int32), md, cfg2)
    assert sdcp.shard_batch(kv, md, cfg2).kv_cache.shape == (2, 4, 16, 576)


@pytest.mark.parametrize("world_size", [-1, 0, True, 2.0, None])
def test_make_dcp_mesh_refuses_a_bad_world_size(world_size):
    with pytest.raises(ValueError, match=re.escape(f"world_size must be an int >= 1, got world_size={world_size!r}")):
        jdcp.make_dcp_mesh(world_size)


def test_max_query_len_above_the_decode_threshold_is_refused():
    md = BATCH.metadata.replace(max_query_len=2**20, max_seq_len=2**20)
    with pytest.raises(ValueError, match=re.escape(f"max_query_len=1048576 > reorder_batch_threshold="
                                                   f"{BATCH.config.reorder_batch_threshold}")):
        md.validate(BATCH.config, num_blocks=NUM_BLOCKS)
    with pytest.raises(ValueError, match="max_query_len=1048576"):  # (shapes only: under jit too)
        md.validate(BATCH.config, check_values=False)


def test_merges_turn_a_positive_infinite_lse_into_a_nan_row():
    """(documented: no decode returns lse +inf; the row comes out NaN, never finite)"""
    outs = np.ones((2, 3, 4, 8), np.float32)
    lses = np.zeros((2, 3, 4), np.float32)
    lses[0, 0, 0] = np.inf
    for out, lse in (mla_torch.merge_attn_states(torch.from_numpy(outs), torch.from_numpy(lses)),
                     mla_jax.merge_partials(outs, lses), sdcp.merge_partials(outs, lses)):
        out, lse = np.asarray(out), np.asarray(lse)
        assert np.isnan(out[0, 0]).all() and lse[0, 0] == np.inf
        assert np.isfinite(out[1:]).all() and np.isfinite(lse[1:]).all()


# --- the serving loop's helpers name a wrong argument (they had raised AttributeError / TypeError) ---

S_MD = mla_spec.build_decode_metadata(seq_lens=[20, 40], query_lens=[1, 2], block_table=[[3, 1], [0, 2, 4]],
                                      config=C16, num_blocks=5)
S_BUCKET = mla_spec.Bucket(num_reqs=2, num_tokens=3, max_blocks=3, max_seq_len=64, max_query_len=2)
SERVING_BAD = {
    "pad_to_bucket md None": (lambda: mla_spec.pad_to_bucket(None, S_BUCKET, C16),
                              "md must be an mla_spec.DecodeMetadata, got md=NoneType"),
    "pad_to_bucket config None": (lambda: mla_spec.pad_to_bucket(S_MD, S_BUCKET, None),
                                  "config must be an mla_spec.MLAConfig, got config=NoneType"),
    "smallest_bucket md None": (lambda: mla_spec.smallest_bucket([S_BUCKET], None),
                                "md must be an mla_spec.DecodeMetadata, got md=NoneType"),
    "smallest_bucket md list seq_lens": (lambda: mla_spec.smallest_bucket([S_BUCKET], S_MD.replace(seq_lens=[20, 40])),
                                         "seq_lens must be an array, got seq_lens=list"),
    "smallest_bucket no request": (
        lambda: mla_spec.smallest_bucket([S_BUCKET], S_MD.replace(seq_lens=np.zeros(0, np.int32),
                                                                  query_start_loc=np.zeros(1, np.int32))),
        re.escape("need at least one request, got seq_lens.shape=(0,)")),
    "smallest_bucket buckets None": (lambda: mla_spec.smallest_bucket(None, S_MD),
                                     "buckets must be a non-empty sequence of mla_spec.Bucket, got buckets=None"),
    "smallest_bucket buckets empty": (lambda: mla_spec.smallest_bucket([], S_MD),
                                      re.escape("buckets must be a non-empty sequence of mla_spec.Bucket, got buckets=[]")),
    "smallest_bucket one Bucket": (lambda: mla_spec.smallest_bucket(S_BUCKET, S_MD),
                                   "buckets must be a non-empty sequence of mla_spec.Bucket, got buckets=Bucket"),
    "smallest_bucket int entry": (lambda: mla_spec.smallest_bucket([S_BUCKET, 3], S_MD),
                                  re.escape("got buckets[1]=int")),
}


@pytest.mark.parametrize("case", list(SERVING_BAD))
def test_serving_helpers_name_a_wrong_argument(case):
    call, match = SERVING_BAD[case]
    with pytest.raises(ValueError, match=match):
        call()


def test_serving_helpers_still_pick_and_pad():
    assert mla_spec.smallest_bucket((S_BUCKET,), S_MD) == S_BUCKET
    assert mla_spec.pad_to_bucket(S_MD, S_BUCKET, C16).padded


# --- the builders: ragged rows, bools among ints ---

@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(seq_lens=[20], query_lens=[1], block_table=[[0, [1]]]),
         r"block_table\[0\] must be a 1-D integer array, got a list NumPy cannot make one array of"),
        (dict(seq_lens=[20, [4]], query_lens=[1, 1], block_table=[[0, 1], [2]]),
         r"seq_lens must be a 1-D integer array, got a list NumPy cannot make one array of"),
        (dict(seq_lens=[20, True], query_lens=[1, 1], block_table=[[0, 1], [2]]),
         r"seq_lens must hold integers, got seq_lens\[1\]=True \(a bool\)"),
        (dict(seq_lens=[20, 4], query_lens=(1, np.True_), block_table=[[0, 1], [2]]),
         r"query_lens must hold integers, got query_lens\[1\]=np.True_ \(a bool\)"),
        (dict(seq_lens=[20, 4], query_lens=[1, 1], block_table=[[0, 1], [2, False]]),
         r"block_table must hold integers, got block_table\[1, 1\]=False \(a bool\)"),
    ],
    ids=["ragged block_table row", "ragged seq_lens", "bool seq_len", "numpy bool q_len", "bool block id"],
)
def test_builder_refuses_ragged_rows_and_bools_among_ints(kw, match):
    """NumPy made [20, True] the int array [20, 1] (a seq_len of 1), and a ragged row ended in NumPy's own message."""
    with pytest.raises(ValueError, match=match):
        mla_spec.build_decode_metadata(config=C16, **kw)


@pytest.mark.parametrize(
    "indices, topk_length, match",
    [([[True, 1]], None, r"indices must hold integers, got indices\[0, 0\]=True \(a bool\)"),
     ([[3, 1], [0, 2]], [2, True], r"topk_length must hold integers, got topk_length\[1\]=True \(a bool\)")],
)
def test_sparse_builder_refuses_bools_among_ints(indices, topk_length, match):
    with pytest.raises(ValueError, match=match):
        mla_spec.build_sparse_metadata(indices, topk_length, config=C16)


def test_split_decodes_and_prefills_refuses_q_len_0():
    """A scheduled request has a new token; padding requests come from pad_to_bucket, after the split. q_len 0 had
    been counted as a decode."""
    with pytest.raises(ValueError, match=r"query_lens must be >= 1 \(each request needs q_len >= 1\), "
                                         r"got query_lens\[1\]=0"):
        mla_spec.split_decodes_and_prefills([1, 0], C16)
    assert mla_spec.split_decodes_and_prefills([1, 600, 2], C16).num_decodes == 2


# --- slot mapping and the fp8_ds_mla quantizer ---

@pytest.mark.parametrize(
    "slot_mapping, match",
    [(np.array([[0, 40]]), r"slot_mapping must be 1-D \[T\], got slot_mapping.shape=\(1, 2\)"),
     (np.array([0.5, 1.7]), "slot_mapping must hold integers, got slot_mapping.dtype=float64"),
     (np.array([True, False]), "slot_mapping must hold integers, got slot_mapping.dtype=bool")],
)
def test_validate_slot_mapping_refuses_other_ranks_and_dtypes(slot_mapping, match):
    with pytest.raises(ValueError, match=match):
        mla_spec.validate_slot_mapping(slot_mapping, 32)
    mla_spec.validate_slot_mapping([0, 31, -1], 32)


@pytest.mark.parametrize("kv", [np.full((1, 576), 3), np.zeros((1, 576), np.complex64), np.zeros((1, 576), bool)],
                         ids=["int64", "complex64", "bool"])
def test_quantize_sparse_fp8_refuses_non_real_float_input(kv):
    """Complex input lost its imaginary part (a ComplexWarning only); integers were quantized as floats. The torch
    version refuses both."""
    with pytest.raises(ValueError, match=rf"kv must have a float dtype, got kv.dtype={kv.dtype}"):
        mla_spec.quantize_sparse_fp8(kv)
    assert mla_spec.quantize_sparse_fp8(kv.real.astype(np.float32)).shape == (1, 656)


# --- torch: meta metadata, unsigned metadata, split_q / quantize_fp8 on other inputs, DCP and merge arguments ---

T_Q, T_KV = torch.from_numpy(BATCH.q), torch.from_numpy(BATCH.kv_cache)


@pytest.mark.parametrize("field", ["query_start_loc", "seq_lens", "block_table"])
def test_torch_metadata_on_the_meta_device_is_named(field):
    """torch's "Cannot copy out of meta tensor; no data!" (a NotImplementedError) had come from the host copy."""
    md = BATCH.metadata.replace(**{field: torch.from_numpy(getattr(BATCH.metadata, field)).to("meta")})
    with pytest.raises(ValueError, match=rf"^{field} must hold data \(a CPU or GPU tensor\), got a tensor on "
                                         r"device='meta'$"):
        mla_torch.mla_decode(T_Q, T_KV, md, BATCH.config)


def test_torch_q_and_kv_cache_on_two_devices_are_named():
    """mla_torch.api.check_one_device (the meta device stands in for a second one, which tensor_parts refuses
    first in a decode call)."""
    from mla_torch import api

    with pytest.raises(ValueError, match=r"^q and kv_cache must be on one device, got q_nope.device='cpu', "
                                         r"kv_cache.device='meta'$"):
        api.check_one_device((torch.zeros(1), torch.zeros(1)), torch.zeros(1, device="meta"))
    with pytest.raises(ValueError, match=r"^q and kv_cache must be on one device, got q.device='meta', "
                                         r"kv_cache.device='cpu'$"):
        api.check_one_device((torch.zeros(1, device="meta"),), torch.zeros(1))


def test_torch_sparse_indices_on_the_meta_device_are_named():
    idx = torch.zeros(BATCH.q.shape[0], 4, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^indices must hold data \(a CPU or GPU tensor\), got a tensor on "
                                         r"device='meta'$"):
        mla_torch.sparse_mla_decode(T_Q, T_KV, mla_spec.SparseMetadata(idx.to("meta")), BATCH.config)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_torch_unsigned_metadata_is_taken_and_range_checked_as_numpy_unsigned(dtype):
    """torch.uint16/32/64 had been refused as "must have an integer dtype", where NumPy's are taken (and
    range-checked before the int32 cast). They are taken here too, with the same checks."""
    md = BATCH.metadata
    unsigned = md.replace(**{f: torch.from_numpy(getattr(md, f).astype(np.int64)).to(dtype)
                             for f in ("query_start_loc", "seq_lens", "block_table")})
    want = mla_torch.mla_decode(T_Q, T_KV, md, BATCH.config)
    got = mla_torch.mla_decode(T_Q, T_KV, unsigned, BATCH.config)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if dtype != torch.uint16:
        bt = md.block_table.astype(np.int64)
        bt[0, 0] = 2**31 + 5
        with pytest.raises(ValueError, match=r"block_table values must fit in int32, got block_table\[0, 0\]=2147483653"):
            mla_torch.mla_decode(T_Q, T_KV, md.replace(block_table=torch.from_numpy(bt).to(dtype)), BATCH.config)
    q2, kv2 = torch.zeros(2, 16, 576), torch.zeros(2, 16, 576)
    idx = torch.tensor([[0, 5], [32, 2]]).to(dtype)
    with pytest.raises(ValueError, match=r"indices values must be -1 .*got indices\[1, 0\]=32"):
        mla_torch.sparse_mla_decode(q2, kv2, mla_spec.SparseMetadata(idx), C16)


def test_torch_split_q_and_quantize_fp8_name_other_inputs():
    with pytest.raises(ValueError, match="^q must be a torch.Tensor, got q=ndarray$"):
        mla_torch.split_q(np.zeros((1, 16, 576), np.float32), C16)
    with pytest.raises(ValueError, match=re.escape("q width must be kv_lora_rank + qk_rope_head_dim = 576, "
                                                   "got q.shape=(1, 16, 600)")):
        mla_torch.split_q(torch.zeros(1, 16, 600), C16)
    with pytest.raises(ValueError, match=r"x must be a torch.Tensor .*got x=ndarray$"):
        mla_torch.quantize_fp8(np.ones(3, np.float32), 1.0)
    q_nope, q_pe = mla_torch.split_q(torch.zeros(1, 16, 576), C16)
    assert q_nope.shape[-1] == 512 and q_pe.shape[-1] == 64


@pytest.mark.parametrize(
    "shards, match",
    [(None, "kv_cache_shards must be a tensor or a sequence of W caches, got NoneType$"),
     (torch.tensor(1.0), "kv_cache_shards must be a tensor or a sequence of W caches, got a 0-d tensor$"),
     ("first-and-None", r"kv_cache_shards must be a tensor or a sequence of W caches \(torch tensors\), got "
                        r"kv_cache_shards\[1\]=NoneType$")],
    ids=["None", "0-d tensor", "None shard"],
)
def test_torch_dcp_names_cache_shards_that_are_not_tensors(shards, match):
    batch, sh = _dcp_case(2)
    if isinstance(shards, str):
        shards = [torch.from_numpy(sh.kv_cache[0]), None]
    with pytest.raises(ValueError, match=match):
        tdcp.dcp_mla_decode_local(torch.from_numpy(batch.q), shards, sh.metadata, batch.config)
    with pytest.raises(ValueError, match=r"^metadata_shards.seq_lens must hold data \(a CPU or GPU tensor\)"):
        tdcp.dcp_mla_decode_local(torch.from_numpy(batch.q), torch.from_numpy(sh.kv_cache),
                                  sh.metadata.replace(seq_lens=torch.from_numpy(sh.metadata.seq_lens).to("meta")),
                                  batch.config)
    out, _ = tdcp.dcp_mla_decode_local(torch.from_numpy(batch.q), [torch.from_numpy(x) for x in sh.kv_cache],
                                       sh.metadata, batch.config)
    assert torch.isfinite(out).all()


def test_merge_attn_states_names_partials_on_two_devices():
    """torch's "Tensor on device cpu is not on the expected device meta!" had come from inside the merge (outs on
    cuda and lses on the CPU, on a GPU machine). The comparison is of the tensors' devices: no sync."""
    with pytest.raises(ValueError, match=r"^merge_attn_states takes partials on one device, got outs.device='cpu', "
                                         r"lses.device='meta'$"):
        tdcp.merge_attn_states(torch.zeros(W, T, H, L), torch.zeros(W, T, H, device="meta"))
    with pytest.raises(ValueError, match=r"got outs\[0\].device='cpu', outs\[1\].device='meta'$"):
        tdcp.merge_attn_states([torch.zeros(T, H, L), torch.zeros(T, H, L, device="meta")], torch.zeros(W, T, H))


def test_bucket_graphs_name_a_wrong_argument():
    from mla_torch.fa3 import BucketGraphs

    cfg, kvb = MLAConfig(num_heads=16, page_size=16), torch.zeros(4, 16, 576, dtype=torch.bfloat16)
    one = [mla_spec.Bucket(1, 1, 1, 16)]
    with pytest.raises(ValueError, match="^config must be an mla_spec.MLAConfig, got config=NoneType$"):
        BucketGraphs(None, kvb, one)
    with pytest.raises(ValueError, match="^buckets must be a non-empty sequence of mla_spec.Bucket, got buckets=None$"):
        BucketGraphs(cfg, kvb, None)
    with pytest.raises(ValueError, match="^kv_cache must be a torch.Tensor, got kv_cache=ndarray$"):
        BucketGraphs(cfg, np.zeros((4, 16, 576), np.float32), one)


def test_fa3_host_copy_names_meta_metadata():
    """FA3's builder and graph read metadata through cpu_int32, whose host copy of a meta tensor had raised torch's
    NotImplementedError."""
    from mla_torch.fa3.metadata import cpu_int32

    with pytest.raises(ValueError, match=r"^seq_lens must hold data \(a CPU or GPU tensor\), got a tensor on "
                                         r"device='meta'$"):
        cpu_int32("seq_lens", torch.zeros(2, dtype=torch.int32, device="meta"))
    assert cpu_int32("seq_lens", torch.ones(2, dtype=torch.int64)).tolist() == [1, 1]


# --- JAX: with_schedule, select_impl, split_q, merge_partials, tuning ---

@pytest.mark.parametrize(
    "call, match",
    [(lambda: pallas_triton.with_schedule(None, C16), "^metadata must be an mla_spec.DecodeMetadata, got metadata=NoneType$"),
     (lambda: pallas_triton.with_schedule(S_MD, None), "^config must be an mla_spec.MLAConfig, got config=NoneType$"),
     (lambda: pallas_triton.with_schedule(S_MD.replace(seq_lens=[20, 40]), C16),
      "^seq_lens must be an array, got seq_lens=list$"),
     (lambda: pallas_triton.with_schedule(S_MD.replace(block_table=S_MD.block_table[0]), C16),
      r"^block_table must be 2-D \[num_reqs, max_blocks\]")],
    ids=["metadata None", "config None", "list seq_lens", "1-D block_table"],
)
def test_with_schedule_names_a_wrong_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_with_schedule_still_builds_eagerly_and_under_jit():
    assert pallas_triton.with_schedule(S_MD, C16).scheduler_metadata is not None
    jm = mla_jax.to_jax_metadata(S_MD)
    assert jax.jit(lambda m: pallas_triton.with_schedule(m, C16))(jm).scheduler_metadata is not None


def test_jax_select_impl_refuses_a_device_that_is_not_a_jax_device():
    with pytest.raises(ValueError, match="^device must be a jax.Device or None, got device='cpu'$"):
        mla_jax.select_impl(C16, device="cpu")
    assert mla_jax.select_impl(C16, device=jax.devices()[0])[0] in mla_jax.IMPLS
    for impl in mla_jax.IMPLS:  # (a platform name read as a device gave a reason, not an error)
        with pytest.raises(ValueError, match="^device must be a jax.Device or None, got device='cpu'$"):
            mla_jax.unsupported_reason(impl, C16, "cpu")
        with pytest.raises(ValueError, match="^device must be a jax.Device or None, got device='cpu'$"):
            mla_jax.sparse_unsupported_reason(impl, C16, "cpu")


def test_jax_split_q_checks_the_packed_width():
    """A q 600 wide had split into q_nope [.., 512] and a q_pe of 88 columns."""
    with pytest.raises(ValueError, match=re.escape("q width must be kv_lora_rank + qk_rope_head_dim = 576, "
                                                   "got q.shape=(1, 16, 600)")):
        mla_jax.split_q(jnp.zeros((1, 16, 600)), C16)
    with pytest.raises(ValueError, match="^q must be an array, got q=list$"):
        mla_jax.split_q([[1.0]], C16)


def test_jax_merge_partials_names_non_arrays_and_torch_out_dtypes():
    with pytest.raises(ValueError, match="^merge_partials takes arrays, got outs=NoneType$"):
        mla_jax.merge_partials(None, None)
    with pytest.raises(ValueError, match="^merge_partials takes arrays, got lses=str$"):
        mla_jax.merge_partials(jnp.zeros((W, T, H, L)), "lses")
    with pytest.raises(ValueError, match=r"^merge_partials takes a NumPy or JAX float out_dtype \(or its name\), got "
                                         r"out_dtype=torch.float32 \(a torch dtype\)$"):
        mla_jax.merge_partials(jnp.zeros((W, T, H, L)), jnp.zeros((W, T, H)), out_dtype=torch.float32)


def test_tuning_the_impl_does_not_take_is_refused():
    """impl="xla" had ignored a tuning; TritonConfig had taken num_warps=4.0."""
    with pytest.raises(ValueError, match=r"^the xla impl takes no tuning \(the Pallas kernels do\), got tuning=\{'a': 1\}$"):
        mla_jax.mla_decode(JAX_Q, JAX_KV, BATCH.metadata, BATCH.config, impl="xla", tuning={"a": 1})
    with pytest.raises(ValueError, match=r"the xla impl takes no tuning"):
        mla_jax.mla_decode(JAX_Q, JAX_KV, BATCH.metadata, BATCH.config, impl="xla",
                           tuning=pallas_triton.TritonConfig())
    with pytest.raises(ValueError, match=r"^num_warps must be one of 1, 2, 4, 8, 16, got num_warps=4.0$"):
        pallas_triton.TritonConfig(num_warps=4.0)
    assert pallas_triton.TritonConfig(num_warps=8).num_warps == 8


def _two_request_batch():
    cfg = MLAConfig(num_heads=16, page_size=16, dtype="float32")
    md = mla_spec.build_decode_metadata(seq_lens=[20, 40], query_lens=[1, 1], block_table=[[3, 1], [0, 2, 4]],
                                        config=cfg, num_blocks=5)
    rng = np.random.default_rng(0)
    return cfg, md, rng.standard_normal((2, 16, 576), dtype=np.float32), rng.standard_normal((5, 16, 576),
                                                                                             dtype=np.float32)


def test_dcp_block_ids_outside_int32_are_named_not_wrapped():
    """A stacked block table of int64 ids past int32 (2**32 + k would run as block k) and a float one (truncated
    into ids) are refused by validate_shards and the DCP entry points that call it, naming the entry."""
    cfg, md, q, kv = _two_request_batch()
    cfg2 = cfg.replace(dcp_world_size=2)
    sh = sdcp.shard_batch(kv, md, cfg2)
    sdcp.validate_shards(cfg2, sh.metadata, world_size=2, num_blocks_local=4)  # the valid sharding
    bt = sh.metadata.block_table.astype(np.int64)
    bt[0, 1, 0] = 2**32 + int(bt[0, 1, 1])
    wrapped = sh.metadata.replace(block_table=bt)
    shown = re.escape(f"metadata_shards.block_table[0, 1, 0]={2**32 + int(bt[0, 1, 1])}")
    with pytest.raises(ValueError, match=shown):
        sdcp.validate_shards(cfg2, wrapped, world_size=2, num_blocks_local=4)
    with pytest.raises(ValueError, match=shown):
        tdcp.dcp_mla_decode_local(torch.from_numpy(q), torch.from_numpy(sh.kv_cache), wrapped, cfg2)
    with pytest.raises(ValueError, match="metadata_shards.block_table.dtype=float64"):
        sdcp.validate_shards(cfg2, sh.metadata.replace(block_table=sh.metadata.block_table + 0.5), world_size=2,
                             num_blocks_local=4)


@pytest.mark.parametrize("convert", [mla_jax.to_jax_metadata, lambda md: mla_torch.to_torch_metadata(md, "cpu")])
def test_metadata_converters_refuse_non_integer_arrays_and_non_metadata(convert):
    """Float lengths would be truncated (20.9 -> 20) and bools taken as block ids 0 / 1 by the int32 cast."""
    _, md, _, _ = _two_request_batch()
    with pytest.raises(ValueError, match="got seq_lens.dtype=float64"):
        convert(md.replace(seq_lens=np.array([20.9, 40.7])))
    with pytest.raises(ValueError, match="got block_table.dtype=bool"):
        convert(md.replace(block_table=md.block_table.astype(bool)))
    with pytest.raises(ValueError, match="got metadata=NoneType"):
        convert(None)
    assert np.asarray(convert(md).seq_lens).tolist() == [20, 40]


def test_unchecked_write_kv_refuses_an_int64_slot_that_would_wrap():
    """check_values=False reads no slot's range, but an int64 slot past int32 would wrap at the int32 cast into a
    live slot (2**32 + 3 into 3): refused, naming it; an int64 slot inside int32 still writes."""
    cfg = MLAConfig(num_heads=16, page_size=16, dtype="float32")
    with pytest.raises(ValueError, match=re.escape(f"slot_mapping[1]={2**32 + 3}")):
        mla_jax.write_kv(jnp.zeros((2, 16, 576)), jnp.ones((3, 512)), jnp.ones((3, 64)),
                         np.array([0, 2**32 + 3, -1], np.int64), cfg, check_values=False)
    cache = mla_jax.write_kv(jnp.zeros((2, 16, 576)), jnp.ones((3, 512)), jnp.ones((3, 64)),
                             np.array([0, 3, -1], np.int64), cfg, check_values=False)
    assert float(cache[0, 3, 0]) == 1.0 and float(cache[0, 2, 0]) == 0.0
