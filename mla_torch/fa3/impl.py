"""The seed's backend and Impl (the FA3 decode call), and the package's entry points.

`FlashAttnMLAImpl._forward_decode` makes the seed's FA3 call: `q=q_pe,
k=k_pe_cache.unsqueeze(-2), v=kv_c_cache.unsqueeze(-2), q_v=q_nope, ..., causal=True,
fa_version=3`, with the builder's schedule and split count. FA3 returns the LSE as
`[H, T]`; the Impl returns it as a `[T, H]` view, the layout vLLM's DCP merge reads.
Besides the seed's own checks and `NotImplementedError` messages, the Impl refuses bad
arguments and, on every call, wrong shapes, dtypes, page size or devices, from tensor
metadata only: FA3 would read such inputs as valid memory.

`mla_decode` and `unsupported_reason` are what `mla_torch.mla_decode(impl="fa3")` calls:
one cached builder and Impl per (config, device), the builder in eager mode (FA3 picks
its own split count).

Page sizes: vLLM declares `MultipleOf(16)` kernel block sizes for this backend
(`get_supported_kernel_block_sizes`), but FA3's paged path without TMA takes any page
size (upstream's docstring: "page_block_size can be arbitrary (e.g, 1, 2, 3, 64,
etc.)"). `unsupported_reason` follows the kernel and accepts any page size >= 1; the
GPU tests run page sizes 1 and 16.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import numpy as np
import torch

from mla_spec import DecodeMetadata, MLAConfig, check_config_and_metadata
from mla_spec.config import ATTN_TYPE_DECODER, FP8_KV_CACHE_MSG, NON_DECODER_MSG, UNSUPPORTED_FEATURES_MSG, check_config
from mla_torch.fa3 import providers
from mla_torch.fa3.metadata import TORCH_DTYPES, FlashAttnMLAMetadata, FlashAttnMLAMetadataBuilder
from mla_torch.fa3.providers import MLA_HEAD_DIMS, fa3_unavailable_reason

__all__ = [
    "FP8_KV_CACHE_DTYPES",
    "FlashAttnMLABackend",
    "FlashAttnMLAImpl",
    "KNOWN_KV_CACHE_DTYPES",
    "MultipleOf",
    "is_quantized_kv_cache",
    "mask_padding",
    "mask_rows",
    "mla_decode",
    "unsupported_reason",
]

# vLLM's `CacheDType` names (config/cache.py) that this port knows: the backend's
# `supported_kv_cache_dtypes` and the fp8 ones, which the Impl refuses with the seed's
# NotImplementedError. Any other string is a ValueError (vLLM's config refuses it upstream).
FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
KNOWN_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16") + FP8_KV_CACHE_DTYPES


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """vLLM's `is_quantized_kv_cache`: any fp8 cache."""
    return kv_cache_dtype.startswith("fp8")


@dataclasses.dataclass(frozen=True)
class MultipleOf:
    """vLLM's `MultipleOf`: a kernel block size constraint."""

    base: int


class FlashAttnMLABackend:
    """The seed's backend: its name, its classes, and what it runs (fp16/bf16, Hopper)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        """What vLLM declares for this backend. FA3's kernel takes any page size (see the
        module docstring)."""
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


_REQUIRED_MLA_ARGS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
# Optional: MLACommonImpl's arguments that this port accepts and does not read (q_lora_rank,
# qk_head_dim, kv_b_proj, indexer), and the ones it reads with a default.
_OPTIONAL_MLA_ARGS = ("q_lora_rank", "qk_head_dim", "kv_b_proj", "indexer", "dcp_world_size",
                      "need_to_return_lse_for_decode", "device", "fa3_provider")


class FlashAttnMLAImpl:
    """The seed's Impl: checks its arguments once, then runs FA3 on each decode batch."""

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
        self._fa3 = provider if provider is not None else providers.require_fa3(self.device)

    @classmethod
    def from_config(cls, config: MLAConfig, device=None, **mla_args) -> "FlashAttnMLAImpl":
        check_config(config)
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

    forward_mqa = _forward_decode  # vLLM's current name for the decode call

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
        want = q0.dtype if self.kv_cache_dtype == "auto" else TORCH_DTYPES[self.kv_cache_dtype]
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


def _config_reason(config: MLAConfig) -> str | None:
    """Why this FA3 path does not take `config`, whatever the machine; None if it does."""
    check_config(config)
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
    """One builder (eager mode) and one Impl per (config, device), built once."""
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
    providers.require_fa3(kv_cache.device)
    device = kv_cache.device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    builder, impl = _builder_and_impl(config, str(device))
    attn_metadata = builder.build(metadata, num_blocks=int(kv_cache.shape[0]))
    out, lse = impl._forward_decode(q, kv_cache, attn_metadata)
    if metadata.padded:  # FA3 writes no row past cu_seqlens_q[-1]: a padded bucket's rows
        out, lse = mask_padding(out, lse, attn_metadata.decode.query_start_loc)
    return out, lse


def mask_padding(out: torch.Tensor, lse: torch.Tensor, query_start_loc: torch.Tensor):
    """out 0 and lse -inf on the token rows past query_start_loc[-1] (a device tensor: no host sync, so the
    masking can be captured in a CUDA graph)."""
    live = torch.arange(out.shape[0], device=out.device) < query_start_loc[-1].to(out.device)
    return mask_rows(out, lse, live)


def mask_rows(out: torch.Tensor, lse: torch.Tensor | None, live: torch.Tensor):
    """out 0 and lse -inf on the token rows where `live` (bool `[T]` on out's device) is False, by `torch.where` on
    the device (no host sync: capturable in a CUDA graph)."""
    out = torch.where(live[:, None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
    if lse is not None:
        lse = torch.where(live[:, None], lse, torch.full((), float("-inf"), dtype=lse.dtype, device=lse.device))
    return out, lse
