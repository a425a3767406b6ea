"""Checks on the call's arrays (q, kv_cache) against the config and metadata.

Both backends call `validate_inputs` with plain shapes and dtype names, so one
function says the same thing on both stacks.
"""

from __future__ import annotations

import numpy as np

from mla_spec.config import FP8_KV_CACHE_ARRAY_DTYPES, MLAConfig, as_real_float, check_config, check_fp8_scale
from mla_spec.metadata import DecodeMetadata, _exact_ints, check_metadata

FP8_DTYPE_NAMES = tuple(FP8_KV_CACHE_ARRAY_DTYPES.values())
_FLOAT_DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")


def dtype_name(dtype) -> str:
    """'bfloat16' for torch.bfloat16, jnp.bfloat16, np.dtype('float32')... ."""
    if isinstance(dtype, type):  # a scalar type: jnp.bfloat16, np.float32, ml_dtypes.float8_e4m3fn
        try:
            return np.dtype(dtype).name
        except TypeError:
            pass
    name = getattr(dtype, "name", None) or str(dtype)
    return name.removeprefix("torch.")


def expected_kv_cache_dtype(config: MLAConfig) -> str:
    """The cache's array dtype name: config.dtype with kv_cache_dtype="auto", float8_e4m3fn with "fp8_e4m3"."""
    check_config(config)
    if config.is_fp8_kv_cache:
        return FP8_KV_CACHE_ARRAY_DTYPES[config.kv_cache_dtype]
    return config.dtype


def check_config_and_metadata(config, metadata, *, metadata_name: str = "metadata") -> None:
    """Raises ValueError (the package's convention for a wrong argument, as for a list q) unless
    `config` is an `MLAConfig` and `metadata` a `DecodeMetadata`."""
    check_config(config)
    check_metadata(metadata, metadata_name)


def check_q_pair(q) -> None:
    """Raises ValueError unless `q` is one array or a `(q_nope, q_pe)` tuple of two (the entry points' q)."""
    if isinstance(q, tuple) and len(q) != 2:
        raise ValueError(f"q must be one array or a (q_nope, q_pe) pair, got a tuple of {len(q)}")


def validate_k_scale(k_scale, config: MLAConfig, *, concrete: bool = True) -> float | None:
    """Checks the fp8 cache scale (vLLM's `k_scale`: real value = fp8 value * k_scale) and returns
    it as a float, or None when it is a traced value (`concrete=False`: under `jax.jit` only its
    shape and dtype can be checked).

    k_scale: a Python float (or int), or a 0-d float array (NumPy, torch, JAX); finite, > 0, a normal float32, and
    at most `K_SCALE_MAX` (1.18e-38 <= k_scale <= 7.6e35: every impl dequantizes in float32, where the largest fp8
    value, 448, times k_scale must stay finite).
    With kv_cache_dtype="auto" there is nothing to scale and k_scale must be 1.0 (a traced value
    is refused there, since it cannot be checked)."""
    check_config(config)
    if isinstance(k_scale, bool):
        raise ValueError(f"k_scale must be a float or a 0-d float array, got k_scale={k_scale!r}")
    if isinstance(k_scale, (int, float)):
        value = as_real_float(k_scale)
    elif hasattr(k_scale, "shape") and hasattr(k_scale, "dtype"):
        if tuple(k_scale.shape) != ():
            raise ValueError(f"k_scale must be a scalar (0-d), got k_scale.shape={tuple(k_scale.shape)}")
        if dtype_name(k_scale.dtype) not in _FLOAT_DTYPE_NAMES:
            raise ValueError(f"k_scale must have a float dtype, got k_scale.dtype={dtype_name(k_scale.dtype)}")
        value = float(k_scale) if concrete else None
    else:
        raise ValueError(f"k_scale must be a float or a 0-d float array, got k_scale={k_scale!r}")
    if value is not None:
        # Used in float32 by every impl: 1e39 would be inf there (NaN out), 1e-60 would be 0, and 448 * 1e36 inf.
        check_fp8_scale("k_scale", value, shown=k_scale if isinstance(k_scale, int) else None)
    if not config.is_fp8_kv_cache and value != 1.0:
        shown = "a traced value" if value is None else repr(value)
        raise ValueError(
            f"k_scale applies to an fp8 KV cache only; with kv_cache_dtype={config.kv_cache_dtype!r} it must be "
            f"1.0, got k_scale={shown}"
        )
    return value


