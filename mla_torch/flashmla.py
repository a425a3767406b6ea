"""The sparse decode on FlashMLA's fp8 kernel (DeepSeek-V3.2's `flash_mla_with_kvcache` with `indices`).

FlashMLA's sparse decode reads the fp8_ds_mla cache (`uint8 [num_blocks, page_size, 656]`, `mla_spec.fp8_sparse`)
as `[num_blocks, page_size, 1, 656]` and takes q `[batch, seq_len_q, heads, 576]` bf16 with indices
`[batch, seq_len_q, topk]` int32 (global slots, -1 to skip). Its V3.2 kernel on Hopper asks for more than
`mla_spec.sparse` does, so this wrapper:
  - runs every query token as its own batch entry (`q [T, 1, H, 576]`, `indices [T, 1, topk]`): the tokens of a
    request are rows like any other, and `topk_length` is per token in the contract where FlashMLA's is per batch
    entry;
  - applies `topk_length` by turning the entries past it into -1 (the V3.2 kernel takes no `topk_length`), and
    pads the row with -1 to a multiple of 64 entries (the kernel's `topk % 64 == 0`);
  - pads the heads with zero queries to 64 or 128 (the kernels it has), and drops them after;
  - gives a token with no used entry out 0 and lse -inf (FlashMLA returns +inf there) by a mask on the device;
  - returns lse `[T, H]` (FlashMLA's is `[batch, heads, seq_len_q]`, natural log as the dense decode's).
Every entry is a key, a slot named twice counted twice; a -1 entry reads slot `(2**32 - 1) % page_size` of block 0
with zeroed scales and is masked by a select, so NaN there never shows. No host sync: the metadata stays on the
device.

The interface is the one vLLM bundles (`vllm.third_party.flashmla.flash_mla_interface`, else the `flash_mla`
package): `get_mla_metadata()` with no arguments, the schedule filled at the first call.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import torch

from mla_spec import MLAConfig
from mla_spec.config import check_config
from mla_spec.fp8_sparse import BYTES_PER_TOKEN
from mla_torch.fa3.impl import mask_rows
from mla_torch.sparse_reference import used_entries

FLASHMLA_MODULES = ("vllm.third_party.flashmla.flash_mla_interface", "flash_mla")
FLASHMLA_HEADS = (64, 128)
"""The head counts FlashMLA's sparse decode kernels take; fewer heads are padded up to 64 (or 128)."""
TOPK_BLOCK = 64
"""FlashMLA's sparse decode reads indices in blocks of 64: topk must be a multiple."""


@functools.lru_cache(maxsize=1)
def _find_flashmla():  # once per process: a failing `import vllm...` is slow to repeat
    """(FlashMLA's interface module, None), or (None, why each module was passed over): the first of
    FLASHMLA_MODULES that imports and has flash_mla_with_kvcache and get_mla_metadata (the dense decode, which the
    bench drives through parity.runner, takes any such module)."""
    reasons = []
    for name in FLASHMLA_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure means "not here"
            reasons.append(f"{name}: {type(e).__name__}: {e}"[:300])
            continue
        if not (hasattr(mod, "flash_mla_with_kvcache") and hasattr(mod, "get_mla_metadata")):
            reasons.append(f"{name}: no flash_mla_with_kvcache / get_mla_metadata")
            continue
        return mod, None
    return None, "FlashMLA does not import: " + "; ".join(reasons)


def flashmla_interface():
    """FlashMLA's Python interface; ImportError saying why each module was passed over."""
    mod, reason = _find_flashmla()
    if mod is None:
        raise ImportError(reason)
    return mod


def _sparse_interface_reason(mod) -> str | None:
    """Why `mod`'s interface cannot run the sparse decode this wrapper drives (None: it can)."""
    params = inspect.signature(mod.flash_mla_with_kvcache).parameters
    if "indices" not in params or "is_fp8_kvcache" not in params:
        return "FlashMLA's flash_mla_with_kvcache takes no indices / is_fp8_kvcache (no sparse decode)"
    if "cache_seqlens" in inspect.signature(mod.get_mla_metadata).parameters:
        return "FlashMLA's get_mla_metadata takes cache_seqlens, an older interface than this wrapper drives"
    return None


def _sparse_lookup() -> tuple[object, str | None]:
    """(the interface, None) where it runs the sparse decode, else (None, why not)."""
    mod, reason = _find_flashmla()
    if mod is None:
        return None, reason
    reason = _sparse_interface_reason(mod)
    return (None, reason) if reason else (mod, None)


def padded_heads(num_heads: int) -> int:
    """The head count FlashMLA runs for `num_heads`: 64 up to 64 heads, else 128."""
    return FLASHMLA_HEADS[0] if num_heads <= FLASHMLA_HEADS[0] else FLASHMLA_HEADS[1]


