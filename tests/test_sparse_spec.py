"""The sparse decode's contract (`mla_spec.sparse`, `mla_spec.fp8_sparse`, `reference.sparse_mla_decode`).

- The float64 reference by hand (a repeated slot counts each time, -1 and entries past topk_length are skipped, a
  token with no key is out 0 / lse -inf) and against the dense decode: indices naming a request's causal range
  through its block table give the dense reference's answer.
- The fp8_ds_mla layout: bytes computed by hand, FlashMLA's quantization rule written in torch ops (its
  tests/quant.py) matched byte for byte on the CPU (and on the GPU, `gpu` marker), non-finite tiles.
- Bad input to `build_sparse_metadata`, the message naming the offending value (the entry points' checks:
  tests/test_sparse.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mla_spec import (
    MLAConfig,
    build_sparse_metadata,
    dequantize_sparse_fp8,
    quantize_sparse_fp8,
    reference,
)
from mla_spec.fp8_sparse import BYTES_PER_TOKEN, tile_scales
from parity.scenarios import SCENARIOS, make_batch, round_to

SMALL = MLAConfig(num_heads=2, kv_lora_rank=4, qk_rope_head_dim=2, page_size=4, dtype="float32")


# ----------------------------------------------------------------------------------------
# The reference
# ----------------------------------------------------------------------------------------


def _by_hand(q, keys, config):
    """softmax attention of one token over the rows `keys` ([n, L+R]), in float64."""
    L = config.kv_lora_rank
    s = (q[:, :L] @ keys[:, :L].T + q[:, L:] @ keys[:, L:].T) * config.softmax_scale
    lse = np.log(np.exp(s).sum(axis=-1))
    return np.exp(s - lse[:, None]) @ keys[:, :L], lse


def test_reference_counts_a_repeated_slot_each_time_and_skips_minus_one_and_past_topk_length():
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((3, 4, 6))
    q = rng.standard_normal((4, 2, 6))
    flat = kv.reshape(-1, 6)
    md = build_sparse_metadata([[5, 5, -1, 2], [2, -1, 5, 5], [7, 9, 11, 1], [-1, -1, -1, -1]], [4, 4, 1, 4],
                               config=SMALL, num_blocks=3)
    out, lse = reference.sparse_mla_decode(q, kv, md, SMALL)
    for t, keys in ((0, [5, 5, 2]), (1, [2, 5, 5]), (2, [7])):
        o, l = _by_hand(q[t], flat[keys], SMALL)
        np.testing.assert_allclose(out[t], o, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse[t], l, rtol=1e-12)
    assert (out[3] == 0).all() and (lse[3] == -np.inf).all()
    # slot 5 named twice weighs as slot 5 once with its score raised by log(2)
    alone = build_sparse_metadata([[5], [2]], config=SMALL)
    (l5, l2) = reference.sparse_mla_decode(np.stack([q[0], q[0]]), kv, alone, SMALL)[1]
    np.testing.assert_allclose(lse[0], np.logaddexp(l5 + np.log(2), l2), rtol=1e-12)


def test_reference_reads_no_other_slot():
    """NaN everywhere but the named slots, and in the slots named past topk_length: the answer is finite."""
    kv = np.full((3, 4, 6), np.nan)
    kv.reshape(-1, 6)[[1, 6]] = 1.0
    q = np.ones((2, 2, 6))
    md = build_sparse_metadata([[1, 6, 0], [6, -1, 3]], [2, 1], config=SMALL, num_blocks=3)
    out, lse = reference.sparse_mla_decode(q, kv, md, SMALL)
    assert np.isfinite(out).all() and np.isfinite(lse).all()


@pytest.mark.parametrize("name", ["spec_decode_page_16", "page_size_1", "heads_128_spec"])
@pytest.mark.parametrize("cache_format", ["auto", "fp8_ds_mla"])
def test_sparse_over_the_causal_range_is_the_dense_decode(name, cache_format):
    """Indices naming each token's causal range through its request's block table (-1 padded) give the dense
    reference's out and lse: the two decodes share scores, scale, softmax and LSE convention."""
    batch = make_batch(SCENARIOS[name], "bfloat16")
    md, config, P = batch.metadata, batch.config, batch.config.page_size
    kv = batch.kv_cache
    if cache_format == "fp8_ds_mla":
        kv = quantize_sparse_fp8(np.nan_to_num(kv))
        dense_kv = dequantize_sparse_fp8(kv)
    else:
        dense_kv = kv
    rows = []
    for r in range(md.num_reqs):
        seq_len, q_len = int(md.seq_lens[r]), int(md.query_start_loc[r + 1] - md.query_start_loc[r])
        pos = np.arange(seq_len)
        slots = md.block_table[r, pos // P] * P + pos % P
        for i in range(q_len):
            rows.append(np.where(pos <= seq_len - q_len + i, slots, -1))
    width = max(len(x) for x in rows)
    indices = np.stack([np.pad(x, (0, width - len(x)), constant_values=-1) for x in rows])
    sparse_md = build_sparse_metadata(indices, config=config, num_blocks=kv.shape[0])
    out, lse = reference.sparse_mla_decode(batch.q, kv, sparse_md, config, cache_format=cache_format)
    ref_out, ref_lse = reference.mla_decode(batch.q, dense_kv, md, config)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)