def check_kv_cache_shape(config: MLAConfig, kv_cache_shape: tuple[int, ...]) -> None:
    """The paged cache's shape: `[num_blocks >= 1, page_size, kv_lora_rank + qk_rope_head_dim]`."""
    width = config.kv_lora_rank + config.qk_rope_head_dim
    if len(kv_cache_shape) != 3 or kv_cache_shape[1] != config.page_size or kv_cache_shape[2] != width:
        raise ValueError(
            f"kv_cache must be [num_blocks, page_size={config.page_size}, {width}], "
            f"got kv_cache.shape={tuple(kv_cache_shape)}"
        )
    if kv_cache_shape[0] < 1:
        raise ValueError(f"kv_cache needs at least one block, got kv_cache.shape={tuple(kv_cache_shape)}")


def check_kv_cache(config: MLAConfig, kv_cache_shape: tuple[int, ...], kv_cache_dtype: str) -> None:
    """The paged cache: `check_kv_cache_shape`'s shape, of the dtype the config implies
    (`expected_kv_cache_dtype`)."""
    check_kv_cache_shape(config, kv_cache_shape)
    expected = expected_kv_cache_dtype(config)
    if kv_cache_dtype != expected:
        if config.is_fp8_kv_cache:
            raise ValueError(
                f"kv_cache dtype must be {expected} with kv_cache_dtype={config.kv_cache_dtype!r}, "
                f"got kv_cache.dtype={kv_cache_dtype}"
            )
        hint = " (an fp8 cache needs kv_cache_dtype='fp8_e4m3')" if kv_cache_dtype in FP8_DTYPE_NAMES else ""
        raise ValueError(
            f"kv_cache dtype must be config.dtype={config.dtype!r} with kv_cache_dtype='auto', "
            f"got kv_cache.dtype={kv_cache_dtype}{hint}"
        )


def validate_inputs(
    config: MLAConfig,
    metadata: DecodeMetadata,
    *,
    q_shapes: tuple[tuple[int, ...], ...],
    q_dtypes: tuple[str, ...],
    kv_cache_shape: tuple[int, ...],
    kv_cache_dtype: str,
    check_values: bool = True,
) -> None:
    """Validates a call. `q_shapes`/`q_dtypes` hold one entry for the packed
    `q [T, H, L+R]`, or two for the `(q_nope [T,H,L], q_pe [T,H,R])` tuple."""
    check_config_and_metadata(config, metadata)
    check_q(config, q_shapes, q_dtypes)
    check_kv_cache(config, kv_cache_shape, kv_cache_dtype)
    metadata.validate(config, num_blocks=int(kv_cache_shape[0]), check_values=check_values)
    if q_shapes[0][0] != metadata.num_decode_tokens:
        raise ValueError(
            f"q token count must equal metadata.num_decode_tokens={metadata.num_decode_tokens}, "
            f"got q.shape[0]={q_shapes[0][0]}"
        )


def check_packed_q(config: MLAConfig, shape: tuple[int, ...]) -> None:
    """The packed q's shape: `[T, H, kv_lora_rank + qk_rope_head_dim]` (its heads are `check_q`'s)."""
    L, R = config.kv_lora_rank, config.qk_rope_head_dim
    if len(shape) != 3:
        raise ValueError(f"q must be [T, num_heads, {L + R}], got q.shape={tuple(shape)}")
    if shape[2] != L + R:
        raise ValueError(f"q width must be kv_lora_rank + qk_rope_head_dim = {L + R}, got q.shape={tuple(shape)}")


