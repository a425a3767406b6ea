"""The sparse decode's contract (DeepSeek-V3.2's DSA top-k attention): `SparseMetadata`, its builder and checks,
and the cache formats it reads.

DeepSeek-V3.2's indexer picks, for every query token, the `topk` cache slots that token attends to; the sparse MLA
decode then runs the dense decode's math over exactly those slots. Per query token t:
  - `indices[t]` (int32, `topk` entries) names global cache slots, `block * page_size + offset`, i.e.
    `kv_cache[block, offset]`; -1 marks an entry to skip. With `topk_length`, only the leftmost `topk_length[t]`
    entries of the row are used (the rest are ignored whatever they hold).
  - every used entry that is not -1 is one key, in the row's order: a slot named twice in a row counts twice (as
    in both kernels, FA3 on one-token pages and FlashMLA, which take each entry as its own key).
  - no causal mask (the indexer already chose); the scores, the softmax scale and the output are the dense
    decode's (`mla_spec.reference`): out `[T, H, kv_lora_rank]`, lse `[T, H]` in natural log. A token with no used
    entry gets out 0 and lse -inf.
The tokens of one request are rows of `indices` like any other (speculative decode: q_len tokens, q_len rows).

The cache is the dense decode's `[num_blocks, page_size, 576]` in config.dtype (cache_format "auto"), or FlashMLA's
656-byte fp8 layout `uint8 [num_blocks, page_size, 656]` (cache_format "fp8_ds_mla", vLLM's name for it;
`mla_spec.fp8_sparse`). The format is a keyword of the sparse entry points rather than a config field: the dense
decode and the cache write do not take the 656-byte layout, and `MLAConfig.kv_cache_dtype` stays "auto" here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from mla_spec.config import MLAConfig, check_config
from mla_spec.fp8_sparse import BYTES_PER_TOKEN, NOPE_DIM, ROPE_DIM
from mla_spec.inputs import check_kv_cache, check_num_slots, check_q
from mla_spec.metadata import (
    _check_static_int,
    _exact_ints,
    _is_integer_dtype,
    as_array,
    check_fits_int32,
    check_no_bools,
)

SPARSE_CACHE_FORMATS = ("auto", "fp8_ds_mla")
"""The caches a sparse decode reads: "auto", `[num_blocks, page_size, 576]` in config.dtype (the dense decode's);
"fp8_ds_mla", `uint8 [num_blocks, page_size, 656]` (FlashMLA's V3.2 fp8 layout, `mla_spec.fp8_sparse`)."""


@dataclasses.dataclass(frozen=True)
class SparseMetadata:
    """The top-k selection of one sparse decode (one layer: DeepSeek-V3.2's indexer runs per layer).

    indices: integer `[T, topk]` (int32 in the backends), global slots `block * page_size + offset`, -1 to skip.
    topk_length: None, or integer `[T]` in `[0, topk]`: only `indices[t, :topk_length[t]]` is used.

    NumPy arrays, torch tensors or JAX arrays; T and topk are their static shapes.
    """

    indices: Any
    topk_length: Any = None

    @property
    def num_tokens(self) -> int:
        return int(self.indices.shape[0])

    @property
    def topk(self) -> int:
        return int(self.indices.shape[1])

    def replace(self, **changes) -> "SparseMetadata":
        return dataclasses.replace(self, **changes)

    def validate(self, config: MLAConfig, num_blocks: int | None = None, *, check_values: bool = True) -> None:
        """`validate_sparse_metadata`: raises ValueError naming what broke."""
        validate_sparse_metadata(self, config, num_blocks=num_blocks, check_values=check_values)


def check_sparse_metadata(metadata, name: str = "metadata") -> None:
    """Raises ValueError unless `metadata` is a `SparseMetadata` whose indices (and topk_length, if given) are
    arrays (NumPy, torch, JAX) of an integer dtype."""
    if not isinstance(metadata, SparseMetadata):
        raise ValueError(f"{name} must be an mla_spec.SparseMetadata, got {name}={type(metadata).__name__}")
    for field in ("indices", "topk_length"):
        arr = getattr(metadata, field)
        if field == "topk_length" and arr is None:
            continue
        if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
            raise ValueError(f"{field} must be an array, got {field}={type(arr).__name__}")
        if not _is_integer_dtype(arr.dtype):
            raise ValueError(f"{field} must have an integer dtype, got {field}.dtype={arr.dtype}")


def validate_sparse_metadata(
    md: SparseMetadata, config: MLAConfig, *, num_blocks: int | None = None, check_values: bool = True
) -> None:
    """Shapes and dtypes always: `indices [T >= 1, topk >= 1]`, `topk_length [T]`. With `check_values` (arrays
    that can be read for free: NumPy, CPU tensors, concrete JAX arrays), the values: every entry fits int32,
    `0 <= topk_length[t] <= topk`, and each used entry is -1 or a slot in `[0, num_blocks * page_size)` (>= -1
    without `num_blocks`)."""
    check_config(config)
    check_sparse_metadata(md)
    shape = tuple(md.indices.shape)
    if len(shape) != 2:
        raise ValueError(f"indices must be 2-D [num_tokens, topk], got indices.shape={shape}")
    if shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"indices needs at least one token and one entry, got indices.shape={shape}")
    if md.topk_length is not None and tuple(md.topk_length.shape) != (shape[0],):
        raise ValueError(
            f"topk_length must be [num_tokens={shape[0]}], got topk_length.shape={tuple(md.topk_length.shape)}"
        )
    num_slots = None
    if num_blocks is not None:
        _check_static_int("num_blocks", num_blocks, 1)
        num_slots = int(num_blocks) * config.page_size
    if check_values:
        _validate_values(md, num_slots)


def _validate_values(md: SparseMetadata, num_slots: int | None) -> None:
    indices = np.asarray(md.indices)
    arrays = {"indices": indices}
    if md.topk_length is not None:
        arrays["topk_length"] = np.asarray(md.topk_length)
    # The backends cast to int32: a wider value must not wrap into a plausible slot.
    for name, arr in arrays.items():
        check_fits_int32(name, arr)
    T, topk = indices.shape
    used = np.ones((T, topk), bool)
    if md.topk_length is not None:
        lengths = arrays["topk_length"].astype(np.int64)
        bad = np.flatnonzero((lengths < 0) | (lengths > topk))
        if bad.size:
            t = int(bad[0])
            raise ValueError(f"topk_length values must be in [0, topk={topk}], got topk_length[{t}]={int(lengths[t])}")
        used = np.arange(topk)[None, :] < lengths[:, None]
    slots = indices.astype(np.int64)
    bad = used & ((slots < -1) | (slots >= num_slots if num_slots is not None else False))
    if bad.any():
        t, j = (int(i) for i in np.argwhere(bad)[0])
        where = f"[0, num_blocks * page_size = {num_slots})" if num_slots is not None else "[0, num_slots)"
        raise ValueError(
            f"indices values must be -1 (skip the entry) or a slot in {where}, got indices[{t}, {j}]={int(slots[t, j])}"
        )


def _as_int_array(name: str, values, ndim: int) -> np.ndarray:
    arr = as_array(name, values, ndim)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got {name}.shape={arr.shape}")
    if arr.size and _exact_ints(arr) is None:
        raise ValueError(f"{name} must hold integers, got {name}.dtype={arr.dtype}")
    check_no_bools(name, values)
    check_fits_int32(name, arr)  # (before the int32 cast below)
    return arr.astype(np.int32)


def build_sparse_metadata(
    indices: Sequence[Sequence[int]] | np.ndarray,
    topk_length: Sequence[int] | np.ndarray | None = None,
    *,
    config: MLAConfig,
    num_blocks: int | None = None,
) -> SparseMetadata:
    """Validated int32 NumPy `SparseMetadata` from `indices` (a 2-D integer array or one list of slots per token,
    all of one length) and `topk_length` (one int per token, or None). `num_blocks` enables the slot range check."""
    check_config(config)
    md = SparseMetadata(
        indices=_as_int_array("indices", indices, 2),
        topk_length=None if topk_length is None else _as_int_array("topk_length", topk_length, 1),
    )
    md.validate(config, num_blocks=num_blocks)
    return md


def sparse_kv_cache_dtype(config: MLAConfig, cache_format: str) -> str:
    """The cache's array dtype name for `cache_format`: config.dtype for "auto", uint8 for "fp8_ds_mla"."""
    check_cache_format(cache_format)
    return config.dtype if cache_format == "auto" else "uint8"


def check_cache_format(cache_format) -> None:
    if cache_format not in SPARSE_CACHE_FORMATS:
        raise ValueError(f"unknown cache_format={cache_format!r}; expected one of {SPARSE_CACHE_FORMATS}")


def check_sparse_kv_cache(config: MLAConfig, kv_cache_shape: tuple[int, ...], kv_cache_dtype: str,
                          cache_format: str) -> None:
    """The cache of a sparse decode: `[num_blocks >= 1, page_size, 576]` in config.dtype ("auto", as the dense
    decode's) or `uint8 [num_blocks >= 1, page_size, 656]` ("fp8_ds_mla", which holds kv_lora_rank 512 and
    qk_rope_head_dim 64 only); fewer than 2**31 slots either way. config.kv_cache_dtype must be "auto": the
    per-tensor fp8 cache ("fp8_e4m3") is the dense decode's."""
    check_config(config)
    check_cache_format(cache_format)
    if config.kv_cache_dtype != "auto":
        raise ValueError(
            f"the sparse decode takes kv_cache_dtype='auto' (its fp8 cache is cache_format='fp8_ds_mla'), got "
            f"kv_cache_dtype={config.kv_cache_dtype!r}"
        )
    if cache_format == "auto":
        check_kv_cache(config, kv_cache_shape, kv_cache_dtype)
    else:
        if (config.kv_lora_rank, config.qk_rope_head_dim) != (NOPE_DIM, ROPE_DIM):
            raise ValueError(
                f"cache_format='fp8_ds_mla' holds kv_lora_rank={NOPE_DIM} and qk_rope_head_dim={ROPE_DIM}, got "
                f"kv_lora_rank={config.kv_lora_rank}, qk_rope_head_dim={config.qk_rope_head_dim}"
            )
        shape = tuple(kv_cache_shape)
        if len(shape) != 3 or shape[1] != config.page_size or shape[2] != BYTES_PER_TOKEN:
            raise ValueError(
                f"with cache_format='fp8_ds_mla' kv_cache must be [num_blocks, page_size={config.page_size}, "
                f"{BYTES_PER_TOKEN}], got kv_cache.shape={shape}"
            )
        if shape[0] < 1:
            raise ValueError(f"kv_cache needs at least one block, got kv_cache.shape={shape}")
        if kv_cache_dtype != "uint8":
            raise ValueError(
                f"with cache_format='fp8_ds_mla' kv_cache must be uint8 (656 bytes a token), "
                f"got kv_cache.dtype={kv_cache_dtype}"
            )
    check_num_slots(kv_cache_shape)


def validate_sparse_inputs(
    config: MLAConfig,
    metadata: SparseMetadata,
    *,
    q_shapes: tuple[tuple[int, ...], ...],
    q_dtypes: tuple[str, ...],
    kv_cache_shape: tuple[int, ...],
    kv_cache_dtype: str,
    cache_format: str = "auto",
    check_values: bool = True,
) -> None:
    """Validates a sparse decode call from shapes and dtype names (both stacks call it the same way): q as the
    dense decode's (`check_q`), the cache (`check_sparse_kv_cache`), the metadata (`validate_sparse_metadata`, the
    slot range from the cache's blocks), and one row of indices per query token."""
    check_config(config)
    check_sparse_metadata(metadata)
    check_q(config, q_shapes, q_dtypes)
    check_sparse_kv_cache(config, kv_cache_shape, kv_cache_dtype, cache_format)
    metadata.validate(config, num_blocks=int(kv_cache_shape[0]), check_values=check_values)
    if q_shapes[0][0] != metadata.num_tokens:
        raise ValueError(
            f"q token count must equal the rows of indices, metadata.num_tokens={metadata.num_tokens}, "
            f"got q.shape[0]={q_shapes[0][0]}"
        )
