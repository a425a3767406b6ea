"""torch reference for the sparse decode (`mla_spec.sparse`): CPU and GPU tensors, float32 compute.

Every token's `topk` rows are gathered at once (`[T, topk, 576]` float32: a reference, not a fast path), entries
that are -1 or past `topk_length` read slot 0 and are zeroed and masked out, so NaN in a slot no used entry names
never shows. No host synchronization: the metadata stays on the device.

An fp8_ds_mla cache (`uint8 [num_blocks, page_size, 656]`) is dequantized after the gather by
`dequantize_sparse_fp8`: the `mla_spec.fp8_sparse` layout in torch.
"""

from __future__ import annotations

import torch

from mla_spec import MLAConfig
from mla_spec.fp8_sparse import NOPE_DIM, NUM_TILES, ROPE_OFFSET, SCALES_OFFSET, TILE_SIZE


def dequantize_sparse_fp8(cache: torch.Tensor) -> torch.Tensor:
    """`uint8 [..., 656]` rows of the fp8_ds_mla layout -> float32 `[..., 576]` (`fp8 value * tile scale`, then the
    bfloat16 rope values), as `mla_spec.fp8_sparse.dequantize_sparse_fp8`."""
    lead = cache.shape[:-1]
    nope = cache[..., :SCALES_OFFSET].contiguous().view(torch.float8_e4m3fn).float()
    scales = cache[..., SCALES_OFFSET:ROPE_OFFSET].contiguous().view(torch.float32)  # [..., NUM_TILES]
    rope = cache[..., ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    nope = (nope.reshape(*lead, NUM_TILES, TILE_SIZE) * scales[..., None]).reshape(*lead, NOPE_DIM)
    return torch.cat([nope, rope], dim=-1)


def used_entries(indices: torch.Tensor, topk_length: torch.Tensor | None) -> torch.Tensor:
    """bool `[T, topk]`: the entries a token attends to (not -1, and left of its topk_length)."""
    used = indices != -1
    if topk_length is not None:
        positions = torch.arange(indices.shape[1], device=indices.device)
        used &= positions[None, :] < topk_length.to(indices.device)[:, None]
    return used


def sparse_mla_decode(q_nope, q_pe, kv_cache, indices, topk_length, config: MLAConfig, *,
                      cache_format: str = "auto"):
    """Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`.

    indices `[T, topk]` and topk_length `[T]` (or None): integer tensors, any device (moved to q's); the inputs are
    validated by the caller (`mla_torch.sparse_mla_decode`)."""
    L = config.kv_lora_rank
    device = q_nope.device
    indices = indices.to(device=device, dtype=torch.long)
    used = used_entries(indices, topk_length)
    kv_flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    # (a slot out of range, possible only in unvalidated GPU indices, reads a clamped row: a wrong answer for its
    # token, never an out-of-bounds read)
    rows = kv_flat[torch.where(used, indices.clamp(0, kv_flat.shape[0] - 1), 0)]  # [T, topk, W]
    rows = dequantize_sparse_fp8(rows) if cache_format == "fp8_ds_mla" else rows.float()
    rows = torch.where(used[..., None], rows, torch.zeros((), device=device))  # NaN in slot 0 stays out
    kv_c, k_pe = rows[..., :L], rows[..., L:]
    s = torch.einsum("thl,tkl->thk", q_nope.float(), kv_c) + torch.einsum("thr,tkr->thk", q_pe.float(), k_pe)
    s = (s * config.softmax_scale).masked_fill(~used[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf for a token with no key
    any_used = used.any(dim=-1)
    p = torch.exp(s - torch.where(any_used[:, None], lse, 0.0)[..., None])
    out = torch.einsum("thk,tkl->thl", p, kv_c)
    out = torch.where(any_used[:, None, None], out, torch.zeros((), device=device))
    return out.to(q_nope.dtype), lse