def config_reason(config: MLAConfig, cache_format: str = "fp8_ds_mla") -> str | None:
    """Why FlashMLA's sparse decode does not take `config` with `cache_format`, whatever the machine; None if it
    does."""
    check_config(config)
    if cache_format != "fp8_ds_mla":
        return (f"FlashMLA's sparse decode reads the fp8_ds_mla cache only, got cache_format={cache_format!r}; the "
                "bf16 cache runs on impl='fa3' or 'reference'")
    if config.dtype != "bfloat16":
        return f"FlashMLA's sparse decode takes bfloat16 q, got dtype={config.dtype!r}"
    if config.num_heads > FLASHMLA_HEADS[-1]:
        return f"FlashMLA's sparse decode runs at most {FLASHMLA_HEADS[-1]} heads, got num_heads={config.num_heads}"
    if config.dcp_world_size > 1:
        return f"dcp_world_size={config.dcp_world_size}: this single-device entry point takes no DCP"
    if config.batch_invariant:
        return "batch_invariant=True: FlashMLA's SM90 sparse decode has no unsplit path (it refuses the flag)"
    return None


def _device_reason(device=None) -> str | None:
    if device is not None and torch.device(device).type != "cuda":
        return f"device={str(device)!r} is not a CUDA device (FlashMLA runs on Hopper and newer GPUs)"
    if not torch.cuda.is_available():
        return f"no CUDA: torch.cuda.is_available() is False (torch {torch.__version__})"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"FlashMLA's sparse decode needs sm90 or newer, got compute capability {major}.{minor}"
    return None


def unsupported_reason(config: MLAConfig, device=None, cache_format: str = "fp8_ds_mla") -> str | None:
    """None when `sparse_mla_decode` can run `config` on `device`, else why not: the config, the device, the
    import."""
    reason = config_reason(config, cache_format) or _device_reason(device)
    if reason is None:
        _, reason = _sparse_lookup()
    return reason


def sparse_mla_decode(q, kv_cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None,
                      config: MLAConfig, *, interface=None, schedule=None):
    """The sparse decode on FlashMLA. q: `[T, H, 576]` or `(q_nope, q_pe)` bf16; kv_cache: `uint8 [num_blocks,
    page_size, 656]` with contiguous rows; indices `[T, topk]` and topk_length `[T]` (or None): integer tensors on
    the cache's device, validated by the caller (`mla_torch.sparse_mla_decode`). Returns `(out [T, H, 512] bf16,
    lse [T, H] float32)`.

    schedule: FlashMLA's `(sched_meta, num_splits)` from `get_mla_metadata()`, reused across calls of the same
    shapes and indices' count (its first call fills it: vLLM builds it once a step for every layer); None: a new one
    this call. interface: a given FlashMLA interface, skipping the lookup and the device check (for tests). Raises
    NotImplementedError for a config FlashMLA does not take, RuntimeError where it cannot run."""
    reason = config_reason(config)
    if reason is not None:
        raise NotImplementedError(f"FlashMLA sparse decode does not run this config: {reason}")
    if interface is None:
        reason = _device_reason(kv_cache.device)
        if reason is not None:
            raise RuntimeError(f"FlashMLA cannot run here: {reason}")
        interface, reason = _sparse_lookup()
        if interface is None:
            raise RuntimeError(f"FlashMLA cannot run here: {reason}")
    if kv_cache.stride(-1) != 1 or kv_cache.stride(1) != BYTES_PER_TOKEN:
        raise ValueError(
            f"kv_cache rows must be contiguous ({BYTES_PER_TOKEN} bytes a token), "
            f"got kv_cache.stride()={kv_cache.stride()}"
        )
    q = torch.cat(q, dim=-1) if isinstance(q, tuple) else q
    T, H, D = q.shape
    Hp = padded_heads(H)
    q4 = torch.zeros((T, 1, Hp, D), dtype=q.dtype, device=q.device)
    q4[:, 0, :H] = q
    used = used_entries(indices, topk_length)
    topk = indices.shape[1]
    width = -(-topk // TOPK_BLOCK) * TOPK_BLOCK
    rows = torch.full((T, 1, width), -1, dtype=torch.int32, device=indices.device)
    # (a slot out of range, possible only in unvalidated GPU indices, is clamped into the cache: a wrong answer for
    # its token, never an out-of-bounds read)
    num_slots = kv_cache.shape[0] * kv_cache.shape[1]
    rows[:, 0, :topk] = torch.where(used, indices.clamp(0, num_slots - 1).to(torch.int32), -1)
    sched, splits = interface.get_mla_metadata() if schedule is None else schedule
    out, lse = interface.flash_mla_with_kvcache(
        q4, kv_cache.unsqueeze(2), None, None, config.kv_lora_rank, sched, splits,
        softmax_scale=config.softmax_scale, causal=False, is_fp8_kvcache=True, indices=rows,
    )
    return mask_rows(out[:, 0, :H], lse[:, :H, 0], used.any(dim=1))
