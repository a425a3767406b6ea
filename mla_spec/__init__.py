"""mla_spec: the contract shared by mla_torch and mla_jax (NumPy only).

Both stacks take the same config, the same metadata and the same checks from here, so
that a problem means one thing on both and a bad input gets one message:
`MLAConfig` (one layer), `DecodeMetadata` (one batch) with `validate`, the builder
`build_decode_metadata` (with `Bucket` / `pad_to_bucket` for a serving loop's static shapes), vLLM's decode/prefill split `split_decodes_and_prefills`, the
shared call checks `validate_inputs` (and `validate_k_scale` for an fp8 cache), the cache
write's checks `validate_write_kv` / `validate_slot_mapping`, the fp8 cache's quantization
rule (`mla_spec.fp8`), and `reference.mla_decode`, the float64 definition every
implementation is compared with.

The sparse decode (DeepSeek-V3.2's top-k attention) has its contract beside it: `SparseMetadata` (the top-k
slots of each query token) with `build_sparse_metadata` and `validate_sparse_inputs` (`mla_spec.sparse`), FlashMLA's
656-byte fp8 cache layout (`mla_spec.fp8_sparse`), and `reference.sparse_mla_decode`.

"The seed" in these modules is vLLM's FlashAttnMLA backend
(`vllm/v1/attention/backends/mla/flashattn_mla.py`), which `mla_torch.fa3` ports: its
names, defaults and error messages are kept so that the contract reads as vLLM's.
"""

from mla_spec import fp8, fp8_sparse, reference, sparse
from mla_spec.config import MLAConfig
from mla_spec.fp8 import FP8_E4M3_MAX, fp8_k_scale, quantize_fp8
from mla_spec.fp8_sparse import dequantize_sparse_fp8, quantize_sparse_fp8
from mla_spec.inputs import (
    check_config_and_metadata,
    check_kv_cache,
    dtype_name,
    expected_kv_cache_dtype,
    validate_inputs,
    validate_k_scale,
    validate_slot_mapping,
    validate_write_kv,
    validate_write_kv_arrays,
)
from mla_spec.metadata import (
    BatchSplit,
    Bucket,
    DecodeMetadata,
    build_decode_metadata,
    capture_size_buckets,
    pad_to_bucket,
    smallest_bucket,
    split_decodes_and_prefills,
)
from mla_spec.sparse import (
    SPARSE_CACHE_FORMATS,
    SparseMetadata,
    build_sparse_metadata,
    validate_sparse_inputs,
)

__all__ = [
    "BatchSplit",
    "Bucket",
    "DecodeMetadata",
    "FP8_E4M3_MAX",
    "MLAConfig",
    "SPARSE_CACHE_FORMATS",
    "SparseMetadata",
    "build_decode_metadata",
    "build_sparse_metadata",
    "capture_size_buckets",
    "check_config_and_metadata",
    "check_kv_cache",
    "dequantize_sparse_fp8",
    "dtype_name",
    "expected_kv_cache_dtype",
    "fp8",
    "fp8_k_scale",
    "fp8_sparse",
    "pad_to_bucket",
    "quantize_fp8",
    "quantize_sparse_fp8",
    "reference",
    "smallest_bucket",
    "sparse",
    "split_decodes_and_prefills",
    "validate_inputs",
    "validate_k_scale",
    "validate_slot_mapping",
    "validate_sparse_inputs",
    "validate_write_kv",
    "validate_write_kv_arrays",
]
