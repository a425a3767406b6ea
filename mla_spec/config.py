"""`MLAConfig`: the frozen, validated description of one MLA decode layer.

The field names follow vLLM (`kv_lora_rank`, `qk_rope_head_dim`, ...). Validation
lives in `__post_init__`; messages name the offending value in `{x=}` form.
The unsupported features of vLLM's FlashAttnMLA backend ("the seed": alibi slopes,
sliding window, logits soft cap, non-decoder attention) raise the seed's
`NotImplementedError` messages.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
"""Activation dtypes. Fast paths take bfloat16/float16; float32 is for references."""

SUPPORTED_KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
"""`"auto"`: the cache has the activation dtype. `"fp8_e4m3"`: the cache is float8_e4m3fn with one
float32 per-tensor scale `k_scale` (vLLM's convention for the MLA latent cache: real value = fp8
value * k_scale); q stays in `dtype`. FA3 (the seed) does not take it; the references and the
Pallas Triton kernel do."""

FP8_KV_CACHE_ARRAY_DTYPES = {"fp8_e4m3": "float8_e4m3fn"}
"""The array dtype name (torch and JAX/NumPy alike) of the cache for each fp8 `kv_cache_dtype`."""

FP8_E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value."""

ATTN_TYPE_DECODER = "decoder"

# The seed's messages (vLLM FlashAttnMLAImpl), kept verbatim.
UNSUPPORTED_FEATURES_MSG = (
    "FlashAttnMLAImpl does not support one of the following: "
    "alibi_slopes, sliding_window, logits_soft_cap"
)
NON_DECODER_MSG = (
    "Encoder self-attention and encoder/decoder cross-attention "
    "are not implemented for FlashAttnMLAImpl"
)
FP8_KV_CACHE_MSG = "FlashAttnMLA V1 with FP8 KV cache not yet supported"


FLOAT32_NORMAL_RANGE = (float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max))
"""Scales (softmax_scale, k_scale) are range-checked here in float64 but used in float32 by every
kernel: a value outside this range would overflow to inf (NaN out) or flush to 0 / lose precision."""


def _largest_fp8_scale() -> float:
    """The largest float32 `k` with `FP8_E4M3_MAX * k` finite in float32."""
    k = np.float32(float(np.finfo(np.float32).max) / FP8_E4M3_MAX)
    with np.errstate(over="ignore"):
        while not np.isfinite(np.float32(FP8_E4M3_MAX) * k):
            k = np.nextafter(k, np.float32(0))
    return float(k)


K_SCALE_MAX = _largest_fp8_scale()
"""The largest fp8 cache scale `k_scale` (7.5956e35 = float32 max / 448): every impl dequantizes in float32, where a
stored 448 times a larger scale overflows to inf (NaN out)."""


def check_config(config, name: str = "config") -> None:
    """Raises ValueError naming `name` and the type unless `config` is an `MLAConfig` (rather than an
    AttributeError on its first field)."""
    if not isinstance(config, MLAConfig):
        raise ValueError(f"{name} must be an mla_spec.MLAConfig, got {name}={type(config).__name__}")


