"""The fp8 KV cache's quantization rule (kv_cache_dtype="fp8_e4m3"), defined once.

A cache value is stored as `float8_e4m3fn(saturate(float32(x) / float32(k_scale)))`: the value in float32, divided
(a true IEEE division, not a multiply by 1 / k_scale) by the per-tensor scale, saturated to the finite range
[-448, 448] (+-inf and overflow land on +-448, NaN stays NaN), rounded to the nearest e4m3fn value, ties to even.
It is vLLM's `concat_and_cache_mla` with an fp8 cache (`scaled_fp8_conversion`:
`__nv_cvt_float_to_fp8(float(x) / scale, __NV_SATFINITE, __NV_E4M3)`), and reading back is
`fp8 value * k_scale` (`mla_spec.reference`).

`quantize_fp8` here is the NumPy definition (float32 values on the e4m3fn grid, NumPy only); `mla_torch.quantize_fp8`
and `mla_jax.quantize_fp8` are the same rule on their stacks, checked bitwise against it (tests/test_write_kv.py).
`fp8_k_scale` is the per-tensor scale the tests and the benchmark pick for a cache: amax / 448 in float32.
"""

from __future__ import annotations

import math

import numpy as np

FP8_E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value."""

_FP8_E4M3_MANTISSA_BITS = 3
_FP8_E4M3_MIN_EXP = -6
"""float8_e4m3fn's smallest normal is 2**-6; below it the values are multiples of 2**-9."""


def fp8_k_scale(amax) -> float:
    """The per-tensor scale that maps the largest magnitude `amax` onto 448: float32(amax / 448) as a Python float
    (1.0 when amax is 0, a cache of zeros). ValueError naming amax where it is not finite and >= 0, or where its
    scale is not one a cache may have (`mla_spec.config.check_fp8_scale`: a normal float32, at most K_SCALE_MAX)."""
    from mla_spec.config import check_fp8_scale

    value = float(amax)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"amax must be finite and >= 0, got amax={amax!r}")
    if value == 0:
        return 1.0
    with np.errstate(over="ignore"):  # (a scale past float32: refused below)
        scale = float(np.float32(value / FP8_E4M3_MAX))
    try:
        check_fp8_scale("amax / 448", scale)
    except ValueError as e:
        raise ValueError(f"amax={amax!r} gives no usable k_scale: {e}") from None
    return scale


def check_quantize_scale(k_scale) -> None:
    """The quantizers' check of a k_scale whose value can be read without a device sync (a Python number, or a 0-d
    NumPy array): finite, > 0, a normal float32, at most K_SCALE_MAX (`mla_spec.config.check_fp8_scale`, the
    decode's rule); ValueError naming k_scale otherwise. Device and traced scales are the caller's to check."""
    from mla_spec.config import check_fp8_scale

    if isinstance(k_scale, bool):
        raise ValueError(f"k_scale must be a float or a 0-d float array, got k_scale={k_scale!r}")
    if isinstance(k_scale, (int, float, np.number)) or (isinstance(k_scale, np.ndarray) and k_scale.shape == ()):
        check_fp8_scale("k_scale", float(k_scale), shown=k_scale)


def quantize_fp8(x, k_scale) -> np.ndarray:
    """`x` (any float array) quantized by the rule above: float32 values, each exactly a float8_e4m3fn value (cast
    them to float8_e4m3fn losslessly). k_scale: a float, finite, > 0, a normal float32 and at most K_SCALE_MAX
    (ValueError naming it otherwise)."""
    check_quantize_scale(k_scale)
    with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN in, or a tiny k_scale: saturated below
        y = np.asarray(x, np.float32) / np.float32(k_scale)
    return round_to_e4m3fn(y)


def round_to_e4m3fn(y) -> np.ndarray:
    """float32 `y` saturated to [-448, 448] (NaN stays NaN) and rounded to the nearest float8_e4m3fn value, ties to
    even: the conversion both fp8 caches use (`quantize_fp8` here, `mla_spec.fp8_sparse` per 128-value tile)."""
    y = np.clip(np.asarray(y, np.float32), np.float32(-FP8_E4M3_MAX), np.float32(FP8_E4M3_MAX))
    # 3 mantissa bits at the value's binade (y = m 2**e, 0.5 <= |m| < 1), the subnormal step below 2**-6.
    # y / step is exact (a power of two); np.round ties to even.
    _, exp = np.frexp(y)
    step = np.ldexp(np.float32(1.0), np.maximum(exp - 1, _FP8_E4M3_MIN_EXP) - _FP8_E4M3_MANTISSA_BITS)
    return (np.round(y / step) * step).astype(np.float32)
