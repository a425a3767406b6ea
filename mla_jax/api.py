"""`mla_jax.mla_decode`: one entry point, several implementations.

impl:
  "xla"                jnp reference (runs anywhere, float32 compute)
  "pallas_triton"      Pallas kernel, Triton lowering (portable GPUs; interpret mode on CPU)
  "pallas_mosaic_gpu"  Pallas kernel, Mosaic GPU lowering (Hopper; interpret mode on CPU)
  "auto"               the fastest that supports the problem on the current device

`DecodeMetadata` is a pytree here: the arrays are leaves, the ints static.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np

from mla_spec import (
    DecodeMetadata,
    MLAConfig,
    check_config_and_metadata,
    dtype_name,
    validate_inputs,
    validate_k_scale,
)
from mla_spec.config import check_config
from mla_spec.inputs import check_packed_q, check_q_pair
from mla_spec.metadata import check_fits_int32, check_metadata, check_metadata_arrays

jax.tree_util.register_dataclass(
    DecodeMetadata,
    data_fields=["query_start_loc", "seq_lens", "block_table", "scheduler_metadata"],
    meta_fields=["max_query_len", "max_seq_len", "num_decode_tokens", "max_num_splits", "padded"],
)

from mla_jax.schedule import Schedule  # noqa: E402

IMPLS = ("xla", "pallas_triton", "pallas_mosaic_gpu")
_MODULES = {
    "xla": "mla_jax.reference",
    "pallas_triton": "mla_jax.pallas_triton",
    "pallas_mosaic_gpu": "mla_jax.pallas_mosaic_gpu",
}
# Fastest first, as measured on the H200 over the headline grid (geomean FA3 time / impl time: 0.72 for the
# Mosaic GPU kernel, 0.61 for the Triton one; with an fp8 cache 0.71 and 0.37): Mosaic GPU where it runs (Hopper,
# bf16/fp16 q, bf16/fp16 or fp8 cache, its page sizes, not batch-invariant), else Triton.
_AUTO_ORDER = ("pallas_mosaic_gpu", "pallas_triton", "xla")


def _module(impl: str):
    if not isinstance(impl, str) or impl not in _MODULES:
        raise ValueError(f"unknown impl={impl!r}; expected one of {IMPLS + ('auto',)}")
    return importlib.import_module(_MODULES[impl])


def default_interpret() -> bool:
    """Pallas kernels run in interpret mode when JAX has no GPU."""
    return jax.default_backend() == "cpu"


def check_interpret(interpret, *, allow_none: bool = False, allow_params: bool = False) -> None:
    """Raises ValueError naming the value unless `interpret` is a bool (a truthy string or number would turn
    interpret mode on): also None where `allow_none` (the caller picks the default), and a Mosaic GPU
    `plgpu.InterpretGPUParams` where `allow_params`."""
    if isinstance(interpret, bool) or (allow_none and interpret is None):
        return
    if allow_params:
        from jax.experimental.pallas import mosaic_gpu as plgpu

        if isinstance(interpret, plgpu.InterpretGPUParams):
            return
    expected = " or ".join(["a bool"] + ["None"] * allow_none + ["a plgpu.InterpretGPUParams"] * allow_params)
    raise ValueError(f"interpret must be {expected}, got interpret={interpret!r}")


def check_device(device) -> None:
    """ValueError naming `device` unless it is None or a device: a jax.Device, or an object with its `platform`
    (a platform name such as "cpu" is not one). The Mosaic GPU kernel's `unsupported_reason` also reads
    `compute_capability` where the device has one."""
    if device is not None and (isinstance(device, str) or not hasattr(device, "platform")):
        raise ValueError(f"device must be a jax.Device or None, got device={device!r}")


def unsupported_reason(impl: str, config: MLAConfig, device=None) -> str | None:
    """Why `impl` cannot run `config` on `device` (None: it can). Interpret mode counts as running."""
    check_config(config)
    check_device(device)
    if impl == "xla":
        return None
    mod = _module(impl)
    reason = mod.unsupported_reason(config, device)
    if reason is None and impl == "pallas_mosaic_gpu" and config.batch_invariant:
        # Its split count comes from the batch (wave-efficiency heuristic over all requests).
        return "batch_invariant=True is not supported: the kernel's split-KV count depends on the batch"
    return reason


def select_impl(config: MLAConfig, device=None) -> tuple[str, dict[str, str]]:
    """The impl "auto" picks on `device` (a jax.Device, or an object with its `platform` and
    `compute_capability`; None: the default device), and why each faster one was passed over."""
    check_config(config)
    check_device(device)
    device = device or jax.devices()[0]
    skipped = {}
    for impl in _AUTO_ORDER:
        if impl != "xla" and device.platform != "gpu":
            skipped[impl] = f"device {device.platform!r} is not a GPU (interpret mode is for tests, not auto)"
            continue
        reason = unsupported_reason(impl, config, device)
        if reason is None:
            return impl, skipped
        skipped[impl] = reason
    raise AssertionError("unreachable: xla supports every valid config")


def to_jax_metadata(metadata: DecodeMetadata, device=None) -> DecodeMetadata:
    """Puts the metadata arrays on `device` as int32 jax arrays (ints stay static). A work schedule built ahead (a
    Schedule in scheduler_metadata, from a kernel module's with_schedule) goes with them; anything else there (FA3's
    schedule, the torch backend's business) is dropped."""
    check_metadata(metadata)
    check_metadata_arrays(metadata)  # integer arrays: a float or bool array would be truncated into lengths / block ids

    def put(x):
        if x is None:
            return None
        return jax.device_put(jnp.asarray(x, dtype=jnp.int32), device)

    schedule = metadata.scheduler_metadata
    return metadata.replace(
        query_start_loc=put(fits_int32("query_start_loc", metadata.query_start_loc)),
        seq_lens=put(fits_int32("seq_lens", metadata.seq_lens)),
        block_table=put(fits_int32("block_table", metadata.block_table)),
        scheduler_metadata=jax.tree.map(put, schedule) if isinstance(schedule, Schedule) else None,
    )


def fits_int32(name: str, x):
    """`x`, after checking that its values fit in int32 where they can be read (not traced) and its dtype is wider
    (mla_spec.metadata.check_fits_int32: ValueError naming the entry), so the int32 cast cannot wrap one."""
    if x is not None and not isinstance(x, jax.core.Tracer):
        dtype = np.dtype(x.dtype) if isinstance(x, (np.ndarray, jax.Array)) else None
        if dtype is None or not np.can_cast(dtype, np.int32):
            check_fits_int32(name, np.asarray(x))
    return x


def _is_concrete(x) -> bool:
    """Whether `x`'s values can be read here (a NumPy array or a JAX array outside a trace)."""
    return isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer))


