"""`mla_torch.mla_decode`: one entry point, several implementations.

impl:
  "reference"  torch reference (CPU or GPU tensors, float32 compute)
  "fa3"        vLLM's FlashAttnMLA path on FlashAttention-3 (Hopper), see `mla_torch.fa3`
  "auto"       "fa3" where it can run, else "reference"
"""

from __future__ import annotations

import numpy as np
import torch

from mla_spec import DecodeMetadata, MLAConfig, check_config_and_metadata, dtype_name, validate_inputs, validate_k_scale
from mla_spec.config import check_config
from mla_spec.inputs import check_packed_q, check_q_pair
from mla_spec.metadata import check_fits_int32, check_metadata, check_metadata_arrays
from mla_torch import reference

IMPLS = ("reference", "fa3")


def _as_tensor(x) -> torch.Tensor:
    """`x` (a tensor, or an array-like) as a tensor; NumPy views of any strides (negative ones, e.g. `a[::-1]`,
    which torch.from_numpy refuses) are copied to contiguous memory first."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return torch.as_tensor(np.ascontiguousarray(x))


def to_torch_metadata(metadata: DecodeMetadata, device) -> DecodeMetadata:
    """The same metadata with int32 torch tensors on `device`."""
    check_metadata(metadata)
    check_metadata_arrays(metadata)  # integer arrays: a float or bool array would be truncated into lengths / block ids

    def put(name, x):
        return None if x is None else int32_tensor(name, x).to(device=device)

    return metadata.replace(
        query_start_loc=put("query_start_loc", metadata.query_start_loc),
        seq_lens=put("seq_lens", metadata.seq_lens),
        block_table=put("block_table", metadata.block_table),
    )


_NARROW_INTS = (torch.int8, torch.int16, torch.int32, torch.uint8, torch.bool)


def int32_tensor(name: str, x) -> torch.Tensor:
    """`x` as an int32 tensor on its device, after checking that its values fit in int32 where its dtype is wider
    (mla_spec.metadata.check_fits_int32: ValueError naming the entry; it reads the values, on the host), so the
    cast cannot wrap one."""
    t = _as_tensor(x)
    if t.dtype not in _NARROW_INTS and t.numel():
        check_fits_int32(name, t.detach().cpu().numpy())
    return t.to(dtype=torch.int32)


def split_q(q, config: MLAConfig):
    """`(q_nope, q_pe)` from the packed q `[T, H, L+R]` (views), or the pair itself."""
    check_config(config)
    check_q_pair(q)
    if isinstance(q, tuple):
        return q
    if not isinstance(q, torch.Tensor):
        raise ValueError(f"q must be a torch.Tensor, got q={type(q).__name__}")
    check_packed_q(config, tuple(q.shape))
    return torch.split(q, [config.kv_lora_rank, config.qk_rope_head_dim], dim=-1)


def tensor_parts(q, kv_cache) -> tuple:
    """q's parts (`(q,)` or `(q_nope, q_pe)`), after checking that they and kv_cache are torch tensors holding data
    (ValueError naming the one that is not)."""
    check_q_pair(q)
    parts = q if isinstance(q, tuple) else (q,)
    names = ("q_nope", "q_pe") if isinstance(q, tuple) else ("q",)
    for name, x in zip(names + ("kv_cache",), parts + (kv_cache,)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"q and kv_cache must be torch tensors, got {name}={type(x).__name__}")
        check_holds_data(name, x)
    return parts


def check_holds_data(name: str, x: torch.Tensor) -> None:
    """Raises ValueError naming `name` where the tensor `x` is a meta tensor (it has no data to read)."""
    if x.is_meta:
        raise ValueError(f"{name} must hold data (a CPU or GPU tensor), got a tensor on device={str(x.device)!r}")


def check_metadata_data(metadata, name: str = "") -> None:
    """Raises ValueError naming the field unless each torch tensor among the metadata's arrays holds data (a meta
    tensor has none to read): as `tensor_parts` refuses meta q and kv_cache. `name`: the metadata argument's name,
    prefixed to the field's ("metadata_shards." gives metadata_shards.block_table)."""
    for field in ("query_start_loc", "seq_lens", "block_table", "indices", "topk_length"):
        x = getattr(metadata, field, None)
        if isinstance(x, torch.Tensor):
            check_holds_data(f"{name}{field}", x)


