"""Checks on the call's arrays (q, kv_cache) against the config and metadata.

Both backends call `validate_inputs` with plain shapes and dtype names, so one
function says the same thing on both stacks.
"""

from __future__ import annotations

from mla_spec.config import FP8_KV_CACHE_MSG, MLAConfig
from mla_spec.metadata import DecodeMetadata

FP8_DTYPE_NAMES = ("float8_e4m3fn",)


def dtype_name(dtype) -> str:
    """'bfloat16' for torch.bfloat16, jnp.bfloat16, np.dtype('float32')... ."""
    name = getattr(dtype, "name", None) or str(dtype)
    return name.removeprefix("torch.")


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
    if config.is_fp8_kv_cache:
        raise NotImplementedError(f"{FP8_KV_CACHE_MSG} (kv_cache_dtype={config.kv_cache_dtype!r})")
    L, R, H = config.kv_lora_rank, config.qk_rope_head_dim, config.num_heads
    if len(q_shapes) == 1:
        (shape,) = q_shapes
        if len(shape) != 3:
            raise ValueError(f"q must be [T, num_heads, {L + R}], got q.shape={tuple(shape)}")
        if shape[2] != L + R:
            raise ValueError(
                f"q width must be kv_lora_rank + qk_rope_head_dim = {L + R}, got q.shape={tuple(shape)}"
            )
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
    if len(kv_cache_shape) != 3 or kv_cache_shape[1] != config.page_size or kv_cache_shape[2] != L + R:
        raise ValueError(
            f"kv_cache must be [num_blocks, page_size={config.page_size}, {L + R}], "
            f"got kv_cache.shape={tuple(kv_cache_shape)}"
        )
    if kv_cache_shape[0] < 1:
        raise ValueError(f"kv_cache needs at least one block, got kv_cache.shape={tuple(kv_cache_shape)}")
    if kv_cache_dtype != config.dtype:
        raise ValueError(
            f"kv_cache dtype must be config.dtype={config.dtype!r} with kv_cache_dtype='auto', "
            f"got kv_cache.dtype={kv_cache_dtype}"
        )
    metadata.validate(config, num_blocks=int(kv_cache_shape[0]), check_values=check_values)
    if shape[0] != metadata.num_decode_tokens:
        raise ValueError(
            f"q token count must equal metadata.num_decode_tokens={metadata.num_decode_tokens}, "
            f"got q.shape[0]={shape[0]}"
        )