# ----------------------------------------------------------------------------------------
# The fp8_ds_mla layout
# ----------------------------------------------------------------------------------------


def test_fp8_layout_bytes_by_hand():
    """Tile 0 all 1.0: amax / 448 = 2.23e-3, rounded up to 2**-8, each value 256 = 1.0 * 2**8 -> e4m3 0x78 (exponent
    15, mantissa 0). Tile 1 all 0: the floor 1e-4 -> 2**-13, bytes 0. Tile 2 holds 448 and -3.5: scale 1, bytes 0x7E
    and 0xC6 (-1.75 * 2**1: sign 0x80, biased exponent 8 << 3, mantissa 6). Tile 3: 2**-20 beside 1.0:
    2**-20 / 2**-8 is below half e4m3's smallest step, 2**-9 / 2 -> 0. Rope 1.5 -> bf16 0x3FC0, little-endian."""
    row = np.zeros(576, np.float32)
    row[:128] = 1.0
    row[256], row[257] = 448.0, -3.5
    row[384], row[385] = 2.0**-20, 1.0
    row[512:] = 1.5
    b = quantize_sparse_fp8(row[None])[0]
    assert b.shape == (BYTES_PER_TOKEN,) and b.dtype == np.uint8
    assert (b[:128] == 0x78).all() and (b[128:256] == 0).all()
    assert b[256] == 0x7E and b[257] == 0xC6 and (b[258:384] == 0).all()
    assert b[384] == 0 and b[385] == 0x78
    scales = b[512:528].view("<f4")
    assert scales.tolist() == [2.0**-8, 2.0**-13, 1.0, 2.0**-8]
    assert b[512:516].tolist() == [0x00, 0x00, 0x80, 0x3B]  # 2**-8 = 0x3B800000
    assert (b[528:].view("<u2") == 0x3FC0).all() and b[528:530].tolist() == [0xC0, 0x3F]
    back = dequantize_sparse_fp8(b)
    expected = row.copy()
    expected[384] = 0.0
    np.testing.assert_array_equal(back, expected)


def test_fp8_layout_rounds_rows_to_bfloat16_first():
    row = np.zeros(576, np.float32)
    row[512] = 1.0 + 2.0**-9  # not a bfloat16: ties to even -> 1.0
    row[0] = 1.0 + 2.0**-9
    b = quantize_sparse_fp8(row)
    assert b[528:530].view("<u2")[0] == 0x3F80 and dequantize_sparse_fp8(b)[0] == 1.0


