"""The sparse decode's fp8 cache layout ("fp8_ds_mla": FlashMLA's DeepSeek-V3.2 layout), in NumPy.

One token is 656 bytes:
  - bytes [0, 512): the 512 latent values `kv_c` as float8_e4m3fn, in 4 tiles of 128;
  - bytes [512, 528): 4 little-endian float32 scales, one per tile (real value = fp8 value * its tile's scale);
  - bytes [528, 656): the 64 rope values `k_pe` as little-endian bfloat16, not quantized.
The cache is `uint8 [num_blocks, page_size, 656]` (FlashMLA takes it as `[num_blocks, page_size, 1, 656]`).

Quantization is FlashMLA's (`quantize_k_cache` in its tests/quant.py, the V3.2 layout), byte for byte on finite
input: the row is taken in bfloat16 (the model's activation dtype; float32 input is rounded to nearest even first),
and for each tile `s = float32(amax) / 448` (float32 division), `s = max(s, float32(1e-4))`, the scale is
`2 ** ceil(log2(s))` (a power of two: FlashMLA's "ue8m0" scale), and each value is
`float8_e4m3fn(float32(x) / scale)`, rounded to nearest even. |x| / scale <= 448 holds, so nothing saturates.
FlashMLA computes `ceil(log2(s))` with a float32 log2; here it is exact (from the binary exponent). The two agree
on every bfloat16 input: `s` is `m / 7 * 2**e` for an 8-bit integer m, never within float32 rounding of a power of
two without being one, and 1e-4 is not near one either.

vLLM's cache write for this layout (`concat_and_cache_ds_mla`) uses another scale, `max(amax / 448, FLT_MIN)` with no
power-of-two rounding; the layout and the dequantization are the same, so a cache it writes reads the same way here.

Dequantization (`dequantize_sparse_fp8`) is `fp8 value * scale` per tile and the rope values as they are, in float32
(exact for the power-of-two scales above). FlashMLA's kernel rounds each scale to bfloat16 before it multiplies,
which is exact for power-of-two scales.

Non-finite input: a tile with a NaN gets a NaN scale and NaN values (0x7F), a tile with an inf an inf scale; such a
tile decodes to NaN throughout. Those bytes are not byte-exact with a GPU (CUDA writes its own NaN pattern).
"""

from __future__ import annotations

import numpy as np

from mla_spec.fp8 import FP8_E4M3_MAX, round_to_e4m3fn

NOPE_DIM = 512
"""Latent values (`kv_lora_rank`) the layout holds, as float8_e4m3fn."""
ROPE_DIM = 64
"""Rope values (`qk_rope_head_dim`) the layout holds, as bfloat16."""
TILE_SIZE = 128
"""Latent values per float32 scale."""
NUM_TILES = NOPE_DIM // TILE_SIZE
SCALES_OFFSET = NOPE_DIM
ROPE_OFFSET = NOPE_DIM + 4 * NUM_TILES
BYTES_PER_TOKEN = ROPE_OFFSET + 2 * ROPE_DIM
"""656: 512 fp8 values, 4 float32 scales, 64 bfloat16 values."""

MIN_SCALE_BEFORE_ROUNDING = np.float32(1e-4)
"""FlashMLA's floor on amax / 448 (an all-zero tile gets the scale 2**-13)."""

_FP8_NAN = np.uint8(0x7F)
_BF16_NAN = np.uint16(0x7FC0)


def bfloat16_bits(x) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of float `x` rounded to nearest even, as torch's `.to(torch.bfloat16)`
    (overflow to inf, NaN as 0x7FC0)."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), _BF16_NAN, rounded)


def bfloat16_from_bits(bits) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def e4m3fn_bits(v) -> np.ndarray:
    """The float8_e4m3fn bytes of float32 values that are e4m3fn values already (`round_to_e4m3fn`'s output); NaN
    is 0x7F, -0.0 is 0x80."""
    v = np.asarray(v, np.float32)
    a = np.abs(v)
    mant, exp = np.frexp(a)  # a = mant * 2**exp, 0.5 <= mant < 1 (0 for a == 0)
    normal = a >= np.float32(2.0**-6)
    biased = np.where(normal, exp - 1 + 7, 0)
    mantissa = np.where(normal, (mant * 2 - 1) * 8, a * 2.0**9)
    with np.errstate(invalid="ignore"):  # (NaN lanes, replaced below)
        byte = (np.signbit(v).astype(np.uint8) << 7) | (biased.astype(np.uint8) << 3) | mantissa.astype(np.uint8)
    return np.where(np.isnan(v), _FP8_NAN, byte).astype(np.uint8)