def check_q(config: MLAConfig, q_shapes: tuple[tuple[int, ...], ...], q_dtypes: tuple[str, ...]) -> None:
    """q's shapes and dtype: one entry for the packed `q [T, H, L+R]`, or two for the `(q_nope [T,H,L],
    q_pe [T,H,R])` tuple, with config.num_heads heads in config.dtype (the dense and the sparse decode alike)."""
    L, R, H = config.kv_lora_rank, config.qk_rope_head_dim, config.num_heads
    if len(q_shapes) == 1:
        check_packed_q(config, q_shapes[0])
    elif len(q_shapes) == 2:
        for name, shape, width in (("q_nope", q_shapes[0], L), ("q_pe", q_shapes[1], R)):
            if len(shape) != 3 or shape[2] != width:
                raise ValueError(f"{name} must be [T, num_heads, {width}], got {name}.shape={tuple(shape)}")
        if tuple(q_shapes[0][:2]) != tuple(q_shapes[1][:2]):
            raise ValueError(
                f"q_nope and q_pe must agree on [T, num_heads], got q_nope.shape={tuple(q_shapes[0])}, "
                f"q_pe.shape={tuple(q_shapes[1])}"
            )
        if q_dtypes[0] != q_dtypes[1]:
            raise ValueError(f"q_nope and q_pe must share a dtype, got {q_dtypes[0]} and {q_dtypes[1]}")
    else:
        raise ValueError(f"q must be one array or a (q_nope, q_pe) pair, got {len(q_shapes)} arrays")
    shape = q_shapes[0]
    q_dtype = q_dtypes[0]
    if shape[1] != H:
        raise ValueError(f"q must have num_heads={H} heads, got q.shape[1]={shape[1]}")
    if q_dtype != config.dtype:
        raise ValueError(f"q dtype must be config.dtype={config.dtype!r}, got q.dtype={q_dtype}")


SLOT_MAPPING_DTYPES = ("int32", "int64")
"""The dtypes of a cache write's `slot_mapping` (vLLM's is int64)."""


def validate_write_kv(
    config: MLAConfig,
    *,
    kv_cache_shape: tuple[int, ...],
    kv_cache_dtype: str,
    kv_c_shape: tuple[int, ...],
    kv_c_dtype: str,
    k_pe_shape: tuple[int, ...] | None,
    k_pe_dtype: str | None,
    slot_mapping_shape: tuple[int, ...],
    slot_mapping_dtype: str,
) -> None:
    """The shapes and dtypes of a cache write (`write_kv` of either stack): `kv_c [T, kv_lora_rank]` and
    `k_pe [T, qk_rope_head_dim]`, or the packed `kv_c [T, kv_lora_rank + qk_rope_head_dim]` with `k_pe` None
    (its shape and dtype passed as None), in config.dtype; the cache as `check_kv_cache` says; `slot_mapping [T]`
    int32 or int64. The values of slot_mapping are `validate_slot_mapping`'s."""
    check_config(config)
    L, R = config.kv_lora_rank, config.qk_rope_head_dim
    if k_pe_shape is None:
        if len(kv_c_shape) != 2 or kv_c_shape[1] != L + R:
            raise ValueError(
                f"packed kv_c (k_pe=None) must be [T, kv_lora_rank + qk_rope_head_dim = {L + R}], "
                f"got kv_c.shape={tuple(kv_c_shape)}"
            )
    else:
        for name, shape, width in (("kv_c", kv_c_shape, L), ("k_pe", k_pe_shape, R)):
            if len(shape) != 2 or shape[1] != width:
                raise ValueError(f"{name} must be [T, {width}], got {name}.shape={tuple(shape)}")
        if kv_c_shape[0] != k_pe_shape[0]:
            raise ValueError(
                f"kv_c and k_pe must have the same token count, got kv_c.shape={tuple(kv_c_shape)}, "
                f"k_pe.shape={tuple(k_pe_shape)}"
            )
    for name, dtype in (("kv_c", kv_c_dtype), ("k_pe", k_pe_dtype)):
        if dtype is not None and dtype != config.dtype:
            raise ValueError(f"{name} dtype must be config.dtype={config.dtype!r}, got {name}.dtype={dtype}")
    check_kv_cache(config, kv_cache_shape, kv_cache_dtype)
    if tuple(slot_mapping_shape) != (kv_c_shape[0],):
        raise ValueError(
            f"slot_mapping must be [T] with T = kv_c.shape[0] = {kv_c_shape[0]}, "
            f"got slot_mapping.shape={tuple(slot_mapping_shape)}"
        )
    if slot_mapping_dtype not in SLOT_MAPPING_DTYPES:
        raise ValueError(
            f"slot_mapping dtype must be one of {SLOT_MAPPING_DTYPES}, got slot_mapping.dtype={slot_mapping_dtype}"
        )
    check_num_slots(kv_cache_shape)


