"""FlashAttnMLA on FlashAttention-3: a port of vLLM's
`vllm/v1/attention/backends/mla/flashattn_mla.py` (the "seed") onto `mla_spec`.

What is kept from the seed: the class names and roles (`FlashAttnMLABackend`,
`FlashAttnMLADecodeMetadata`, `FlashAttnMLAMetadata`, `FlashAttnMLAMetadataBuilder`,
`FlashAttnMLAImpl`), the builder's ahead-of-time FA3 schedule
(`get_scheduler_metadata` once per batch), the full-CUDA-graph handling (a persistent
int32 scheduler-metadata buffer, tail-zeroed on every build; `max_num_splits` bounded
only for batches up to the capture size; the capture-size check of 992), the
`reorder_batch_threshold` (512, or 1 with DCP), the Impl's `NotImplementedError`
messages, and the FA3 call itself (`q=q_pe, k=k_pe_cache.unsqueeze(-2),
v=kv_c_cache.unsqueeze(-2), q_v=q_nope, ..., causal=True, fa_version=3`), whose LSE
comes back `[H, T]` and is transposed to `[T, H]`.

What is replaced: vLLM's `VllmConfig` / `AttentionSpec` / layer plumbing by
`mla_spec.MLAConfig`, the common-attention metadata by `mla_spec.DecodeMetadata`,
bare `assert`s by `ValueError`s (plus cheap checks of its own: the Impl's arguments, the
shapes/dtypes/page size of each forward call from tensor metadata only, the builder's int32
conversion, the full-CUDA-graph split bound), and the import-time `from vllm.vllm_flash_attn import
...` by a lazy provider lookup (`find_fa3`), so that this module imports, and its
host-side logic runs, on a machine without CUDA.

FA3 facts this module relies on (read from vLLM 0.33.0's bundled
`vllm_flash_attn/flash_attn_interface.py` and from `hopper/flash_api.cpp` of
vllm-project/flash-attention; to be confirmed on the H200 by tests/test_fa3.py):
- `get_scheduler_metadata` returns int32 `[int(needs_semaphore) + round_up(B, 4) * V]`
  with V <= 4 prepare vectors (prepare_varlen, dynamic_split, sort_batches,
  head_swizzle); the seed's bound `1 + round_up(B, 4) * 4` covers it. The kernel checks
  that a given `scheduler_metadata` has exactly that size, hence the slice `[:n]`.
  V depends on B, on `num_splits > 1` and on causality, and causality is dropped by FA3
  when `max_seqlen_q == 1`; a captured graph must therefore be replayed with schedules
  built for the same B, `max_seqlen_q` and `num_splits` (see `FA3DecodeGraph`).
- 992 is FA3's `PREPARE_VARLEN_MAX_BATCHES_1CTA`: above it FA3 drops dynamic split.
- The MLA shape (q/k head dim 64 with `q_v`, v head dim 512) is Hopper-only in FA3
  ("Only Hopper supports different V headdim"; "q_v is only supported for Hopper GPUs").
- Paged KV: vLLM declares kernel block sizes `MultipleOf(16)` for this backend
  (`get_supported_kernel_block_sizes`), but FA3's paged path without TMA takes any page
  size (upstream's docstring: "page_block_size can be arbitrary (e.g, 1, 2, 3, 64,
  etc.)"). `unsupported_reason` follows the kernel (DESIGN: any P >= 1); the GPU tests
  run page sizes 1 and 16 to confirm.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import sys
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from mla_spec import DecodeMetadata, MLAConfig, check_config_and_metadata
from mla_spec.config import ATTN_TYPE_DECODER, FP8_KV_CACHE_MSG, NON_DECODER_MSG, UNSUPPORTED_FEATURES_MSG
from mla_spec.metadata import first_outside_int32

__all__ = [
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

# The seed's limit (older seed; FA3's PREPARE_VARLEN_MAX_BATCHES_1CTA) and message.
MAX_CAPTURE_SIZE = 992
CAPTURE_SIZE_MSG = "Capture size larger than 992 is not supported for full cuda graph."
FP8_FORWARD_MSG = "FP8 FlashAttention MLA not yet supported"  # the seed's message in forward_mqa
NOT_SUPPORTED_ON_DEVICE_MSG = "FlashAttnMLA is not supported on this device"  # the seed's assert message

# Head dims this port runs FA3 with: q/k = qk_rope_head_dim, v = q_v = kv_lora_rank.
MLA_HEAD_DIMS = (64, 512)

_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# Where the bundled build lives in this repository, for the error message.
_BUNDLE_HINT = (
    "the bundled vLLM 0.33.0 build in .fa3/ must be unpacked first: "
    "bash .fa3/unpack.sh /tmp/fa3 && export PYTHONPATH=/tmp/fa3:$PWD"
)


class FA3UnavailableError(RuntimeError):
    """FA3 cannot run here; the message says why."""


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def scheduler_metadata_buffer_size(max_batch_size: int) -> int:
    """The seed's persistent buffer size: `1 + round_up(max_batch_size, 4) * 4`.

    FA3's layout: one tile-count semaphore (the +1) after up to 4 int32 vectors of
    `round_up(B, 4)` entries (prepare_varlen, dynamic_split, sort_batches, head_swizzle).
    """
    return 1 + round_up(max_batch_size, 4) * 4


def _torch_dtype(name: str) -> torch.dtype:
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype={name!r}; expected one of {tuple(_TORCH_DTYPES)}") from None


# vLLM's `CacheDType` names (config/cache.py) that this port knows: the backend's
# `supported_kv_cache_dtypes` and the fp8 ones, which the Impl refuses with the seed's
# NotImplementedError. Any other string is a ValueError (vLLM's config refuses it upstream).
FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
KNOWN_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16") + FP8_KV_CACHE_DTYPES


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """vLLM's `is_quantized_kv_cache`: any fp8 cache."""
    return kv_cache_dtype.startswith("fp8")


