"""`write_kv`: the new tokens' latent rows written into the paged cache (vLLM's `concat_and_cache_mla`) as one XLA
scatter that updates the donated cache buffer in place, and `quantize_fp8`, the fp8 cache's quantization rule
(`mla_spec.fp8`) in jnp.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mla_spec import (
    FP8_E4M3_MAX,
    MLAConfig,
    validate_k_scale,
    validate_slot_mapping,
    validate_write_kv_arrays,
)
from mla_spec.fp8 import check_quantize_scale
from mla_jax.api import check_jax_arrays, fits_int32


def quantize_fp8(x, k_scale):
    """`x` (any float array) as float8_e4m3fn by `mla_spec.fp8`'s rule: `saturate(float32(x) / k_scale)` to
    [-448, 448], rounded to nearest even. k_scale: a float or a 0-d float array (traced or not).

    XLA rewrites a division by a broadcast scalar as a multiplication by its reciprocal, which is an ulp off on
    about a third of the values (enough to change some fp8 roundings); the broadcast scale passes through an
    optimization barrier so that the division stays a division. A k_scale given as a number is checked as the
    decode's is (ValueError naming it); an array's value is not read here (traced, or a device sync)."""
    check_quantize_scale(k_scale)
    y = x.astype(jnp.float32)
    scale = lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(k_scale, jnp.float32), y.shape))
    return jnp.clip(y / scale, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(jnp.float8_e4m3fn)  # clip keeps NaN


def _scatter_rows(kv_cache, kv_c, k_pe, slot_mapping, k_scale, config: MLAConfig):
    """The write itself (traceable; shapes and dtypes already checked)."""
    num_blocks, page_size, width = kv_cache.shape
    num_slots = num_blocks * page_size
    rows = kv_c if k_pe is None else jnp.concatenate([kv_c, k_pe], axis=-1)
    rows = quantize_fp8(rows, k_scale) if config.is_fp8_kv_cache else rows.astype(kv_cache.dtype)
    # -1 (and, unchecked under jit, any slot outside the cache) -> num_slots, one past the end, which
    # mode="drop" skips. A negative index is not left as it is: .at[] would count it from the end.
    slots = slot_mapping.astype(jnp.int32)
    slots = jnp.where((slots < 0) | (slots >= num_slots), num_slots, slots)
    flat = kv_cache.reshape(num_slots, width)  # a bitcast of the buffer, no copy
    flat = flat.at[slots].set(rows, mode="drop")
    return flat.reshape(num_blocks, page_size, width)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("kv_cache",))
def _write_kv_donated(kv_cache, kv_c, k_pe, slot_mapping, k_scale, config: MLAConfig):
    return _scatter_rows(kv_cache, kv_c, k_pe, slot_mapping, k_scale, config)


def _is_concrete(x) -> bool:
    return isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer))


def write_kv(kv_cache, kv_c, k_pe, slot_mapping, config: MLAConfig, *, k_scale=1.0, check_values: bool | None = None):
    """Writes row t, `[kv_c[t] | k_pe[t]]`, to cache slot `slot_mapping[t]` = block * page_size + offset, i.e.
    `kv_cache[block, offset]`, and returns the new cache. vLLM's `concat_and_cache_mla`.

    kv_cache: `[num_blocks, page_size, kv_lora_rank + qk_rope_head_dim]` of the config's cache dtype (config.dtype,
        or float8_e4m3fn with kv_cache_dtype="fp8_e4m3").
    kv_c, k_pe: `[T, kv_lora_rank]` and `[T, qk_rope_head_dim]` in config.dtype; or k_pe=None and kv_c the packed
        `[T, kv_lora_rank + qk_rope_head_dim]`.
    slot_mapping: `[T]` int32 or int64; -1 skips the row (a padding token).
    k_scale: the fp8 cache's per-tensor scale (a float or a 0-d float array, traced or not), stored value =
        `mla_spec.fp8` rule of `x / k_scale`; 1.0 for other caches.
    check_values: read slot_mapping's values and refuse a slot outside [-1, num_blocks * page_size) or a slot
        written twice. Default: when slot_mapping is concrete (not traced). Under jax.jit the values are not
        checked; the contract is the same, and there a slot outside the cache is dropped (never wrapped) and a
        slot written twice holds, element by element, the value of one of its rows, which one unspecified.

    In place: the cache is updated by one scatter into its own buffer, with no copy, when the buffer is donated
    (on XLA:CPU an fp8 cache is converted through f16 and back around the scatter, which it has no fp8 form of).
    Called outside a trace, write_kv runs a jitted write that donates `kv_cache`: the array passed in is consumed
    (deleted where the platform supports donation) and the returned one takes its place. Inside a jitted step
    it is traced into that step; donate the cache there (`jax.jit(step, donate_argnums=...)`) and XLA aliases
    the cache's input and output buffers. Every slot not named in slot_mapping keeps its bits.
    """
    for name, x in (("kv_cache", kv_cache), ("kv_c", kv_c), ("k_pe", k_pe), ("slot_mapping", slot_mapping)):
        if name == "k_pe" and x is None:
            continue
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(f"{name} must be an array, got {name}={type(x).__name__}")
        check_jax_arrays(**{name: x})
    validate_write_kv_arrays(config, kv_cache, kv_c, k_pe, slot_mapping)
    validate_k_scale(k_scale, config, concrete=not isinstance(k_scale, jax.core.Tracer))
    num_blocks, page_size, _ = kv_cache.shape
    if check_values is None:
        check_values = _is_concrete(slot_mapping)
    if check_values:
        validate_slot_mapping(np.asarray(slot_mapping), num_blocks * page_size)
    else:  # a concrete int64 slot_mapping is cast to int32 at the jit boundary: 2**32 + 3 must not write slot 3
        fits_int32("slot_mapping", slot_mapping)
    k_scale = jnp.asarray(k_scale, jnp.float32)
    args = (kv_cache, kv_c, k_pe, slot_mapping, k_scale)
    if any(isinstance(x, jax.core.Tracer) for x in args):
        return _scatter_rows(*args, config)
    return _write_kv_donated(jnp.asarray(kv_cache), *args[1:], config=config)