def check_num_slots(kv_cache_shape: tuple[int, ...]) -> None:
    """A paged cache `[num_blocks, page_size, ...]` has fewer than 2**31 slots: the backends index slots
    (`block * page_size + offset`) in int32, and the cache write needs num_slots itself as its dropped index."""
    num_slots = kv_cache_shape[0] * kv_cache_shape[1]
    if num_slots >= 2**31:
        raise ValueError(
            f"kv_cache must have fewer than 2**31 slots, got num_blocks * page_size = {num_slots} "
            f"(kv_cache.shape={tuple(kv_cache_shape)})"
        )


def validate_write_kv_arrays(config: MLAConfig, kv_cache, kv_c, k_pe, slot_mapping) -> None:
    """`validate_write_kv` on the arrays themselves (NumPy, torch or JAX: anything with a shape and a dtype; k_pe
    may be None), so that both stacks' write_kv pass them the same way."""
    validate_write_kv(
        config,
        kv_cache_shape=tuple(kv_cache.shape),
        kv_cache_dtype=dtype_name(kv_cache.dtype),
        kv_c_shape=tuple(kv_c.shape),
        kv_c_dtype=dtype_name(kv_c.dtype),
        k_pe_shape=None if k_pe is None else tuple(k_pe.shape),
        k_pe_dtype=None if k_pe is None else dtype_name(k_pe.dtype),
        slot_mapping_shape=tuple(slot_mapping.shape),
        slot_mapping_dtype=dtype_name(slot_mapping.dtype),
    )

def validate_slot_mapping(slot_mapping, num_slots: int) -> None:
    """The values of a cache write's `slot_mapping` (read on the host): each -1 (skip the row: padding) or a slot
    `block * page_size + offset` in [0, num_slots), and no slot twice (which row would win is unspecified)."""
    arr = np.asarray(slot_mapping)
    if arr.ndim != 1:
        raise ValueError(f"slot_mapping must be 1-D [T], got slot_mapping.shape={arr.shape}")
    if arr.size and _exact_ints(arr) is None:
        raise ValueError(f"slot_mapping must hold integers, got slot_mapping.dtype={arr.dtype}")
    if arr.size == 0:
        return
    bad = np.flatnonzero((arr < -1) | (arr >= num_slots))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"slot_mapping values must be -1 (skip the row) or a slot in [0, num_blocks * page_size = {num_slots}), "
            f"got slot_mapping[{i}]={int(arr[i])}"
        )
    written = arr[arr >= 0]
    slots, counts = np.unique(written, return_counts=True)
    if (counts > 1).any():
        slot = int(slots[counts > 1][0])
        first, second = (int(i) for i in np.flatnonzero(arr == slot)[:2])
        raise ValueError(
            f"slot_mapping must not write a slot twice, got slot {slot} at slot_mapping[{first}] and "
            f"slot_mapping[{second}]"
        )
