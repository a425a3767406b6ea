"""The seed's metadata classes and builder: `mla_spec.DecodeMetadata` in, FA3's inputs out.

`FlashAttnMLAMetadataBuilder.build` validates a batch's metadata, moves it to the device
as int32 tensors and computes FA3's ahead-of-time schedule (`get_scheduler_metadata`,
once per batch), so that the decode call itself reads no host values. In
full-CUDA-graph mode the schedule goes into one persistent int32 buffer, tail-zeroed on
every build, and the split count is bounded for batches up to the capture size, so that
a captured graph's buffers fit every batch it replays.

FA3 facts the builder relies on (vLLM 0.33.0's bundled
`vllm_flash_attn/flash_attn_interface.py` and `hopper/flash_api.cpp` of
vllm-project/flash-attention; tests/test_fa3.py's GPU part checks them on Hopper):
- `get_scheduler_metadata` returns int32 `[int(needs_semaphore) + round_up(B, 4) * V]`
  with V <= 4 prepare vectors (prepare_varlen, dynamic_split, sort_batches,
  head_swizzle); the seed's bound `1 + round_up(B, 4) * 4` covers it. The kernel checks
  that a given `scheduler_metadata` has exactly that size, hence the slice `[:n]`.
  V depends on B, on `num_splits > 1` and on causality, and FA3 drops causality when
  `max_seqlen_q == 1`; a captured graph therefore replays only schedules built for the
  same B, `max_seqlen_q` and `num_splits` (see `mla_torch.fa3.graph`).
- 992 is FA3's `PREPARE_VARLEN_MAX_BATCHES_1CTA`: above it FA3 drops dynamic split.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from mla_spec import DecodeMetadata, MLAConfig
from mla_spec.config import check_config
from mla_spec.metadata import first_outside_int32
from mla_torch.api import check_holds_data
from mla_torch.fa3 import providers
from mla_torch.fa3.providers import FA3Provider

__all__ = [
    "CAPTURE_SIZE_MSG",
    "FlashAttnMLADecodeMetadata",
    "FlashAttnMLAMetadata",
    "FlashAttnMLAMetadataBuilder",
    "MAX_CAPTURE_SIZE",
    "TORCH_DTYPES",
    "cpu_int32",
    "round_up",
    "scheduler_metadata_buffer_size",
    "torch_dtype",
]

# FA3's PREPARE_VARLEN_MAX_BATCHES_1CTA, which the seed enforces on full-graph captures,
# and the seed's message.
MAX_CAPTURE_SIZE = 992
CAPTURE_SIZE_MSG = "Capture size larger than 992 is not supported for full cuda graph."

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def scheduler_metadata_buffer_size(max_batch_size: int) -> int:
    """The seed's persistent buffer size: `1 + round_up(max_batch_size, 4) * 4`.

    FA3's layout: one tile-count semaphore (the +1) after up to 4 int32 vectors of
    `round_up(B, 4)` entries (prepare_varlen, dynamic_split, sort_batches, head_swizzle).
    """
    return 1 + round_up(max_batch_size, 4) * 4


def torch_dtype(name: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype={name!r}; expected one of {tuple(TORCH_DTYPES)}") from None


@dataclasses.dataclass
class FlashAttnMLADecodeMetadata:
    """The seed's decode metadata (MLACommonDecodeMetadata's block_table/seq_lens plus
    FlashAttnMLA's fields), int32 tensors on the device."""

    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    scheduler_metadata: torch.Tensor | None = None
    max_num_splits: int = 0
    # Not in the seed: the page size the builder scheduled FA3 with (its config's block size),
    # so that the Impl can refuse a cache paged otherwise. None: not checked.
    page_size: int | None = None


@dataclasses.dataclass
class FlashAttnMLAMetadata:
    """MLACommonMetadata, decode-only: every request of the batch is a decode."""

    num_reqs: int
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    decode: FlashAttnMLADecodeMetadata | None = None


_INT32_MIN, _INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
_TORCH_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                     torch.uint16, torch.uint32, torch.uint64)


def cpu_int32(name: str, x) -> torch.Tensor:
    """`x` (NumPy array, sequence or torch tensor) as a host int32 tensor, for the builder
    and `FA3DecodeGraph`.

    Non-integer dtypes and values outside int32 are refused before converting (a plain cast
    would truncate 8.9 to 8 and wrap 2**32 + 5 to 5), naming `name` and the value. A device
    tensor is copied to the host first and only the host copy is read, so the checks add no
    device sync."""
    if isinstance(x, torch.Tensor):
        if x.dtype not in _TORCH_INT_DTYPES:
            raise ValueError(f"{name} must hold integers, got {name}.dtype={x.dtype}")
        check_holds_data(name, x)
        host = x.detach().to(device="cpu")
        if host.dtype == torch.int32:
            return host
        arr = host.numpy()
    else:
        arr = np.asarray(x)
        if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"{name} must hold integers, got {name}.dtype={arr.dtype}")
    idx = first_outside_int32(arr)
    if idx is not None:
        raise ValueError(
            f"{name} must fit in int32 [{_INT32_MIN}, {_INT32_MAX}], got {name}[{', '.join(map(str, idx))}]="
            f"{int(arr[idx])}"
        )
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.int32))