def check_same_device(tensors, names, what: str) -> None:
    """Raises ValueError naming the first tensor whose device differs from the first one's (a static comparison:
    no sync); `what` says which tensors must share it ("q and kv_cache must be")."""
    for x, name in zip(tensors, names):
        if x.device != tensors[0].device:
            raise ValueError(f"{what} on one device, got {names[0]}.device={str(tensors[0].device)!r}, "
                             f"{name}.device={str(x.device)!r}")


def check_one_device(parts, kv_cache) -> None:
    """q's parts (`tensor_parts`) and kv_cache on one device."""
    names = ("q_nope", "q_pe") if len(parts) == 2 else ("q",)
    check_same_device(parts + (kv_cache,), names + ("kv_cache",), "q and kv_cache must be")


def check_call(q, kv_cache, metadata: DecodeMetadata, config: MLAConfig) -> None:
    """The shared input checks (mla_spec.validate_inputs) on torch tensors."""
    parts = tensor_parts(q, kv_cache)
    validate_inputs(
        config,
        metadata,
        q_shapes=tuple(tuple(x.shape) for x in parts),
        q_dtypes=tuple(dtype_name(x.dtype) for x in parts),
        kv_cache_shape=tuple(kv_cache.shape),
        kv_cache_dtype=dtype_name(kv_cache.dtype),
    )
    check_one_device(parts, kv_cache)


def _host(x):
    return x.cpu() if isinstance(x, torch.Tensor) else _as_tensor(x)


def unsupported_reason(impl: str, config: MLAConfig, device=None) -> str | None:
    """Why `impl` cannot run `config` on `device` (None: it can). The reference runs everything."""
    check_config(config)
    if impl == "reference":
        return None
    if impl == "fa3":
        from mla_torch import fa3

        return fa3.unsupported_reason(config, device)
    raise ValueError(f"unknown impl={impl!r}; expected one of {IMPLS + ('auto',)}")


def select_impl(config: MLAConfig, device=None) -> tuple[str, dict[str, str]]:
    """The impl "auto" picks, and why FA3 was passed over if it was."""
    reason = unsupported_reason("fa3", config, device)
    if reason is None:
        return "fa3", {}
    return "reference", {"fa3": reason}


def mla_decode(q, kv_cache, metadata: DecodeMetadata, config: MLAConfig, *, impl: str = "reference", k_scale=1.0,
               return_impl=False):
    """Paged MLA decode. Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`,
    or `(out, lse, impl_used)` with `return_impl=True`.

    q: `[T, H, L+R]` or `(q_nope [T,H,L], q_pe [T,H,R])`; kv_cache: `[num_blocks, P, L+R]`
    (torch.float8_e4m3fn with kv_cache_dtype="fp8_e4m3"); metadata: `mla_spec.DecodeMetadata`
    (NumPy arrays, or torch tensors). k_scale: the fp8 cache's per-tensor scale (real value =
    fp8 value * k_scale; a float or a 0-d float tensor, finite, > 0), 1.0 otherwise. FP8 runs on
    the reference only: impl="fa3" raises the seed's NotImplementedError.
    """
    if impl not in IMPLS + ("auto",):
        raise ValueError(f"unknown impl={impl!r}; expected one of {IMPLS + ('auto',)}")
    check_config_and_metadata(config, metadata)  # (before anything reads them)
    check_metadata_arrays(metadata)  # (None or a list would reach torch.as_tensor)
    check_metadata_data(metadata)
    host_md = metadata.replace(
        query_start_loc=_host(metadata.query_start_loc).numpy(),
        seq_lens=_host(metadata.seq_lens).numpy(),
        block_table=_host(metadata.block_table).numpy(),
    )
    check_call(q, kv_cache, host_md, config)
    k_scale = validate_k_scale(k_scale, config)
    device = kv_cache.device
    if impl == "auto":
        impl, _ = select_impl(config, device)
    q_nope, q_pe = split_q(q, config)
    if impl == "reference":
        md = to_torch_metadata(host_md, "cpu")
        out, lse = reference.mla_decode(
            q_nope, q_pe, kv_cache, md.query_start_loc, md.seq_lens, md.block_table, config, k_scale=k_scale
        )
    else:
        from mla_torch import fa3

        out, lse = fa3.mla_decode(q, kv_cache, host_md, config)
    return (out, lse, impl) if return_impl else (out, lse)