# ----------------------------------------------------------------------------------------
# FA3 provider lookup
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FA3Provider:
    """One FA3 build, seen through the seed's calling convention.

    `flash_attn_varlen_func` takes the seed's keywords (`q, k, v, q_v, max_seqlen_q,
    cu_seqlens_q, max_seqlen_k, seqused_k, block_table, softmax_scale, causal,
    return_softmax_lse, fa_version, scheduler_metadata, num_splits`) and returns
    `(out, lse [H, T])` with `return_softmax_lse=True`. `get_scheduler_metadata` takes
    the keywords the seed's builder passes.
    """

    name: str
    flash_attn_varlen_func: Callable[..., Any]
    get_scheduler_metadata: Callable[..., Any]
    module: Any = None

    def __iter__(self):  # allows `name, varlen, sched = find_fa3()`
        return iter((self.name, self.flash_attn_varlen_func, self.get_scheduler_metadata))


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _params(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _upstream_provider(name: str) -> tuple[FA3Provider | None, str]:
    """Upstream FA3 (flash-attention's `hopper/` build, module `flash_attn_interface`).

    Its `flash_attn_varlen_func` takes no block table and no `fa_version`; the paged
    path is `flash_attn_with_kvcache`, which does not pass `max_seqlen_k` (so FA3 would
    take `max_blocks * page_size` and could pick a split count that disagrees with the
    builder's schedule). The adapter therefore calls the op underneath both,
    `_flash_attn_forward`, with the seed's arguments.
    """
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # ImportError, or a CUDA-less build failing at load
        return None, f"{name}: {_describe(e)}"
    fwd = getattr(mod, "_flash_attn_forward", None)
    sched = getattr(mod, "get_scheduler_metadata", None)
    if fwd is None or sched is None:
        return None, f"{name}: lacks _flash_attn_forward/get_scheduler_metadata (too old for MLA)"
    if "qv" not in _params(fwd) and "qv" not in _params(getattr(mod, "flash_attn_with_kvcache", None)):
        return None, f"{name}: no qv argument, so no MLA head dims {MLA_HEAD_DIMS}"
    try:  # build flags of newer upstream builds
        flags = importlib.import_module("flash_attn_config").CONFIG["build_flags"]
    except Exception:
        flags = {}
    for flag in ("FLASHATTENTION_DISABLE_HDIM64", "FLASHATTENTION_DISABLE_HDIMDIFF64",
                 "FLASHATTENTION_DISABLE_PAGEDKV", "FLASHATTENTION_DISABLE_VARLEN"):
        if flags.get(flag):
            return None, f"{name}: built with {flag}, so no paged varlen MLA head dims {MLA_HEAD_DIMS}"

    def flash_attn_varlen_func(*, q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, seqused_k=None,
                               q_v=None, softmax_scale=None, causal=False, block_table=None,
                               return_softmax_lse=False, fa_version=3, scheduler_metadata=None,
                               num_splits=0, out=None):
        if fa_version != 3:
            raise ValueError(f"upstream flash_attn_interface is FA3 only, got fa_version={fa_version}")
        res = fwd(
            q, k, v,
            qv=q_v, out_=out, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, page_table=block_table,
            softmax_scale=softmax_scale, causal=causal, scheduler_metadata=scheduler_metadata,
            num_splits=num_splits,
        )
        o, lse = res[0], res[1]
        return (o, lse) if return_softmax_lse else o

    return FA3Provider(name, flash_attn_varlen_func, sched, mod), ""


def _vllm_provider(name: str = "vllm.vllm_flash_attn") -> tuple[FA3Provider | None, str]:
    """vLLM's FA3 build, the seed's own import (`from vllm.vllm_flash_attn import ...`)."""
    try:
        mod = importlib.import_module(name)
    except Exception as e:
        why = _describe(e)
        # A failed package import leaves its interface module behind; it knows why FA3 failed.
        iface = sys.modules.get(f"{name}.flash_attn_interface")
        fa3_reason = getattr(iface, "FA3_UNAVAILABLE_REASON", None)
        if fa3_reason:
            why += f" (FA3: {fa3_reason})"
        if "No module named 'vllm'" in why or "_vllm_fa3_C" in why:
            why += f"; {_BUNDLE_HINT}"
        return None, f"{name}: {why}"
    iface = sys.modules.get(f"{name}.flash_attn_interface")
    if iface is not None and not getattr(iface, "FA3_AVAILABLE", True):
        why = getattr(iface, "FA3_UNAVAILABLE_REASON", "?")
        return None, f"{name}: FA3 extension unavailable: {why}; {_BUNDLE_HINT}"
    varlen = getattr(mod, "flash_attn_varlen_func", None)
    sched = getattr(mod, "get_scheduler_metadata", None)
    if varlen is None or sched is None:
        return None, f"{name}: lacks flash_attn_varlen_func/get_scheduler_metadata"
    missing = {"q_v", "fa_version", "scheduler_metadata", "block_table", "num_splits"} - _params(varlen)
    if missing:
        return None, f"{name}: flash_attn_varlen_func lacks {sorted(missing)}, so no MLA head dims {MLA_HEAD_DIMS}"
    return FA3Provider(name, varlen, sched, mod), ""


_PROVIDERS: tuple[tuple[str, Callable[[str], tuple[FA3Provider | None, str]]], ...] = (
    ("flash_attn_interface", _upstream_provider),
    ("flash_attn_3.flash_attn_interface", _upstream_provider),
    ("vllm.vllm_flash_attn", _vllm_provider),
)


@functools.cache
def _probe_providers() -> tuple[FA3Provider | None, tuple[str, ...]]:
    reasons = []
    for name, probe in _PROVIDERS:
        provider, why = probe(name)
        if provider is not None:
            return provider, tuple(reasons)
        reasons.append(why)
    return None, tuple(reasons)


def _device_reason(device=None) -> str | None:
    """Why FA3's MLA kernel cannot run on `device` (None: the current CUDA device)."""
    if device is not None:
        device = torch.device(device)
        if device.type != "cuda":
            return f"device={str(device)!r} is not a CUDA device (FA3 runs on Hopper GPUs only)"
    if not torch.cuda.is_available():
        return (
            f"no CUDA: torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda})"
        )
    try:
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
    except Exception as e:  # e.g. an index past the visible devices
        return f"cannot query device={str(device)!r}: {_describe(e)}"
    if major != 9:
        return (
            f"not Hopper: FA3's MLA path (q_v, head dims {MLA_HEAD_DIMS}) needs compute capability 9.x, "
            f"got {major}.{minor} ({name})"
        )
    return None


def fa3_unavailable_reason(device=None) -> str | None:
    """None when FA3 can run paged MLA on `device`, else why not (no CUDA, not Hopper,
    no provider importable, provider lacks the MLA head dims)."""
    reason = _device_reason(device)
    if reason is not None:
        return reason
    provider, reasons = _probe_providers()
    if provider is None:
        return "no FA3 provider importable: " + "; ".join(reasons)
    return None


def find_fa3() -> FA3Provider:
    """The first FA3 provider that imports and has the MLA head dims (64, 512):
    upstream `flash_attn_interface`, then vLLM's `vllm.vllm_flash_attn`. Cached.
    Raises FA3UnavailableError listing why each one was passed over."""
    provider, reasons = _probe_providers()
    if provider is None:
        raise FA3UnavailableError("no FA3 provider importable: " + "; ".join(reasons))
    return provider


def _require_fa3(device=None) -> FA3Provider:
    reason = fa3_unavailable_reason(device)
    if reason is not None:
        raise FA3UnavailableError(f"{NOT_SUPPORTED_ON_DEVICE_MSG}: {reason}")
    return find_fa3()


# ----------------------------------------------------------------------------------------
# Backend
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MultipleOf:
    """vLLM's `MultipleOf`: a kernel block size constraint."""

    base: int


class FlashAttnMLABackend:
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        """What vLLM declares for this backend. FA3's kernel takes any page size; see the
        module docstring."""
        return [MultipleOf(16)]

    @staticmethod
    def get_name() -> str:
        return "FLASH_ATTN_MLA"

    @staticmethod
    def get_metadata_cls() -> type["FlashAttnMLAMetadata"]:
        return FlashAttnMLAMetadata

    @staticmethod
    def get_builder_cls() -> type["FlashAttnMLAMetadataBuilder"]:
        return FlashAttnMLAMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type["FlashAttnMLAImpl"]:
        return FlashAttnMLAImpl

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        """`capability`: an object with `.major` (vLLM's DeviceCapability), a
        `(major, minor)` tuple, or an int such as 90."""
        if hasattr(capability, "major"):
            major = capability.major
        elif isinstance(capability, tuple):
            major = capability[0]
        elif isinstance(capability, int):
            major = capability // 10
        else:
            raise ValueError(f"capability must be (major, minor), an int or have .major, got {capability=}")
        return major == 9


# ----------------------------------------------------------------------------------------
# Metadata
# ----------------------------------------------------------------------------------------


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


def _cpu_int32(name: str, x) -> torch.Tensor:
    """`x` (NumPy array, sequence or torch tensor) as a host int32 tensor, for the builder.

    Non-integer dtypes and values outside int32 are refused before converting (a plain cast
    would truncate 8.9 to 8 and wrap 2**32 + 5 to 5), naming `name` and the value. A device
    tensor is copied to the host first, as the builder always did; only the host copy is
    read, so the checks add no device sync."""
    if isinstance(x, torch.Tensor):
        if x.dtype not in _TORCH_INT_DTYPES:
            raise ValueError(f"{name} must hold integers, got {name}.dtype={x.dtype}")
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
        if not isinstance(config, MLAConfig):
            raise ValueError(f"config must be an mla_spec.MLAConfig, got {type(config).__name__}")
        self.config = config
        self.device = torch.device(device)
        self.num_heads = config.num_heads
        self.dcp_world_size = config.dcp_world_size
        self.page_size = config.page_size
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.dtype = _torch_dtype(config.dtype)  # the seed's kv_cache_spec.dtype (kv_cache_dtype="auto")
        # The seed: 512, or 1 with DCP (no DCP custom masking yet); MLAConfig derives it.
        self.reorder_batch_threshold = config.reorder_batch_threshold
        self._fa3_provider = fa3_provider

        self.max_num_splits = 0  # No upper bound on the number of splits.
        self.fa_aot_schedule = True  # FA3 is the only version here
        self.use_full_cuda_graph = bool(use_full_cuda_graph)
        self.max_cudagraph_size = config.max_capture_size
        self.scheduler_metadata: torch.Tensor | None = None

        if self.use_full_cuda_graph and self.fa_aot_schedule:
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
            self._fa3_provider = _require_fa3(self.device)
        return self._fa3_provider

    def _schedule_decode(self, num_reqs, cu_query_lens, max_query_len, seqlens, max_seq_len, causal, max_num_splits):
        if self.fa_aot_schedule:
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
        return None

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
        whatever was requested, as the newer seed does under VLLM_BATCH_INVARIANT."""
        if max_query_len is None:
            query_lens_cpu = query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]
            max_query_len = int(query_lens_cpu.max().item())

        # For Flash Attention MLA + full cudagraph
        if max_num_splits is None:
            max_num_splits = self._max_num_splits(num_decode_tokens)
        if self.config.batch_invariant:
            # The newer seed: `if vllm_is_batch_invariant(): max_num_splits = 1`. One split whatever
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
        qsl_cpu = _cpu_int32("query_start_loc", metadata.query_start_loc)
        seq_lens_cpu = _cpu_int32("seq_lens", metadata.seq_lens)
        block_table_cpu = _cpu_int32("block_table", metadata.block_table)
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


# ----------------------------------------------------------------------------------------
# Impl
# ----------------------------------------------------------------------------------------

_REQUIRED_MLA_ARGS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
# Accepted and unused here (vLLM's MLACommonImpl takes them), besides the required ones.
_OPTIONAL_MLA_ARGS = ("q_lora_rank", "qk_head_dim", "kv_b_proj", "indexer", "dcp_world_size",
                      "need_to_return_lse_for_decode", "device", "fa3_provider")


class FlashAttnMLAImpl:
    can_return_lse_for_decode: bool = True

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        # MLA Specific Arguments
        **mla_args,
    ) -> None:
        """mla_args: kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim
        (required); dcp_world_size (1), need_to_return_lse_for_decode (True), device (the
        CUDA device FA3 must run on; None: the current one), fa3_provider (a given
        provider, skipping the lookup and the device check; for tests)."""
        missing = [k for k in _REQUIRED_MLA_ARGS if k not in mla_args]
        if missing:
            raise ValueError(f"FlashAttnMLAImpl needs MLA arguments {missing}; got {sorted(mla_args)}")
        unknown = sorted(set(mla_args) - set(_REQUIRED_MLA_ARGS) - set(_OPTIONAL_MLA_ARGS))
        if unknown:
            raise ValueError(f"unknown MLA arguments {unknown}; accepted: {_REQUIRED_MLA_ARGS + _OPTIONAL_MLA_ARGS}")
        # Not in the seed (vLLM validates these upstream, in its configs): refuse them here by name.
        if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1:
            raise ValueError(f"num_heads must be an int >= 1, got num_heads={num_heads!r}")
        if isinstance(scale, (bool, str, bytes)):
            raise ValueError(f"scale (the softmax scale) must be a finite float > 0, got scale={scale!r}")
        try:
            scale_value = float(scale)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"scale (the softmax scale) must be a finite float > 0, got scale={scale!r}") from None
        if not (math.isfinite(scale_value) and scale_value > 0):
            raise ValueError(f"scale (the softmax scale) must be a finite float > 0, got scale={scale!r}")
        if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KNOWN_KV_CACHE_DTYPES:
            raise ValueError(
                f"unknown kv_cache_dtype={kv_cache_dtype!r}; expected one of vLLM's {KNOWN_KV_CACHE_DTYPES} "
                f"(this backend runs {tuple(FlashAttnMLABackend.supported_kv_cache_dtypes)})"
            )
        # MLACommonImpl's state.
        self.num_heads = int(num_heads)
        self.head_size = head_size
        self.scale = scale_value
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.kv_lora_rank = mla_args["kv_lora_rank"]
        self.qk_rope_head_dim = mla_args["qk_rope_head_dim"]
        self.qk_nope_head_dim = mla_args["qk_nope_head_dim"]
        self.v_head_dim = mla_args["v_head_dim"]
        self.dcp_world_size = mla_args.get("dcp_world_size", 1)
        self.need_to_return_lse_for_decode = bool(mla_args.get("need_to_return_lse_for_decode", True))
        self.device = mla_args.get("device")
        if num_kv_heads != 1:
            raise ValueError(f"MLA has one latent KV head, got {num_kv_heads=}")
        if head_size != self.kv_lora_rank + self.qk_rope_head_dim:
            raise ValueError(
                f"head_size must be kv_lora_rank + qk_rope_head_dim = {self.kv_lora_rank + self.qk_rope_head_dim}, "
                f"got {head_size=}"
            )

        # The seed's checks, with its messages, before FA3 is looked at.
        unsupported_features = [alibi_slopes, sliding_window, logits_soft_cap]
        if any(unsupported_features):
            raise NotImplementedError(UNSUPPORTED_FEATURES_MSG)

        if attn_type != ATTN_TYPE_DECODER:
            raise NotImplementedError(NON_DECODER_MSG)

        if is_quantized_kv_cache(self.kv_cache_dtype):
            raise NotImplementedError(FP8_KV_CACHE_MSG)

        # The seed's `assert flash_attn_supports_mla()`, saying why.
        provider = mla_args.get("fa3_provider")
        self._fa3 = provider if provider is not None else _require_fa3(self.device)

    @classmethod
    def from_config(cls, config: MLAConfig, device=None, **mla_args) -> "FlashAttnMLAImpl":
        return cls(
            num_heads=config.num_heads,
            head_size=config.head_dim,
            scale=config.softmax_scale,
            num_kv_heads=1,
            alibi_slopes=list(config.alibi_slopes) if config.alibi_slopes else None,
            sliding_window=config.sliding_window,
            kv_cache_dtype=config.kv_cache_dtype,
            logits_soft_cap=config.logits_soft_cap,
            attn_type=config.attn_type,
            kv_sharing_target_layer_name=None,
            kv_lora_rank=config.kv_lora_rank,
            qk_rope_head_dim=config.qk_rope_head_dim,
            qk_nope_head_dim=config.qk_nope_head_dim,
            v_head_dim=config.v_head_dim,
            dcp_world_size=config.dcp_world_size,
            device=device,
            **mla_args,
        )

    def _forward_decode(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: FlashAttnMLAMetadata,
        layer=None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q: `[T, H, L+R]` or `(q_nope [T,H,L], q_pe [T,H,R])`; kv_c_and_k_pe_cache:
        `[num_blocks, P, L+R]`. Returns `(out [T, H, L], lse [T, H] float32)` (a
        transposed view of FA3's `[H, T]`), or `(out, None)` when
        `need_to_return_lse_for_decode` is False."""
        if not isinstance(kv_c_and_k_pe_cache, torch.Tensor):
            name = type(kv_c_and_k_pe_cache).__name__
            raise ValueError(f"kv_c_and_k_pe_cache must be a torch.Tensor, got kv_c_and_k_pe_cache={name}")
        if kv_c_and_k_pe_cache.numel() == 0:
            shape = tuple(kv_c_and_k_pe_cache.shape)
            raise ValueError(f"kv_c_and_k_pe_cache is empty: kv_c_and_k_pe_cache.shape={shape}")
        if attn_metadata.decode is None:
            raise ValueError("attn_metadata.decode is None: FlashAttnMLA runs decodes only")
        self._check_inputs(q, kv_c_and_k_pe_cache, attn_metadata)

        if type(q) is tuple:
            q_nope, q_pe = q
        else:
            q_nope, q_pe = torch.split(q, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)

        if is_quantized_kv_cache(self.kv_cache_dtype):
            raise NotImplementedError(FP8_FORWARD_MSG)

        kv_c_cache = kv_c_and_k_pe_cache[..., : self.kv_lora_rank]
        k_pe_cache = kv_c_and_k_pe_cache[..., self.kv_lora_rank :]

        # NOTE(matt): During CUDA graph capture, max_query_len can be 0, but the kernel
        # uses this to calculate grid dimensions. Ensure it's at least 1 to prevent
        # invalid grid configuration during graph capture.
        max_seqlen_q = max(attn_metadata.decode.max_query_len, 1)

        attn_out = self._fa3.flash_attn_varlen_func(
            q=q_pe,
            k=k_pe_cache.unsqueeze(-2),  # Add head dim of 1
            v=kv_c_cache.unsqueeze(-2),  # Add head dim of 1
            q_v=q_nope,
            max_seqlen_q=max_seqlen_q,
            cu_seqlens_q=attn_metadata.decode.query_start_loc,
            max_seqlen_k=attn_metadata.decode.max_seq_len,
            seqused_k=attn_metadata.decode.seq_lens,
            block_table=attn_metadata.decode.block_table,
            softmax_scale=self.scale,
            causal=True,
            return_softmax_lse=self.need_to_return_lse_for_decode,
            fa_version=3,  # only version 3 is supported
            scheduler_metadata=attn_metadata.decode.scheduler_metadata,
            num_splits=attn_metadata.decode.max_num_splits,
        )

        if self.need_to_return_lse_for_decode:
            o, lse = attn_out
            # FA returns LSE in shape [ H, B ] but DCP wants [ B, H ]
            return o, lse.transpose(0, 1)  # [ H, B ] -> [ B, H ]
        else:
            o = attn_out
            return o, None

    forward_mqa = _forward_decode  # the newer seed's name

    def _check_inputs(self, q, kv_c_and_k_pe_cache, attn_metadata: FlashAttnMLAMetadata) -> None:
        """Not in the seed: shapes, dtypes and devices of the call, from tensor metadata only
        (no values read, so nothing syncs and CUDA-graph capture is unaffected). FA3 itself
        would read a wrong page size or head count as valid memory."""
        L, R = self.kv_lora_rank, self.qk_rope_head_dim
        # Under DCP vLLM all-gathers q's heads before this call (the builder schedules them too).
        H = self.num_heads * self.dcp_world_size
        if type(q) is tuple:
            if len(q) != 2:
                raise ValueError(f"q must be a tensor or a (q_nope, q_pe) pair, got a tuple of {len(q)}")
            parts = (("q_nope", q[0], L), ("q_pe", q[1], R))
        else:
            parts = (("q", q, L + R),)
        cache = kv_c_and_k_pe_cache
        for name, x, _ in parts + (("kv_c_and_k_pe_cache", cache, None),):
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {name}={type(x).__name__}")
        for name, x, width in parts:
            if x.dim() != 3 or x.shape[1] != H or x.shape[2] != width:
                raise ValueError(
                    f"{name} must be [num_tokens, num_heads={H}, {width}], got {name}.shape={tuple(x.shape)}"
                )
        q0 = parts[0][1]
        if len(parts) == 2 and (q[0].shape[0] != q[1].shape[0] or q[0].dtype != q[1].dtype):
            raise ValueError(
                f"q_nope and q_pe must agree on tokens and dtype, got q_nope.shape={tuple(q[0].shape)} "
                f"{q[0].dtype}, q_pe.shape={tuple(q[1].shape)} {q[1].dtype}"
            )
        num_tokens = attn_metadata.num_decode_tokens
        if q0.shape[0] < num_tokens:
            raise ValueError(
                f"q has fewer tokens than attn_metadata.num_decode_tokens={num_tokens}: "
                f"{parts[0][0]}.shape={tuple(q0.shape)}"
            )
        if q0.dtype not in FlashAttnMLABackend.supported_dtypes:
            raise ValueError(
                f"q dtype must be one of {FlashAttnMLABackend.supported_dtypes} (the seed's supported_dtypes), "
                f"got {parts[0][0]}.dtype={q0.dtype}"
            )
        if cache.dim() != 3 or cache.shape[2] != L + R:
            raise ValueError(
                f"kv_c_and_k_pe_cache must be [num_blocks, page_size, {L + R}], "
                f"got kv_c_and_k_pe_cache.shape={tuple(cache.shape)}"
            )
        page_size = attn_metadata.decode.page_size
        if page_size is not None and cache.shape[1] != page_size:
            raise ValueError(
                f"kv_c_and_k_pe_cache page size must be the block size FA3 was scheduled with, page_size={page_size}, "
                f"got kv_c_and_k_pe_cache.shape={tuple(cache.shape)}"
            )
        want = q0.dtype if self.kv_cache_dtype == "auto" else _TORCH_DTYPES[self.kv_cache_dtype]
        if cache.dtype != want:
            raise ValueError(
                f"kv_c_and_k_pe_cache dtype must be {want} with kv_cache_dtype={self.kv_cache_dtype!r}"
                + (f" and q.dtype={q0.dtype}" if self.kv_cache_dtype == "auto" else "")
                + f", got kv_c_and_k_pe_cache.dtype={cache.dtype}"
            )
        if q0.dtype != cache.dtype:  # FA3 takes one dtype for q and the cache (no fp8 here)
            raise ValueError(
                f"q and kv_c_and_k_pe_cache must share a dtype, got {parts[0][0]}.dtype={q0.dtype}, "
                f"kv_c_and_k_pe_cache.dtype={cache.dtype}"
            )
        devices = {x.device for _, x, _ in parts} | {cache.device}
        if len(devices) != 1:
            raise ValueError(
                f"q and kv_c_and_k_pe_cache must be on one device, got devices={sorted(map(str, devices))}"
            )


# ----------------------------------------------------------------------------------------
# Entry points used by mla_torch.api
# ----------------------------------------------------------------------------------------


def _config_reason(config: MLAConfig) -> str | None:
    if config.dtype not in ("bfloat16", "float16"):
        return f"FA3 takes bfloat16/float16 activations (the seed's supported_dtypes), got dtype={config.dtype!r}"
    if is_quantized_kv_cache(config.kv_cache_dtype):
        return f"{FP8_KV_CACHE_MSG} (kv_cache_dtype={config.kv_cache_dtype!r})"
    if (config.qk_rope_head_dim, config.kv_lora_rank) != MLA_HEAD_DIMS:
        return (
            f"this FA3 path runs head dims (qk_rope_head_dim, kv_lora_rank) = {MLA_HEAD_DIMS}, got "
            f"qk_rope_head_dim={config.qk_rope_head_dim}, kv_lora_rank={config.kv_lora_rank}"
        )
    if config.dcp_world_size > 1:
        return (
            f"dcp_world_size={config.dcp_world_size}: with decode context parallelism the kernel runs the "
            "all-gathered heads (num_heads * dcp_world_size) over a local KV shard and the LSE merge happens "
            "outside; this single-device entry point takes neither"
        )
    return None


def unsupported_reason(config: MLAConfig, device=None) -> str | None:
    """None when `mla_decode` can run `config` on `device`, else why not: the config
    (dtype, fp8 cache, head dims, DCP), then the device and the FA3 build
    (`fa3_unavailable_reason`). Any page size is accepted (see the module docstring)."""
    return _config_reason(config) or fa3_unavailable_reason(device)


@functools.lru_cache(maxsize=64)
def _builder_and_impl(config: MLAConfig, device: str):
    builder = FlashAttnMLAMetadataBuilder(config, device)
    impl = FlashAttnMLAImpl.from_config(config, device)
    return builder, impl


def mla_decode(q, kv_cache: torch.Tensor, metadata: DecodeMetadata, config: MLAConfig):
    """Paged MLA decode on FA3, the seed's way: the builder (non-graph mode) turns
    `metadata` into `FlashAttnMLAMetadata` with FA3's schedule, the Impl runs it.
    Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`.

    Raises NotImplementedError for a config FA3 does not take, FA3UnavailableError (a
    RuntimeError) where FA3 cannot run, saying why."""
    check_config_and_metadata(config, metadata)
    if not isinstance(kv_cache, torch.Tensor):
        raise ValueError(f"kv_cache must be a torch.Tensor, got kv_cache={type(kv_cache).__name__}")
    reason = _config_reason(config)
    if reason is not None:
        raise NotImplementedError(f"FlashAttnMLA (FA3) does not run this config: {reason}")
    _require_fa3(kv_cache.device)
    device = kv_cache.device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    builder, impl = _builder_and_impl(config, str(device))
    attn_metadata = builder.build(metadata, num_blocks=int(kv_cache.shape[0]))
    out, lse = impl._forward_decode(q, kv_cache, attn_metadata)
    return out, lse


# ----------------------------------------------------------------------------------------
# Full CUDA graphs
# ----------------------------------------------------------------------------------------


class FA3DecodeGraph:
    """One decode captured in a CUDA graph, vLLM's FULL cudagraph way, replayable with
    other batches.

    Persistent buffers sized for the largest batch: q `[max_num_tokens, H, L+R]`,
    query_start_loc `[max_num_reqs + 1]`, seq_lens `[max_num_reqs]`, block_table
    `[max_num_reqs, max_blocks_per_req]`, and the builder's scheduler-metadata buffer
    (full-cuda-graph mode). Each `load` validates a batch, writes it into the buffers
    padded to `max_num_reqs` requests as vLLM does (padding requests: q_len 0, seq_len 0,
    block row 0), and rebuilds FA3's schedule into the same buffer. Everything FA3 bakes
    into the graph, and everything the schedule's layout depends on, is pinned: batch
    size `max_num_reqs`, `max_query_len`, `max_seq_len`, the token count `max_num_tokens`
    (so `max_num_splits` is the config's bound) and the kv cache tensor itself.

        g = FA3DecodeGraph(config, kv_cache, max_num_reqs=8, max_num_tokens=32,
                           max_blocks_per_req=64, max_query_len=4)
        out, lse = g.capture(q, metadata)      # runs once eagerly (warm-up), then captures
        out, lse = g.replay(q2, metadata2)     # another batch, same buffers

    The returned `out [T, H, L]` / `lse [T, H]` are views of the graph's outputs: the next
    replay overwrites them.
    """

    def __init__(self, config: MLAConfig, kv_cache: torch.Tensor, *, max_num_reqs: int, max_num_tokens: int,
                 max_blocks_per_req: int, max_query_len: int = 1, max_seq_len: int | None = None,
                 fa3_provider: FA3Provider | None = None):
        for name, v in (("max_num_reqs", max_num_reqs), ("max_num_tokens", max_num_tokens),
                        ("max_blocks_per_req", max_blocks_per_req), ("max_query_len", max_query_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={v!r}")
        if max_num_reqs > max(config.max_num_seqs, config.max_capture_size):
            raise ValueError(
                f"max_num_reqs={max_num_reqs} exceeds what the scheduler-metadata buffer is sized for: "
                f"max(max_num_seqs={config.max_num_seqs}, max_capture_size={config.max_capture_size})"
            )
        if max_num_tokens > config.max_capture_size:
            raise ValueError(
                f"max_num_tokens={max_num_tokens} exceeds max_capture_size={config.max_capture_size}: "
                "vLLM captures full graphs only up to the capture size"
            )
        if max_query_len > config.reorder_batch_threshold:
            raise ValueError(
                f"max_query_len={max_query_len} exceeds reorder_batch_threshold={config.reorder_batch_threshold}"
            )
        capacity = max_blocks_per_req * config.page_size
        if max_seq_len is None:
            max_seq_len = capacity
        if max_seq_len > capacity or max_seq_len < max_query_len:
            raise ValueError(
                f"max_seq_len must be in [max_query_len={max_query_len}, max_blocks_per_req * page_size={capacity}], "
                f"got max_seq_len={max_seq_len}"
            )
        if kv_cache.dim() != 3 or kv_cache.shape[1] != config.page_size or kv_cache.shape[2] != config.head_dim:
            raise ValueError(
                f"kv_cache must be [num_blocks, page_size={config.page_size}, {config.head_dim}], "
                f"got kv_cache.shape={tuple(kv_cache.shape)}"
            )
        self.config = config
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.max_blocks_per_req = max_blocks_per_req
        self.max_query_len = max_query_len
        self.max_seq_len = max_seq_len
        self.builder = FlashAttnMLAMetadataBuilder(config, self.device, use_full_cuda_graph=True,
                                                   fa3_provider=fa3_provider)
        extra = {} if fa3_provider is None else {"fa3_provider": fa3_provider}
        self.impl = FlashAttnMLAImpl.from_config(config, self.device, **extra)
        i32 = dict(dtype=torch.int32, device=self.device)
        self.q = torch.zeros((max_num_tokens, config.num_heads, config.head_dim), dtype=kv_cache.dtype,
                             device=self.device)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, **i32)
        self.seq_lens = torch.zeros(max_num_reqs, **i32)
        self.block_table = torch.zeros((max_num_reqs, max_blocks_per_req), **i32)
        self.graph = None
        self._out = self._lse = None
        self._num_tokens = 0

    def load(self, q, metadata: DecodeMetadata) -> FlashAttnMLAMetadata:
        """Writes one batch into the persistent buffers and rebuilds FA3's schedule."""
        qsl = _cpu_int32("query_start_loc", metadata.query_start_loc)
        seq_lens = _cpu_int32("seq_lens", metadata.seq_lens)
        bt = _cpu_int32("block_table", metadata.block_table)
        host = metadata.replace(query_start_loc=qsl.numpy(), seq_lens=seq_lens.numpy(), block_table=bt.numpy())
        host.validate(self.config, num_blocks=int(self.kv_cache.shape[0]))
        R, T = int(seq_lens.shape[0]), int(metadata.num_decode_tokens)
        max_q = int((qsl[1:] - qsl[:-1]).max())
        max_s = int(seq_lens.max())
        need_blocks = -(-max_s // self.config.page_size)
        for name, value, bound in (("num_reqs", R, self.max_num_reqs), ("num_decode_tokens", T, self.max_num_tokens),
                                   ("max query len", max_q, self.max_query_len),
                                   ("max seq len", max_s, self.max_seq_len),
                                   ("blocks per request", need_blocks, self.max_blocks_per_req)):
            if value > bound:
                raise ValueError(f"batch does not fit the graph: {name}={value} > {bound}")
        H, L, rope = self.config.num_heads, self.config.kv_lora_rank, self.config.qk_rope_head_dim
        parts = (("q_nope", q[0], L), ("q_pe", q[1], rope)) if isinstance(q, tuple) else (("q", q, L + rope),)
        for name, x, width in parts:
            if tuple(x.shape) != (T, H, width) or x.dtype != self.q.dtype:
                raise ValueError(
                    f"{name} must be [{T}, {H}, {width}] {self.q.dtype}, got {name}.shape={tuple(x.shape)}, "
                    f"{name}.dtype={x.dtype}"
                )
        if isinstance(q, tuple):
            self.q[:T, :, :L].copy_(q[0])
            self.q[:T, :, L:].copy_(q[1])
        else:
            self.q[:T].copy_(q)
        # vLLM's padding: extra requests have no query tokens and no KV.
        qsl_pad = torch.full((self.max_num_reqs + 1,), T, dtype=torch.int32)
        qsl_pad[: R + 1] = qsl
        seq_pad = torch.zeros(self.max_num_reqs, dtype=torch.int32)
        seq_pad[:R] = seq_lens
        bt_pad = torch.zeros((self.max_num_reqs, self.max_blocks_per_req), dtype=torch.int32)
        width = min(bt.shape[1], self.max_blocks_per_req)
        bt_pad[:R, :width] = bt[:, :width]  # columns past need_blocks are padding, never read
        self.query_start_loc.copy_(qsl_pad)
        self.seq_lens.copy_(seq_pad)
        self.block_table.copy_(bt_pad)
        self._num_tokens = T
        decode = self.builder._build_decode(
            block_table_tensor=self.block_table,
            seq_lens_device=self.seq_lens,
            max_seq_len=self.max_seq_len,
            query_start_loc_cpu=qsl_pad,
            query_start_loc_device=self.query_start_loc,
            num_decode_tokens=self.max_num_tokens,  # the padded size, as vLLM's graph batches
            max_query_len=self.max_query_len,
        )
        return FlashAttnMLAMetadata(num_reqs=self.max_num_reqs, num_actual_tokens=T, num_decodes=self.max_num_reqs,
                                    num_decode_tokens=T, decode=decode)

    def run_eager(self, q, metadata: DecodeMetadata):
        """The same call without a graph (on the padded buffers). Returns copies."""
        attn_metadata = self.load(q, metadata)
        out, lse = self.impl._forward_decode(self.q, self.kv_cache, attn_metadata)
        T = self._num_tokens
        return out[:T].clone(), lse[:T].clone()

    def capture(self, q, metadata: DecodeMetadata):
        """Loads `metadata`, runs once eagerly (warm-up, on a side stream), captures,
        and replays once. Returns the replay's `(out, lse)` views."""
        attn_metadata = self.load(q, metadata)
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.impl._forward_decode(self.q, self.kv_cache, attn_metadata)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        # The warm-up consumed the schedule's semaphore; rebuild before capture.
        attn_metadata = self.load(q, metadata)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out, self._lse = self.impl._forward_decode(self.q, self.kv_cache, attn_metadata)
        self.graph = graph
        self.load(q, metadata)
        graph.replay()
        return self._outputs()

    def replay(self, q, metadata: DecodeMetadata):
        """Loads another batch into the buffers and replays. Returns `(out, lse)` views."""
        if self.graph is None:
            raise RuntimeError("FA3DecodeGraph.replay before capture")
        self.load(q, metadata)
        self.graph.replay()
        return self._outputs()

    def _outputs(self):
        T = self._num_tokens
        return self._out[:T], (self._lse[:T] if self._lse is not None else None)
