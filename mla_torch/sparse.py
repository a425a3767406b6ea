"""`mla_torch.sparse_mla_decode`: the sparse decode (DeepSeek-V3.2's top-k attention, `mla_spec.sparse`), one entry
point, several implementations.

impl:
  "reference"  torch reference (CPU or GPU tensors, float32 compute), either cache format
  "fa3"        FA3 over one-token pages, vLLM's FlashAttnMLASparse (`mla_torch.fa3.sparse`), cache_format "auto"
  "flashmla"   FlashMLA's fp8 sparse decode (`mla_torch.flashmla`), cache_format "fp8_ds_mla"

The indexer runs per layer, so the indices are usually a device tensor made that layer: their values are checked
only where reading them is free (NumPy arrays and CPU tensors); on a GPU an entry out of range is a device-side
indexing error (the reference) or reads other memory (the kernels).
"""

from __future__ import annotations

import torch

from mla_spec import MLAConfig, SparseMetadata, dtype_name, validate_sparse_inputs
from mla_spec.config import check_config
from mla_spec.sparse import check_cache_format, check_sparse_metadata
from mla_torch import sparse_reference
from mla_torch.api import check_metadata_data, check_one_device, int32_tensor, split_q, tensor_parts

SPARSE_IMPLS = ("reference", "fa3", "flashmla")


def to_torch_sparse_metadata(metadata: SparseMetadata, device) -> SparseMetadata:
    """The same metadata with int32 torch tensors on `device`."""
    check_sparse_metadata(metadata)

    def put(name, x):
        return None if x is None else int32_tensor(name, x).to(device=device)

    return metadata.replace(indices=put("indices", metadata.indices), topk_length=put("topk_length", metadata.topk_length))


def sparse_unsupported_reason(impl: str, config: MLAConfig, device=None, *, cache_format: str = "auto") -> str | None:
    """Why `impl` cannot run `config` with `cache_format` on `device` (None: it can). The reference runs
    everything."""
    check_config(config)
    check_cache_format(cache_format)
    if impl == "reference":
        return None
    if impl == "fa3":
        from mla_torch.fa3 import sparse as fa3_sparse

        return fa3_sparse.unsupported_reason(config, device, cache_format)
    if impl == "flashmla":
        from mla_torch import flashmla

        return flashmla.unsupported_reason(config, device, cache_format)
    raise ValueError(f"unknown impl={impl!r}; expected one of {SPARSE_IMPLS}")


def _readable(x) -> bool:
    """Whether `x`'s values can be read without a device sync: a NumPy array or a CPU tensor."""
    return not isinstance(x, torch.Tensor) or x.device.type == "cpu"


def sparse_mla_decode(q, kv_cache, metadata: SparseMetadata, config: MLAConfig, *, impl: str = "reference",
                      cache_format: str = "auto", check_values: bool | None = None):
    """The sparse decode. Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`.

    q: `[T, H, L+R]` or `(q_nope [T,H,L], q_pe [T,H,R])` in config.dtype; kv_cache: `[num_blocks, page_size,
    L+R]` in config.dtype (cache_format "auto") or `uint8 [num_blocks, page_size, 656]` (cache_format
    "fp8_ds_mla"); metadata: `mla_spec.SparseMetadata` of NumPy arrays or integer tensors (moved to the cache's
    device). check_values: read the indices and topk_length and refuse values out of range; default: when they
    are NumPy arrays or CPU tensors (free to read), never for GPU tensors (no host sync).
    """
    if impl not in SPARSE_IMPLS:
        raise ValueError(f"unknown impl={impl!r}; expected one of {SPARSE_IMPLS}")
    check_config(config)
    check_sparse_metadata(metadata)
    check_metadata_data(metadata)
    parts = tensor_parts(q, kv_cache)
    if check_values is None:
        check_values = _readable(metadata.indices) and _readable(metadata.topk_length)
    validate_sparse_inputs(
        config,
        metadata,
        q_shapes=tuple(tuple(x.shape) for x in parts),
        q_dtypes=tuple(dtype_name(x.dtype) for x in parts),
        kv_cache_shape=tuple(kv_cache.shape),
        kv_cache_dtype=dtype_name(kv_cache.dtype),
        cache_format=cache_format,
        check_values=check_values,
    )
    check_one_device(parts, kv_cache)
    device = kv_cache.device
    if impl != "reference":
        reason = sparse_unsupported_reason(impl, config, device, cache_format=cache_format)
        if reason is not None:
            raise NotImplementedError(f"impl={impl!r} cannot run this problem: {reason}")
    md = to_torch_sparse_metadata(metadata, device)
    if impl == "reference":
        q_nope, q_pe = split_q(q, config)
        return sparse_reference.sparse_mla_decode(q_nope, q_pe, kv_cache, md.indices, md.topk_length, config,
                                                  cache_format=cache_format)
    if impl == "fa3":
        from mla_torch.fa3 import sparse as fa3_sparse

        return fa3_sparse.sparse_mla_decode(q, kv_cache, md.indices, md.topk_length, config)
    from mla_torch import flashmla

    return flashmla.sparse_mla_decode(q, kv_cache, md.indices, md.topk_length, config)