class FlashAttnMLAMetadataBuilder:
    """Builds `FlashAttnMLAMetadata` from `mla_spec.DecodeMetadata`, with FA3's
    ahead-of-time schedule, as the seed's builder (UNIFORM_BATCH cudagraph support,
    VARLEN query lengths)."""

    reorder_batch_threshold: int = 512  # process small prefills with decode pathway

    def __init__(self, config: MLAConfig, device, *, use_full_cuda_graph: bool = False,
                 fa3_provider: FA3Provider | None = None):
        """`fa3_provider`: a given provider (tests); None looks one up, lazily, at the
        first schedule."""
        check_config(config)
        self.config = config
        self.device = torch.device(device)
        self.num_heads = config.num_heads
        self.dcp_world_size = config.dcp_world_size
        self.page_size = config.page_size
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.dtype = torch_dtype(config.dtype)  # the seed's kv_cache_spec.dtype (kv_cache_dtype="auto")
        # The seed's threshold: 512, or 1 with DCP (vLLM masks only single-token queries under
        # DCP); MLAConfig derives it.
        self.reorder_batch_threshold = config.reorder_batch_threshold
        self._fa3_provider = fa3_provider

        self.max_num_splits = 0  # No upper bound on the number of splits.
        self.use_full_cuda_graph = bool(use_full_cuda_graph)
        self.max_cudagraph_size = config.max_capture_size
        self.scheduler_metadata: torch.Tensor | None = None

        if self.use_full_cuda_graph:
            if self.max_cudagraph_size > MAX_CAPTURE_SIZE:
                # This condition derives from FA3's internal heuristic.
                raise ValueError(f"{CAPTURE_SIZE_MSG} (max_capture_size={self.max_cudagraph_size})")
            max_batch_size = max(config.max_num_seqs, self.max_cudagraph_size or 0)
            self.scheduler_metadata = torch.zeros(
                scheduler_metadata_buffer_size(max_batch_size), dtype=torch.int32, device=self.device
            )
            # When using cuda graph, we need to set the upper bound of the number of
            # splits so that large enough intermediate buffers are pre-allocated during
            # capture.
            self.max_num_splits = config.max_num_splits_for_cuda_graph

    def _fa3(self) -> FA3Provider:
        if self._fa3_provider is None:
            self._fa3_provider = providers.require_fa3(self.device)
        return self._fa3_provider

    def _schedule_decode(self, num_reqs, cu_query_lens, max_query_len, seqlens, max_seq_len, causal, max_num_splits):
        """FA3's ahead-of-time schedule for one batch (the seed's `fa_aot_schedule` path, the
        only one with FA3)."""
        return self._fa3().get_scheduler_metadata(
            batch_size=num_reqs,
            max_seqlen_q=max_query_len,
            max_seqlen_k=max_seq_len,
            num_heads_q=self.num_heads * self.dcp_world_size,
            num_heads_kv=1,
            headdim=self.qk_rope_head_dim,
            cache_seqlens=seqlens,
            qkv_dtype=self.dtype,
            headdim_v=self.kv_lora_rank,
            page_size=self.page_size,
            cu_seqlens_q=cu_query_lens,
            causal=causal,
            num_splits=max_num_splits,
        )

    def _max_num_splits(self, num_decode_tokens: int) -> int:
        # NOTE(woosuk): Setting num_splits > 1 may increase the memory usage, because the
        # intermediate buffers of size [num_splits, num_heads, num_tokens, head_size] are
        # allocated. Therefore, we only set num_splits when using cuda graphs.
        if (
            self.use_full_cuda_graph
            and self.max_cudagraph_size is not None
            and num_decode_tokens <= self.max_cudagraph_size
        ):
            return self.max_num_splits
        return 0

    def _build_decode(
        self,
        block_table_tensor: torch.Tensor,
        seq_lens_device: torch.Tensor,
        max_seq_len: int,
        query_start_loc_cpu: torch.Tensor,
        query_start_loc_device: torch.Tensor,
        num_decode_tokens: int,
        *,
        max_query_len: int | None = None,
        max_num_splits: int | None = None,
    ) -> FlashAttnMLADecodeMetadata:
        """The seed's `_build_decode`. Two keyword overrides, not in the seed:
        `max_query_len` (a pinned value for graph replays; default: computed from
        `query_start_loc_cpu` as the seed does) and `max_num_splits` (a requested split
        count; default: the seed's rule; in full-cuda-graph mode at most
        `max_num_splits_for_cuda_graph`, else ValueError). With `config.batch_invariant` the split count is 1,
        whatever was requested, as the seed does under VLLM_BATCH_INVARIANT."""
        if max_query_len is None:
            query_lens_cpu = query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]
            max_query_len = int(query_lens_cpu.max().item())

        # For Flash Attention MLA + full cudagraph
        if max_num_splits is None:
            max_num_splits = self._max_num_splits(num_decode_tokens)
        if self.config.batch_invariant:
            # The seed: `if vllm_is_batch_invariant(): max_num_splits = 1`. One split whatever
            # the batch, so that a request's result does not depend on the others.
            max_num_splits = 1
        if self.use_full_cuda_graph and max_num_splits > self.max_num_splits:
            # Only a requested count (this port's addition) can get here: the seed never asks
            # for more than its bound in full-cuda-graph mode, which sizes the split buffers.
            raise ValueError(
                f"max_num_splits={max_num_splits} exceeds max_num_splits_for_cuda_graph={self.max_num_splits}: "
                "in full-cuda-graph mode FA3's intermediate split buffers are sized for that bound"
            )

        scheduler_metadata = self._schedule_decode(
            num_reqs=seq_lens_device.shape[0],
            cu_query_lens=query_start_loc_device,
            max_query_len=max_query_len,
            seqlens=seq_lens_device,
            max_seq_len=max_seq_len,
            causal=True,
            max_num_splits=max_num_splits,
        )

        if self.use_full_cuda_graph and scheduler_metadata is not None:
            n = scheduler_metadata.shape[0]
            buffer_size = self.scheduler_metadata.shape[0]
            # Ensure the persistent buffer is large enough
            if n > buffer_size:
                raise ValueError(
                    f"Scheduler metadata size {n} exceeds buffer size {buffer_size} "
                    f"(batch_size={seq_lens_device.shape[0]}, max_num_seqs={self.config.max_num_seqs}, "
                    f"max_capture_size={self.config.max_capture_size})"
                )
            self.scheduler_metadata[:n] = scheduler_metadata
            # NOTE(woosuk): We should zero out the rest of the scheduler metadata to
            # guarantee the correctness. Otherwise, some thread blocks may use the invalid
            # scheduler metadata and overwrite the output buffer.
            self.scheduler_metadata[n:] = 0
            scheduler_metadata = self.scheduler_metadata[:n]

        return FlashAttnMLADecodeMetadata(
            block_table=block_table_tensor,
            seq_lens=seq_lens_device,
            query_start_loc=query_start_loc_device,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            scheduler_metadata=scheduler_metadata,
            max_num_splits=max_num_splits,
            page_size=self.page_size,
        )

    def build(self, metadata: DecodeMetadata, num_blocks: int | None = None) -> FlashAttnMLAMetadata:
        """Validates `metadata` (NumPy arrays or torch tensors), moves it to the device as
        int32 tensors and computes FA3's schedule. `num_blocks` (the cache's first
        dimension) enables the block-id range check.

        `metadata.max_seq_len` is used as given (an upper bound is fine); `max_query_len`
        is recomputed from `query_start_loc` as the seed does; `metadata.max_num_splits > 0`
        requests that split count (in full-cuda-graph mode at most the config's
        `max_num_splits_for_cuda_graph`, else ValueError), 0 keeps the seed's rule. `metadata.scheduler_metadata`
        is ignored: the schedule is always recomputed."""
        if not isinstance(metadata, DecodeMetadata):
            raise ValueError(f"metadata must be an mla_spec.DecodeMetadata, got {type(metadata).__name__}")
        qsl_cpu = cpu_int32("query_start_loc", metadata.query_start_loc)
        seq_lens_cpu = cpu_int32("seq_lens", metadata.seq_lens)
        block_table_cpu = cpu_int32("block_table", metadata.block_table)
        host = metadata.replace(
            query_start_loc=qsl_cpu.numpy(), seq_lens=seq_lens_cpu.numpy(), block_table=block_table_cpu.numpy()
        )
        host.validate(self.config, num_blocks=num_blocks)
        query_start_loc_device = qsl_cpu.to(self.device)
        seq_lens_device = seq_lens_cpu.to(self.device)
        block_table_tensor = block_table_cpu.to(self.device)
        decode = self._build_decode(
            block_table_tensor=block_table_tensor,
            seq_lens_device=seq_lens_device,
            max_seq_len=int(metadata.max_seq_len),
            query_start_loc_cpu=qsl_cpu,
            query_start_loc_device=query_start_loc_device,
            num_decode_tokens=int(metadata.num_decode_tokens),
            max_num_splits=int(metadata.max_num_splits) or None,
        )
        num_reqs = int(seq_lens_cpu.shape[0])
        return FlashAttnMLAMetadata(
            num_reqs=num_reqs,
            num_actual_tokens=int(metadata.num_decode_tokens),
            num_decodes=num_reqs,
            num_decode_tokens=int(metadata.num_decode_tokens),
            decode=decode,
        )