def as_real_float(value):
    """`value` as a Python float when it is a real number (int, float, or a NumPy integer/floating
    scalar, not a bool), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float64 (10**400)
        return math.inf if value > 0 else -math.inf


def check_float32_scale(name: str, value: float, shown=None) -> None:
    """Raises ValueError naming `name` and the value (`shown`, default `value`) unless `value` is
    finite, > 0 and a normal float32."""
    lo, hi = FLOAT32_NORMAL_RANGE
    if not (math.isfinite(value) and lo <= value <= hi):
        shown = value if shown is None else shown
        raise ValueError(
            f"{name} must be finite, > 0 and a normal float32 ({lo:.6g} <= {name} <= {hi:.6g}), got {name}={shown!r}"
        )


def check_fp8_scale(name: str, value: float, shown=None) -> None:
    """`check_float32_scale`, and `value <= K_SCALE_MAX`: the largest fp8 value times the scale stays finite in
    float32."""
    check_float32_scale(name, value, shown)
    if value > K_SCALE_MAX:
        shown = value if shown is None else shown
        raise ValueError(
            f"{name} must be <= {K_SCALE_MAX:.6g} (float32 max / {FP8_E4M3_MAX:g}, the largest float8_e4m3fn value: "
            f"a larger scale turns that value into inf in float32, NaN out), got {name}={shown!r}"
        )


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {name}={value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {name}={value}")


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """One MLA decode layer (absorbed weights) as seen by the attention kernel.

    `q` is `[T, num_heads, kv_lora_rank + qk_rope_head_dim]`; the paged cache is
    `[num_blocks, page_size, kv_lora_rank + qk_rope_head_dim]`; out is
    `[T, num_heads, kv_lora_rank]`.
    """

    num_heads: int
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    page_size: int = 64
    softmax_scale: float | None = None
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    reorder_batch_threshold: int | None = None
    max_num_seqs: int = 256
    max_capture_size: int = 512
    max_num_splits_for_cuda_graph: int = 32
    dcp_world_size: int = 1
    # Batch-invariant mode (vLLM's VLLM_BATCH_INVARIANT): a request's out and lse are bitwise
    # identical whatever else is in the batch. Kernels then take no split-KV and no tile size
    # that depends on the batch (num_splits = 1, block_q = 1 in the Triton kernel; FA3's
    # max_num_splits = 1, as the seed does under VLLM_BATCH_INVARIANT).
    batch_invariant: bool = False
    # The seed's unsupported features: accepted as fields so that a config carried
    # over from a model raises the seed's error instead of being silently ignored.
    alibi_slopes: tuple[float, ...] | None = None
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    attn_type: str = ATTN_TYPE_DECODER

    def __post_init__(self):
        for name in (
            "num_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
            "v_head_dim", "page_size", "max_num_seqs", "max_capture_size",
            "max_num_splits_for_cuda_graph", "dcp_world_size",
        ):
            value = getattr(self, name)
            if isinstance(value, np.integer):  # (a NumPy int, e.g. read from an array: stored as a Python int)
                object.__setattr__(self, name, int(value))
            _check_positive_int(name, getattr(self, name))
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be a bool, got batch_invariant={self.batch_invariant!r}")
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"unsupported dtype: dtype={self.dtype!r}; expected one of {SUPPORTED_DTYPES}")
        if self.kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
            raise ValueError(
                f"unsupported kv_cache_dtype: kv_cache_dtype={self.kv_cache_dtype!r}; "
                f"expected one of {SUPPORTED_KV_CACHE_DTYPES}"
            )
        if self.softmax_scale is None:
            object.__setattr__(self, "softmax_scale", (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5)
        scale = as_real_float(self.softmax_scale)
        if scale is None:
            raise ValueError(f"softmax_scale must be a finite float > 0, got softmax_scale={self.softmax_scale!r}")
        check_float32_scale("softmax_scale", scale, shown=self.softmax_scale)
        object.__setattr__(self, "softmax_scale", scale)
        if self.reorder_batch_threshold is None:
            # The seed: decodes with q_len <= 512 go through the decode kernel;
            # with DCP only q_len == 1 (vLLM has no DCP masking for longer queries).
            object.__setattr__(self, "reorder_batch_threshold", 1 if self.dcp_world_size > 1 else 512)
        if isinstance(self.reorder_batch_threshold, np.integer):
            object.__setattr__(self, "reorder_batch_threshold", int(self.reorder_batch_threshold))
        _check_positive_int("reorder_batch_threshold", self.reorder_batch_threshold)
        if self.dcp_world_size > 1 and self.reorder_batch_threshold != 1:
            raise ValueError(
                "reorder_batch_threshold must be 1 when dcp_world_size > 1, got "
                f"reorder_batch_threshold={self.reorder_batch_threshold}, dcp_world_size={self.dcp_world_size}"
            )
        if self.alibi_slopes is not None:
            slopes = None
            if not isinstance(self.alibi_slopes, (str, bytes)):
                try:
                    slopes = [as_real_float(x) for x in self.alibi_slopes]
                except TypeError:  # not iterable
                    pass
            if slopes is None or any(x is None for x in slopes):
                raise ValueError(f"alibi_slopes must be a sequence of floats, got alibi_slopes={self.alibi_slopes!r}")
            object.__setattr__(self, "alibi_slopes", tuple(slopes))
        if self.alibi_slopes or self.sliding_window or self.logits_soft_cap:
            raise NotImplementedError(UNSUPPORTED_FEATURES_MSG)
        if self.attn_type != ATTN_TYPE_DECODER:
            raise NotImplementedError(NON_DECODER_MSG)

    @property
    def head_dim(self) -> int:
        """Width of q and of one cache row: `kv_lora_rank + qk_rope_head_dim` (576)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def is_fp8_kv_cache(self) -> bool:
        return self.kv_cache_dtype.startswith("fp8")

    def replace(self, **changes) -> "MLAConfig":
        """A copy with `changes`; the derived defaults (softmax_scale, reorder_batch_threshold)
        are derived again unless they had been set to something else."""
        if "softmax_scale" not in changes and self.softmax_scale == (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5:
            changes["softmax_scale"] = None
        if "reorder_batch_threshold" not in changes and self.reorder_batch_threshold == (
            1 if self.dcp_world_size > 1 else 512
        ):
            changes["reorder_batch_threshold"] = None
        return dataclasses.replace(self, **changes)
