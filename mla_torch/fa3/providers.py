"""Finds an FA3 build that runs paged MLA, and says why none does.

FA3's MLA shape (q/k head dim 64 with `q_v`, v head dim 512) exists only in Hopper
builds that take a `q_v` argument. Three module names are tried, in this order:
`flash_attn_interface` and `flash_attn_3.flash_attn_interface` (upstream
flash-attention's `hopper/` build, built from source or packaged), then vLLM's bundled
`vllm.vllm_flash_attn`, the seed's own import. Each is imported lazily, at the first
call that needs FA3, so the package imports, and its host-side logic runs, on a machine
without CUDA.

`find_fa3` returns the first build that qualifies as an `FA3Provider`, which exposes
the seed's calling convention whatever the build; `fa3_unavailable_reason` says why
FA3 cannot run on a device (no CUDA, not Hopper, no qualifying build, each build's
reason listed), and `FA3UnavailableError` carries that reason.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
from typing import Any, Callable

import torch

__all__ = [
    "FA3Provider",
    "FA3UnavailableError",
    "MLA_HEAD_DIMS",
    "NOT_SUPPORTED_ON_DEVICE_MSG",
    "fa3_unavailable_reason",
    "find_fa3",
    "require_fa3",
]

# The seed's `assert flash_attn_supports_mla()` message, kept as the prefix of the error.
NOT_SUPPORTED_ON_DEVICE_MSG = "FlashAttnMLA is not supported on this device"

# Head dims this port runs FA3 with: q/k = qk_rope_head_dim, v = q_v = kv_lora_rank.
MLA_HEAD_DIMS = (64, 512)

# Where the bundled build lives in this repository, for the error message.
_BUNDLE_HINT = (
    "the bundled vLLM 0.33.0 build in .fa3/ must be unpacked first: "
    "bash .fa3/unpack.sh /tmp/fa3 && export PYTHONPATH=/tmp/fa3:$PWD"
)


class FA3UnavailableError(RuntimeError):
    """FA3 cannot run here; the message says why."""


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
    try:  # the build flags, where the build records them
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
    upstream `flash_attn_interface` (or `flash_attn_3.flash_attn_interface`), then vLLM's
    `vllm.vllm_flash_attn`. Cached.
    Raises FA3UnavailableError listing why each one was passed over."""
    provider, reasons = _probe_providers()
    if provider is None:
        raise FA3UnavailableError("no FA3 provider importable: " + "; ".join(reasons))
    return provider


def require_fa3(device=None) -> FA3Provider:
    """The provider `find_fa3` returns, after checking that `device` can run it; raises
    FA3UnavailableError with the seed's message and the reason otherwise."""
    reason = fa3_unavailable_reason(device)
    if reason is not None:
        raise FA3UnavailableError(f"{NOT_SUPPORTED_ON_DEVICE_MSG}: {reason}")
    return find_fa3()