def e4m3fn_from_bits(bits) -> np.ndarray:
    """float32 values of float8_e4m3fn bytes (0x7F and 0xFF are NaN)."""
    b = np.asarray(bits, np.uint8).astype(np.int32)
    biased, mantissa = (b >> 3) & 0xF, b & 0x7
    magnitude = np.where(biased == 0, mantissa * 2.0**-9, (8 + mantissa) * np.exp2(biased - 10.0))
    value = np.where(b & 0x80, -magnitude, magnitude)
    return np.where((b & 0x7F) == 0x7F, np.nan, value).astype(np.float32)


def tile_scales(tiles) -> np.ndarray:
    """FlashMLA's power-of-two scale of each tile: `tiles` float32 `[..., NUM_TILES, TILE_SIZE]` (bfloat16 values)
    -> float32 `[..., NUM_TILES]` (NaN for a tile with a NaN, inf for one with an inf)."""
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(tiles), axis=-1)  # NaN propagates, as torch's max
    s = np.maximum(amax / np.float32(FP8_E4M3_MAX), MIN_SCALE_BEFORE_ROUNDING)  # (np.maximum keeps NaN)
    mant, exp = np.frexp(s)  # s = mant * 2**exp; ceil(log2(s)) is exp, or exp - 1 when s is a power of two
    scale = np.ldexp(np.float32(1.0), np.where(mant == 0.5, exp - 1, exp)).astype(np.float32)
    return np.where(np.isfinite(s), scale, s).astype(np.float32)


def quantize_sparse_fp8(kv) -> np.ndarray:
    """Cache rows `[..., 576]` (any real float dtype; `[kv_c (512) | k_pe (64)]`) -> their `uint8 [..., 656]` bytes
    in the layout and by the rule above (FlashMLA's). Rows are rounded to bfloat16 first. Integer, bool and complex
    arrays are refused (ValueError naming kv.dtype), as mla_torch.quantize_sparse_fp8 refuses them."""
    from mla_spec.reference import _float_array

    kv = _float_array("kv", kv).astype(np.float32, copy=False)
    if kv.ndim < 1 or kv.shape[-1] != NOPE_DIM + ROPE_DIM:
        raise ValueError(f"kv must be [..., {NOPE_DIM + ROPE_DIM}] ([kv_c | k_pe] rows), got kv.shape={kv.shape}")
    lead = kv.shape[:-1]
    bits = bfloat16_bits(kv)
    values = bfloat16_from_bits(bits)
    tiles = values[..., :NOPE_DIM].reshape(lead + (NUM_TILES, TILE_SIZE))
    scales = tile_scales(tiles)
    with np.errstate(invalid="ignore", divide="ignore"):
        fp8 = e4m3fn_bits(round_to_e4m3fn(tiles / scales[..., None])).reshape(lead + (NOPE_DIM,))
    out = np.empty(lead + (BYTES_PER_TOKEN,), np.uint8)
    out[..., :SCALES_OFFSET] = fp8
    out[..., SCALES_OFFSET:ROPE_OFFSET] = scales.astype("<f4").view(np.uint8).reshape(lead + (4 * NUM_TILES,))
    out[..., ROPE_OFFSET:] = bits[..., NOPE_DIM:].astype("<u2").view(np.uint8).reshape(lead + (2 * ROPE_DIM,))
    return out


def dequantize_sparse_fp8(cache) -> np.ndarray:
    """`uint8 [..., 656]` bytes in the layout above -> float32 `[..., 576]` rows `[kv_c | k_pe]`."""
    cache = np.asarray(cache)
    if cache.dtype != np.uint8 or cache.ndim < 1 or cache.shape[-1] != BYTES_PER_TOKEN:
        raise ValueError(
            f"the fp8_ds_mla cache must be uint8 [..., {BYTES_PER_TOKEN}], got shape={cache.shape} dtype={cache.dtype}"
        )
    lead = cache.shape[:-1]
    scales = np.ascontiguousarray(cache[..., SCALES_OFFSET:ROPE_OFFSET]).view("<f4").astype(np.float32)
    rope = bfloat16_from_bits(np.ascontiguousarray(cache[..., ROPE_OFFSET:]).view("<u2"))
    nope = e4m3fn_from_bits(cache[..., :SCALES_OFFSET]).reshape(lead + (NUM_TILES, TILE_SIZE))
    with np.errstate(invalid="ignore"):  # (0 * inf in a tile that held an inf: NaN, as on the GPU)
        nope = (nope * scales[..., None]).reshape(lead + (NOPE_DIM,))
    return np.concatenate([nope, rope], axis=-1)