def split_q(q, config: MLAConfig):
    """`(q_nope, q_pe)` from the packed q `[T, H, L+R]`, or the pair itself."""
    check_config(config)
    check_q_pair(q)
    if isinstance(q, tuple):
        return q
    if not hasattr(q, "shape") or not hasattr(q, "dtype"):
        raise ValueError(f"q must be an array, got q={type(q).__name__}")
    check_packed_q(config, tuple(q.shape))
    return q[..., : config.kv_lora_rank], q[..., config.kv_lora_rank :]


def check_jax_arrays(**arrays) -> None:
    """ValueError naming the first argument that is an array of another library (a torch tensor: it has a shape
    and a dtype, but JAX reads neither its values nor its traced form): the jitted calls take NumPy and JAX arrays.
    None and non-arrays pass here, for the callers' own checks to name."""
    for name, x in arrays.items():
        if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (np.ndarray, jax.Array)):
            raise ValueError(f"{name} must be a NumPy or JAX array, got {name}={type(x).__module__}."
                             f"{type(x).__name__}")


def array_parts(q, kv_cache, kv_name: str = "kv_cache") -> tuple:
    """q's parts (`(q,)` or `(q_nope, q_pe)`), after checking that they and kv_cache (named `kv_name` in errors)
    are NumPy or JAX arrays (ValueError naming the one that is not)."""
    check_q_pair(q)
    parts = q if isinstance(q, tuple) else (q,)
    names = ("q_nope", "q_pe") if isinstance(q, tuple) else ("q",)
    for name, x in zip(names + (kv_name,), parts + (kv_cache,)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(f"q and {kv_name} must be arrays, got {name}={type(x).__name__}")
        check_jax_arrays(**{name: x})
    return parts


def mla_decode(
    q,
    kv_cache,
    metadata: DecodeMetadata,
    config: MLAConfig,
    *,
    impl: str = "xla",
    interpret: bool | None = None,
    tuning=None,
    k_scale=1.0,
    return_impl: bool = False,
):
    """Paged MLA decode. Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`,
    or `(out, lse, impl_used)` with `return_impl=True`.

    q: `[T, H, L+R]` or `(q_nope [T,H,L], q_pe [T,H,R])`; kv_cache: `[num_blocks, P, L+R]`
    (float8_e4m3fn with kv_cache_dtype="fp8_e4m3"). k_scale: the fp8 cache's per-tensor scale
    (real value = fp8 value * k_scale): a float or a 0-d float array, a normal float32 > 0; it is a
    traced value under jax.jit (a new scale does not recompile); 1.0 for other caches.
    interpret: a bool, or None (interpret mode where JAX has no GPU); for impl="pallas_mosaic_gpu" also a
    `plgpu.InterpretGPUParams`. tuning: the Pallas kernel's (`pallas_triton.TritonConfig`, the Mosaic GPU
    kernel's config) or None for its heuristic; the xla impl (also where "auto" picks it) takes none: ValueError.
    Validates shapes and dtypes always, metadata and k_scale values when they are concrete (not
    traced), so bad input raises ValueError/NotImplementedError before any kernel runs.
    """
    check_config_and_metadata(config, metadata)
    check_interpret(interpret, allow_none=True, allow_params=impl == "pallas_mosaic_gpu")
    parts = array_parts(q, kv_cache)
    check_jax_arrays(query_start_loc=metadata.query_start_loc, seq_lens=metadata.seq_lens,
                     block_table=metadata.block_table)
    concrete = all(_is_concrete(x) for x in (metadata.query_start_loc, metadata.seq_lens, metadata.block_table))
    validate_inputs(
        config,
        metadata,
        q_shapes=tuple(tuple(x.shape) for x in parts),
        q_dtypes=tuple(dtype_name(x.dtype) for x in parts),
        kv_cache_shape=tuple(kv_cache.shape),
        kv_cache_dtype=dtype_name(kv_cache.dtype),
        check_values=concrete,
    )
    validate_k_scale(k_scale, config, concrete=not isinstance(k_scale, jax.core.Tracer))
    k_scale = jnp.asarray(k_scale, jnp.float32)
    if impl == "auto":
        impl, _ = select_impl(config)
    mod = _module(impl)
    if impl == "xla" and tuning is not None:
        raise ValueError(f"the xla impl takes no tuning (the Pallas kernels do), got tuning={tuning!r}")
    if impl != "xla":
        reason = unsupported_reason(impl, config, None)
        if reason is not None:
            raise NotImplementedError(f"impl={impl!r} cannot run this problem: {reason}")
    # The Pallas kernels read a packed q themselves (no slice copies); the jnp reference takes the parts.
    q_nope, q_pe = split_q(q, config) if impl == "xla" or isinstance(q, tuple) else (q, None)
    md = metadata
    if any(isinstance(x, np.ndarray) for x in (md.query_start_loc, md.seq_lens, md.block_table)):
        md = to_jax_metadata(md)
    elif not isinstance(md.scheduler_metadata, Schedule):  # (a work schedule built ahead stays: the kernels read it)
        md = md.replace(scheduler_metadata=None)
    if impl == "xla":
        out, lse = mod.mla_decode_jit(q_nope, q_pe, kv_cache, md, config, k_scale)
    else:
        if interpret is None:
            interpret = default_interpret()
        # k_scale is validated to be 1.0 for a non-fp8 cache, and only the fp8 paths read it
        extra = dict(k_scale=k_scale) if config.is_fp8_kv_cache else {}
        out, lse = mod.mla_decode(q_nope, q_pe, kv_cache, md, config, tuning=tuning, interpret=interpret, **extra)
    return (out, lse, impl) if return_impl else (out, lse)
