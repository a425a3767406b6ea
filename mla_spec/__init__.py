"""mla_spec: the contract shared by mla_torch and mla_jax (NumPy only).

`MLAConfig` (one layer), `DecodeMetadata` (one batch) with `validate`, the builder
`build_decode_metadata`, the seed's `split_decodes_and_prefills`, the shared call
checks `validate_inputs`, and `reference.mla_decode`, the float64 definition.
"""

from mla_spec import reference
from mla_spec.config import MLAConfig
from mla_spec.inputs import dtype_name, validate_inputs
from mla_spec.metadata import BatchSplit, DecodeMetadata, build_decode_metadata, split_decodes_and_prefills

__all__ = [
    "BatchSplit",
    "DecodeMetadata",
    "MLAConfig",
    "build_decode_metadata",
    "dtype_name",
    "reference",
    "split_decodes_and_prefills",
    "validate_inputs",
]
