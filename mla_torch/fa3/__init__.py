"""FlashAttnMLA on FlashAttention-3: paged MLA decode on Hopper, vLLM's way.

A port of vLLM's `vllm/v1/attention/backends/mla/flashattn_mla.py` ("the seed" in these
modules) onto `mla_spec`. It keeps the seed's class names and roles, its ahead-of-time
FA3 schedule, its full-CUDA-graph handling, its error messages and its FA3 call, so
that this path computes what vLLM computes. It replaces vLLM's `VllmConfig` and layer
plumbing by `mla_spec.MLAConfig`, the common-attention metadata by
`mla_spec.DecodeMetadata`, bare `assert`s by `ValueError`s, and the import-time FA3
import by a lazy lookup, so that the package imports without CUDA.

- `providers`: finds an FA3 build with the MLA head dims, or says why none runs here.
- `metadata`: the seed's metadata classes and builder (int32 device tensors plus
  FA3's schedule).
- `impl`: the seed's backend and Impl (the FA3 call), and `mla_decode` /
  `unsupported_reason`, behind `mla_torch.mla_decode(impl="fa3")`.
- `graph`: `FA3DecodeGraph`, one decode captured in a full CUDA graph and replayed
  with other batches, and `BucketGraphs`, one such graph a bucket of a serving loop.
- `sparse`: the sparse decode (DeepSeek-V3.2's top-k attention) on FA3's paged path over
  one-token pages, vLLM's FlashAttnMLASparse (behind `mla_torch.sparse_mla_decode(impl="fa3")`).

    from mla_torch import fa3
    out, lse = fa3.mla_decode(q, kv_cache, metadata, config)
"""

from mla_torch.fa3.providers import (
    MLA_HEAD_DIMS,
    NOT_SUPPORTED_ON_DEVICE_MSG,
    FA3Provider,
    FA3UnavailableError,
    fa3_unavailable_reason,
    find_fa3,
)
from mla_torch.fa3.metadata import (
    CAPTURE_SIZE_MSG,
    MAX_CAPTURE_SIZE,
    FlashAttnMLADecodeMetadata,
    FlashAttnMLAMetadata,
    FlashAttnMLAMetadataBuilder,
    round_up,
    scheduler_metadata_buffer_size,
)
from mla_torch.fa3.impl import (
    FP8_KV_CACHE_DTYPES,
    KNOWN_KV_CACHE_DTYPES,
    FlashAttnMLABackend,
    FlashAttnMLAImpl,
    MultipleOf,
    is_quantized_kv_cache,
    mla_decode,
    unsupported_reason,
)
from mla_torch.fa3.graph import BucketGraphs, FA3DecodeGraph

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
    "MultipleOf",
    "fa3_unavailable_reason",
    "find_fa3",
    "mla_decode",
    "scheduler_metadata_buffer_size",
    "unsupported_reason",
]