def test_fp8_scales_are_powers_of_two_at_least_amax_over_448():
    rng = np.random.default_rng(1)
    x = round_to(rng.standard_normal((64, 576)) * np.exp(rng.uniform(-20, 20, (64, 1))), "bfloat16")
    s = tile_scales(x[:, :512].reshape(64, 4, 128))
    amax = np.abs(x[:, :512].reshape(64, 4, 128)).max(-1)
    assert (np.frexp(s)[0] == 0.5).all(), "a scale that is not a power of two"
    assert (s >= np.maximum(amax / 448, np.float32(1e-4))).all() and (s / 2 < np.maximum(amax / 448, 1e-4)).all()
    back = dequantize_sparse_fp8(quantize_sparse_fp8(x))
    np.testing.assert_array_equal(back[:, 512:], x[:, 512:])
    err = np.abs(back[:, :512] - x[:, :512]).reshape(64, 4, 128)
    assert (err <= s[..., None] * 16).all(), "more than half an e4m3 step at 448 off"  # 448's step is 32


def flashmla_rule(k: torch.Tensor) -> torch.Tensor:
    """FlashMLA's quantization of the V3.2 layout (tests/quant.py, `quantize_k_cache`) in torch ops: bf16 rows
    `[N, 576]` -> uint8 `[N, 656]`."""
    out = torch.empty((k.shape[0], 656), dtype=torch.uint8, device=k.device)
    out[:, 528:] = k[:, 512:].contiguous().view(torch.uint8)
    for t in range(4):
        tile = k[:, 128 * t:128 * (t + 1)]
        s = tile.abs().max(dim=-1).values.float() / 448.0
        s = torch.pow(2, torch.clamp_min(s, 1e-4).log2().ceil()).float()
        out[:, 512 + 4 * t:516 + 4 * t] = s[:, None].contiguous().view(torch.uint8)
        out[:, 128 * t:128 * (t + 1)] = (tile.float() / s[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fp8_layout_is_flashmlas_byte_for_byte(device):
    """Rows of every magnitude from 1e-30 to 1e30 (zeros, exact powers of two and 448 multiples among them)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((512, 576)) * np.exp(rng.uniform(-69, 69, (512, 1)))
    x[0] = 0.0
    x[1, :128] = 2.0**-5
    x[2, :128] = 448.0 * 2.0**7
    x[3, 128:256] = 224.0
    x = round_to(x, "bfloat16")
    ours = quantize_sparse_fp8(x)
    theirs = flashmla_rule(torch.from_numpy(x).to(device=device, dtype=torch.bfloat16)).cpu().numpy()
    bad = np.argwhere(ours != theirs)
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(f"{len(bad)} bytes differ, first at {i}: ours {ours[i]}, FlashMLA's {theirs[i]}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_quantizer_is_mla_specs_byte_for_byte(device, dtype):
    """mla_torch.quantize_sparse_fp8 (on the device, for caches of gigabytes) gives mla_spec's bytes: rows of every
    magnitude, float32 input rounded to bfloat16 first, a 3-d cache shape."""
    import mla_torch

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 576)) * np.exp(rng.uniform(-69, 69, (64, 1)))).astype(np.float32)
    x[0] = 0.0
    x[1, :128] = 2.0**-5
    x[2, :128] = 448.0 * 2.0**7
    x = x.reshape(4, 16, 576)
    ours = mla_torch.quantize_sparse_fp8(torch.from_numpy(x).to(device=device, dtype=getattr(torch, dtype)))
    assert ours.dtype == torch.uint8 and tuple(ours.shape) == (4, 16, 656)
    np.testing.assert_array_equal(ours.cpu().numpy(), quantize_sparse_fp8(x))
    with pytest.raises(ValueError, match=r"kv must be a float tensor \[\.\.\., 576\].*shape=\(2, 512\)"):
        mla_torch.quantize_sparse_fp8(torch.zeros(2, 512))


def test_fp8_layout_non_finite_tiles_decode_to_nan():
    row = np.ones((2, 576), np.float32)
    row[0, 3] = np.nan
    row[1, 200] = np.inf
    back = dequantize_sparse_fp8(quantize_sparse_fp8(row))
    assert np.isnan(back[0, :128]).all() and np.isfinite(back[0, 128:]).all()
    assert np.isnan(back[1, 128:256]).all() and np.isfinite(back[1, :128]).all() and np.isfinite(back[1, 256:]).all()


def test_fp8_layout_shapes_are_checked():
    with pytest.raises(ValueError, match=r"kv must be \[\.\.\., 576\].*kv.shape=\(2, 512\)"):
        quantize_sparse_fp8(np.zeros((2, 512)))
    with pytest.raises(ValueError, match=r"uint8 \[\.\.\., 656\], got shape=\(2, 656\) dtype=int8"):
        dequantize_sparse_fp8(np.zeros((2, 656), np.int8))


# ----------------------------------------------------------------------------------------
# Metadata and bad input
# ----------------------------------------------------------------------------------------

CFG = MLAConfig(num_heads=2, page_size=4, dtype="float32")


def test_build_sparse_metadata_gives_int32_arrays():
    md = build_sparse_metadata([[0, -1], [7, 7]], np.array([2, 1], np.int64), config=CFG, num_blocks=2)
    assert md.indices.dtype == np.int32 and md.topk_length.dtype == np.int32
    assert (md.num_tokens, md.topk) == (2, 2)
    assert build_sparse_metadata([[3]], config=CFG).topk_length is None


@pytest.mark.parametrize("indices, topk_length, num_blocks, message", [
    ([[0, 1]], [3], 2, r"topk_length values must be in \[0, topk=2\], got topk_length\[0\]=3"),
    ([[0, 1]], [-1], 2, r"topk_length values must be in \[0, topk=2\], got topk_length\[0\]=-1"),
    ([[0, 8]], None, 2, r"a slot in \[0, num_blocks \* page_size = 8\), got indices\[0, 1\]=8"),
    ([[0, 1], [-2, 1]], None, 2, r"-1 \(skip the entry\) or a slot .*got indices\[1, 0\]=-2"),
    ([[0, 2**31]], None, 2, r"indices values must fit in int32, got indices\[0, 1\]=2147483648"),
    ([[0.0, 1.0]], None, 2, r"indices must hold integers, got indices.dtype=float64"),
    ([0, 1], None, 2, r"indices must be 2-D, got indices.shape=\(2,\)"),
    ([[0, 1]], [1, 1], 2, r"topk_length must be \[num_tokens=1\], got topk_length.shape=\(2,\)"),
    ([[0, 1]], [[1]], 2, r"topk_length must be 1-D, got topk_length.shape=\(1, 1\)"),
    (np.zeros((0, 4), np.int32), None, 2, r"at least one token and one entry, got indices.shape=\(0, 4\)"),
    (np.zeros((2, 0), np.int32), None, 2, r"at least one token and one entry, got indices.shape=\(2, 0\)"),
    ([[0, 1]], None, 0, r"num_blocks must be >= 1, got num_blocks=0"),
    ([[0, 1], [2]], None, 2, r"indices must be a 2-D integer array"),
])
def test_build_sparse_metadata_refuses_naming_the_value(indices, topk_length, num_blocks, message):
    with pytest.raises(ValueError, match=message):
        build_sparse_metadata(indices, topk_length, config=CFG, num_blocks=num_blocks)


def test_entries_past_topk_length_are_not_checked():
    md = build_sparse_metadata([[0, 2**31 - 1, -7]], [1], config=CFG, num_blocks=2)
    assert md.indices[0, 1] == 2**31 - 1
