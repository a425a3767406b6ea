"""The split-KV combine (mla_jax.combine): the Pallas Triton kernel, in interpret mode on the CPU,
against its jnp formula, and its lowering for an abstract H200. Both Pallas decode kernels use it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mla_jax.combine import combine, combine_ref
from parity.h200 import lower_for_h200


def _partials(num_splits, num_tokens, num_heads, lora=512, seed=0):
    rng = np.random.default_rng(seed)
    o = rng.standard_normal((num_splits, num_tokens, num_heads, lora)).astype(np.float32)
    lse = (3 * rng.standard_normal((num_splits, num_tokens, num_heads))).astype(np.float32)
    lse[-1, :, ::2] = -np.inf  # an empty last split for every other head (its o is garbage: NaN)
    o[-1, :, ::2] = np.nan
    if num_splits > 1:
        lse[:, 0, 0] = -np.inf  # a row no split saw: out 0, lse -inf
    return jnp.asarray(o), jnp.asarray(lse)


@pytest.mark.parametrize("num_splits, num_tokens, num_heads", [(2, 3, 16), (3, 2, 20), (16, 4, 128), (128, 1, 16),
                                                                (5, 1, 8), (1, 2, 16)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_matches_formula(num_splits, num_tokens, num_heads, dtype):
    o, lse = _partials(num_splits, num_tokens, num_heads)
    out, lse_out = combine(o, lse, dtype, interpret=True)
    ref_out, ref_lse = combine_ref(o, lse, dtype)
    assert out.dtype == dtype and out.shape == (num_tokens, num_heads, 512) and lse_out.shape == (num_tokens, num_heads)
    assert not np.isnan(np.asarray(out, np.float32)).any(), "an empty split's NaN leaked"
    tol = 1e-5 if dtype == jnp.float32 else 8e-3  # bf16: the two sums may round to neighbouring values
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref_out, np.float32), rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.isneginf(lse_out), np.isneginf(ref_lse))
    finite = np.isfinite(np.asarray(ref_lse))
    np.testing.assert_allclose(np.asarray(lse_out)[finite], np.asarray(ref_lse)[finite], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_splits", [2, 5])
def test_a_nan_split_gives_nan_in_that_row_only(num_splits):
    """A split whose lse is NaN (a non-finite q entry of that head): that row's out and lse are NaN, never a
    plausible-looking 0; the other rows as without it. The kernel and the formula alike."""
    o, lse = _partials(num_splits, 2, 16)
    o, lse = o.at[0, 1, 5].set(jnp.nan), lse.at[0, 1, 5].set(jnp.nan)
    for out, lse_out in (combine(o, lse, jnp.float32, interpret=True), combine_ref(o, lse, jnp.float32)):
        out, lse_out = np.asarray(out), np.asarray(lse_out)
        assert np.isnan(out[1, 5]).all() and np.isnan(lse_out[1, 5])
        keep = np.ones((2, 16), bool)
        keep[1, 5] = False
        assert not np.isnan(out[keep]).any()


@pytest.mark.parametrize("num_splits, num_heads", [(2, 16), (5, 20)])
def test_col_order_gathers_the_output_columns(num_splits, num_heads):
    """col_order: the kernel reads partial column col_order[j] for output column j, the formula gathers its
    output: the same as combining and then gathering (pv_registers's PV_UNPERM order, and a permutation across the
    64-column blocks)."""
    from mla_jax.pallas_mosaic_gpu import PV_UNPERM

    o, lse = _partials(num_splits, 3, num_heads)
    ref_out, ref_lse = combine_ref(o, lse, jnp.float32)
    orders = [PV_UNPERM, np.random.default_rng(2).permutation(512)]
    for order in orders:
        for out, lse_out in (combine(o, lse, jnp.float32, interpret=True, col_order=jnp.asarray(order)),
                             combine_ref(o, lse, jnp.float32, col_order=order)):
            np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out)[..., order], rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(np.asarray(lse_out), np.asarray(ref_lse))
    with pytest.raises(ValueError, match=r"col_order must have shape \(512,\).*\(64,\)"):
        combine(o, lse, jnp.float32, interpret=True, col_order=jnp.arange(64))


def test_one_split_is_the_identity():
    rng = np.random.default_rng(1)
    o = jnp.asarray(rng.standard_normal((1, 2, 16, 512)), jnp.float32)
    lse = jnp.asarray(rng.standard_normal((1, 2, 16)), jnp.float32)
    out, lse_out = combine(o, lse, jnp.float32, interpret=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(o[0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lse_out), np.asarray(lse[0]), rtol=1e-6)


def test_falls_back_to_the_formula_where_a_tile_cannot_hold_it():
    """L not a multiple of 64, or more than 128 splits: the jnp formula (no pallas_call)."""
    for shape in ((2, 1, 16, 48), (200, 1, 8, 64)):
        o = jnp.ones(shape, jnp.float32)
        lse = jnp.zeros(shape[:3], jnp.float32)
        text = jax.jit(lambda o, l: combine(o, l, jnp.float32)).trace(o, lse).lower().as_text()
        assert "mla_combine_splits" not in text
        out, lse_out = combine(o, lse, jnp.float32)
        np.testing.assert_allclose(np.asarray(out), 1.0, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(lse_out), np.log(shape[0]), rtol=1e-6)


@pytest.mark.parametrize("num_splits, num_heads", [(2, 16), (128, 16), (7, 128), (3, 20)])
@pytest.mark.parametrize("gather", [False, True])
def test_lowers_to_triton_for_an_abstract_h200(num_splits, num_heads, gather):
    o, lse = _partials(num_splits, 3, num_heads)
    order = jnp.asarray(np.random.default_rng(3).permutation(512)) if gather else None
    text = lower_for_h200(lambda o, l: combine(o, l, jnp.bfloat16, col_order=order), o, lse).as_text()
    assert "__gpu$xla.gpu.triton" in text and "mla_combine_splits" in text


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits, num_tokens, num_heads", [(2, 64, 128), (16, 8, 16), (128, 1, 16), (7, 3, 20)])
def test_compiled_kernel_matches_formula(num_splits, num_tokens, num_heads):
    if jax.default_backend() != "gpu":
        pytest.skip("needs a GPU (the compiled Triton kernel)")
    o, lse = _partials(num_splits, num_tokens, num_heads)
    out, lse_out = combine(o, lse, jnp.float32)
    ref_out, ref_lse = combine_ref(o, lse, jnp.float32)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), rtol=1e-5, atol=1e-5)
    order = np.random.default_rng(4).permutation(512)  # (col_order: the kernel's gather of the output's columns)
    out_g, lse_g = combine(o, lse, jnp.float32, col_order=jnp.asarray(order))
    # (not bitwise at 128 splits on the H200: 1-ulp differences, at most 4.8e-7 absolute, in 60% of the
    # outputs; bitwise at 2, 7 and 16 splits: the gathered columns' sums compile in another order)
    np.testing.assert_allclose(np.asarray(out_g), np.asarray(out)[..., order], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(lse_g), np.asarray(lse_out))
    finite = np.isfinite(np.asarray(ref_lse))
    np.testing.assert_array_equal(np.isneginf(lse_out), ~finite)
    np.testing.assert_allclose(np.asarray(lse_out)[finite], np.asarray(ref_lse)[finite], rtol=1e-6, atol=1e-6)


# --- the ragged combine of a work schedule (combine_slots) ---

def _slot_partials(seed=0, num_slots=9, q=3, heads=20, lora=128):
    """Partials of 5 requests: slots [0, 2), none (seq_len 0), [2, 3), [3, 8), [8, 9) and query lens 2, 1, 1, 3, 2;
    NaN in every slot row no token may read (rows past a request's q_len), an empty slot for half the heads."""
    rng = np.random.default_rng(seed)
    o = rng.standard_normal((num_slots, q, heads, lora)).astype(np.float32)
    lse = (3 * rng.standard_normal((num_slots, q, heads))).astype(np.float32)
    offsets = np.array([0, 2, 2, 3, 8, 9], np.int32)
    qsl = np.array([0, 2, 3, 4, 7, 9], np.int32)
    for r in range(5):
        for s in range(offsets[r], offsets[r + 1]):
            o[s, qsl[r + 1] - qsl[r]:] = np.nan
            lse[s, qsl[r + 1] - qsl[r]:] = np.nan
    lse[4, :, ::2] = -np.inf
    o[4, :, ::2] = np.nan
    return o, lse, offsets, qsl


def _slots_formula(o, lse, offsets, qsl, num_tokens):
    """combine_ref over each token's slots, in NumPy order: the definition combine_slots implements."""
    out = np.zeros((num_tokens,) + o.shape[2:], np.float32)
    lse_out = np.full((num_tokens, o.shape[2]), -np.inf, np.float32)
    for r in range(len(qsl) - 1):
        s0, s1 = offsets[r], offsets[r + 1]
        for i, t in enumerate(range(qsl[r], qsl[r + 1])):
            if s1 > s0:
                ro, rl = combine_ref(jnp.asarray(o[s0:s1, i:i + 1]), jnp.asarray(lse[s0:s1, i:i + 1]), jnp.float32)
                out[t], lse_out[t] = np.asarray(ro)[0], np.asarray(rl)[0]
    return out, lse_out


@pytest.mark.parametrize("num_tokens", [9, 12])  # 12: three padded rows past query_start_loc[-1]
def test_combine_slots_merges_each_tokens_slots(num_tokens):
    from mla_jax.combine import combine_slots

    o, lse, offsets, qsl = _slot_partials()
    out, lse_out = combine_slots(o, lse, offsets, qsl, jnp.float32, num_tokens=num_tokens, interpret=True)
    ref_out, ref_lse = _slots_formula(o, lse, offsets, qsl, num_tokens)
    out, lse_out = np.asarray(out), np.asarray(lse_out)
    assert not np.isnan(out).any() and not np.isnan(lse_out).any(), "a slot no token may read leaked"
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.isneginf(lse_out), np.isneginf(ref_lse))
    assert (out[2] == 0).all() and np.isneginf(lse_out[2]).all()  # the request with no slots
    assert (out[9:] == 0).all() and np.isneginf(lse_out[9:]).all()  # padded rows
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse_out[finite], ref_lse[finite], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("gather", [False, True])
def test_combine_slots_merges_more_slots_than_a_load(gather):
    """A request of 37 slots (slot_tiles(57) = (8, 4): four wide loads, then two narrow ones, the last partly past its
    slots; with the column gather (4, 4): ten narrow ones), one of exactly 16 (two wide loads, no narrow one),
    beside requests of 3 slots (narrow loads only) and 1; an empty slot (lse -inf) in a wide load of the long one
    and in its narrow part, NaN in every slot row no token may read."""
    from mla_jax.combine import NARROW_SLOT_TILE, WIDE_SLOT_TILE, combine_slots, slot_tiles

    offsets, qsl = np.array([0, 3, 40, 41, 57], np.int32), np.array([0, 1, 3, 4, 5], np.int32)
    assert slot_tiles(57) == (WIDE_SLOT_TILE, NARROW_SLOT_TILE) == (8, 4)
    assert slot_tiles(57, gather=True) == (NARROW_SLOT_TILE, NARROW_SLOT_TILE)
    assert slot_tiles(3) == (4, 4) and slot_tiles(2) == (2, 2)
    rng = np.random.default_rng(2)
    o = rng.standard_normal((57, 2, 16, 128)).astype(np.float32)
    lse = (3 * rng.standard_normal((57, 2, 16))).astype(np.float32)
    for r in range(4):
        o[offsets[r]:offsets[r + 1], qsl[r + 1] - qsl[r]:] = np.nan
        lse[offsets[r]:offsets[r + 1], qsl[r + 1] - qsl[r]:] = np.nan
    for s in (5, 21, 37):
        lse[s], o[s] = -np.inf, np.nan
    order = rng.permutation(128).astype(np.int32) if gather else None
    out, lse_out = combine_slots(o, lse, offsets, qsl, jnp.float32, num_tokens=5, col_order=order, interpret=True)
    ref_out, ref_lse = _slots_formula(o, lse, offsets, qsl, 5)
    if gather:
        ref_out = ref_out[..., order]
    out, lse_out = np.asarray(out), np.asarray(lse_out)
    assert np.isfinite(out).all() and np.isfinite(lse_out).all(), "a slot no token may read leaked"
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse_out, ref_lse, rtol=1e-6, atol=1e-6)


