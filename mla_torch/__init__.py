"""mla_torch: the canonical PyTorch path for paged MLA decode.

A port of vLLM's FlashAttnMLA backend on FlashAttention-3 (the `mla_torch.fa3` package:
FA3 discovery, the backend's builder and Impl, a full-CUDA-graph helper), beside a torch
reference that runs anywhere (`mla_torch.reference`), decode context parallelism on
top of either (`mla_torch.dcp`), and the cache write (`mla_torch.kv_cache`: vLLM's
`concat_and_cache_mla`, in place and CUDA-graph capturable). The sparse decode (DeepSeek-V3.2's top-k
attention, `mla_torch.sparse`) runs on its torch reference, on FA3 over one-token pages (vLLM's FlashAttnMLASparse,
`mla_torch.fa3.sparse`) and on FlashMLA's fp8 kernel (`mla_torch.flashmla`).

    kv_cache = mla_torch.write_kv(kv_cache, kv_c, k_pe, slot_mapping, config)
    out, lse = mla_torch.mla_decode(q, kv_cache, metadata, config, impl="fa3")
    out, lse = mla_torch.sparse_mla_decode(q, kv_cache, sparse_metadata, config, impl="flashmla",
                                           cache_format="fp8_ds_mla")
"""

from mla_torch.api import IMPLS, check_call, mla_decode, select_impl, split_q, to_torch_metadata, unsupported_reason
from mla_torch.dcp import dcp_mla_decode_local, merge_attn_states
from mla_torch.fa3 import (
    CAPTURE_SIZE_MSG,
    BucketGraphs,
    FA3DecodeGraph,
    FA3Provider,
    FA3UnavailableError,
    FlashAttnMLABackend,
    FlashAttnMLADecodeMetadata,
    FlashAttnMLAImpl,
    FlashAttnMLAMetadata,
    FlashAttnMLAMetadataBuilder,
    MultipleOf,
    fa3_unavailable_reason,
    find_fa3,
    scheduler_metadata_buffer_size,
)
from mla_torch.kv_cache import quantize_fp8, quantize_sparse_fp8, write_kv
from mla_torch.sparse import SPARSE_IMPLS, sparse_mla_decode, sparse_unsupported_reason, to_torch_sparse_metadata

__all__ = [
    "BucketGraphs",
    "CAPTURE_SIZE_MSG",
    "FA3DecodeGraph",
    "FA3Provider",
    "FA3UnavailableError",
    "FlashAttnMLABackend",
    "FlashAttnMLADecodeMetadata",
    "FlashAttnMLAImpl",
    "FlashAttnMLAMetadata",
    "FlashAttnMLAMetadataBuilder",
    "IMPLS",
    "MultipleOf",
    "SPARSE_IMPLS",
    "check_call",
    "dcp_mla_decode_local",
    "fa3_unavailable_reason",
    "find_fa3",
    "merge_attn_states",
    "mla_decode",
    "quantize_fp8",
    "quantize_sparse_fp8",
    "scheduler_metadata_buffer_size",
    "select_impl",
    "sparse_mla_decode",
    "sparse_unsupported_reason",
    "split_q",
    "to_torch_metadata",
    "to_torch_sparse_metadata",
    "unsupported_reason",
    "write_kv",
]