def test_combine_slots_keeps_the_rows_of_single_slot_requests():
    """out/lse given: the rows of requests with one slot (written by the decode kernel) are kept, every other row
    is merged (or 0 / -inf); the jnp schedule.combine_slots gives the same merged rows."""
    from mla_jax.combine import combine_slots
    from mla_jax.schedule import combine_slots as combine_slots_jnp

    o, lse, offsets, qsl = _slot_partials(seed=1)
    pre_out, pre_lse = jnp.full((9, 20, 128), 5.0, jnp.bfloat16), jnp.full((9, 20), 7.0)
    out, lse_out = combine_slots(o, lse, offsets, qsl, jnp.bfloat16, out=pre_out, lse=pre_lse, interpret=True)
    out, lse_out = np.asarray(out, np.float32), np.asarray(lse_out)
    single = [3, 7, 8]  # request 2 (slot 2) and request 4 (slot 8)
    assert (out[single] == 5.0).all() and (lse_out[single] == 7.0).all()
    ref_out, ref_lse = (np.asarray(x, np.float32) for x in
                        combine_slots_jnp(o, lse, offsets, qsl, 9, jnp.bfloat16))
    merged = [0, 1, 2, 4, 5, 6]
    np.testing.assert_allclose(out[merged], ref_out[merged], rtol=8e-3, atol=8e-3)
    np.testing.assert_allclose(lse_out[merged], ref_lse[merged], rtol=1e-6, atol=1e-6)


def test_combine_slots_rejects_half_of_out_and_lse():
    from mla_jax.combine import combine_slots

    o, lse, offsets, qsl = _slot_partials()
    with pytest.raises(ValueError, match="out and lse together"):
        combine_slots(o, lse, offsets, qsl, jnp.float32, out=jnp.zeros((9, 20, 128)), interpret=True)
    with pytest.raises(ValueError, match="num_tokens"):
        combine_slots(o, lse, offsets, qsl, jnp.float32, interpret=True)


def test_combine_slots_lowers_for_h200():
    from mla_jax.combine import combine_slots

    o, lse, offsets, qsl = _slot_partials()
    text = lower_for_h200(lambda o, l, a, b: combine_slots(o, l, a, b, jnp.bfloat16, num_tokens=9,
                                                           col_order=jnp.arange(128)), o, lse, offsets, qsl).as_text()
    assert "__gpu$xla.gpu.triton" in text and "mla_combine_slots" in text
