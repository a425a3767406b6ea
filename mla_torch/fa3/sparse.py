"""The sparse decode on FA3, vLLM's way: FA3's paged path over one-token pages.

A port of the decode call of vLLM's `FlashAttnMLASparseImpl.forward_mqa`
(`vllm/v1/attention/backends/mla/flashattn_mla_sparse.py`): the cache is viewed as one-token pages
(`k = kv_cache[..., L:].view(-1, 1, 1, R)`, `v = kv_cache[..., :L].view(-1, 1, 1, L)`), every query token is its
own sequence (`cu_seqlens_q = arange(T + 1)`, `max_seqlen_q = 1`), its global slots are its block table
(`max_seqlen_k = topk`) and its count of valid slots is `seqused_k`; `causal=True` as vLLM passes it (one query
at the end of its keys sees all of them). Two additions, so that the call holds the contract of `mla_spec.sparse`
where vLLM's indexer output is narrower:
  - FA3 reads the first `seqused_k` entries of a row, while -1 may sit anywhere in `indices` and `topk_length`
    may cut a row: the used entries are moved to the front in their order (a stable compaction, one scatter) and
    the rest of the row repeats the token's first used slot (a slot it reads anyway; slot 0 where it has none),
    so a kernel that loads past `seqused_k` never names a slot out of range or one holding NaN.
  - `return_softmax_lse=True` (vLLM's decode does not ask for the LSE), transposed to `[T, H]` as the dense
    path's; a token with no used entry gets out 0 and lse -inf by a mask on the device (FA3's own output for
    `seqused_k = 0` is not relied on).
Everything stays on the device with static shapes: no host sync, CUDA-graph capturable. Under
`config.batch_invariant` the split count is 1 (the dense seed's rule); otherwise 0, FA3's heuristic, as vLLM.
"""

from __future__ import annotations

import torch

from mla_spec import MLAConfig
from mla_spec.config import check_config
from mla_torch.fa3 import providers
from mla_torch.fa3.impl import mask_rows
from mla_torch.fa3.providers import MLA_HEAD_DIMS, fa3_unavailable_reason
from mla_torch.sparse_reference import used_entries


def config_reason(config: MLAConfig, cache_format: str = "auto") -> str | None:
    """Why this path does not take `config` with `cache_format`, whatever the machine; None if it does."""
    check_config(config)
    if cache_format != "auto":
        return (f"FA3 reads the cache in q's dtype (cache_format='auto'), got cache_format={cache_format!r}; the "
                "fp8_ds_mla cache runs on impl='flashmla' or 'reference'")
    if config.dtype not in ("bfloat16", "float16"):
        return f"FA3 takes bfloat16/float16 activations, got dtype={config.dtype!r}"
    if config.kv_cache_dtype != "auto":
        return f"FA3 takes kv_cache_dtype='auto', got kv_cache_dtype={config.kv_cache_dtype!r}"
    if (config.qk_rope_head_dim, config.kv_lora_rank) != MLA_HEAD_DIMS:
        return (
            f"this FA3 path runs head dims (qk_rope_head_dim, kv_lora_rank) = {MLA_HEAD_DIMS}, got "
            f"qk_rope_head_dim={config.qk_rope_head_dim}, kv_lora_rank={config.kv_lora_rank}"
        )
    if config.dcp_world_size > 1:
        return f"dcp_world_size={config.dcp_world_size}: vLLM's FA3 sparse backend has no DCP"
    return None


def unsupported_reason(config: MLAConfig, device=None, cache_format: str = "auto") -> str | None:
    """None when `sparse_mla_decode` can run `config` on `device`, else why not: the config, then the device and
    the FA3 build (`fa3_unavailable_reason`)."""
    return config_reason(config, cache_format) or fa3_unavailable_reason(device)


def compact_block_table(indices: torch.Tensor, topk_length: torch.Tensor | None, num_slots: int):
    """`(block_table int32 [T, topk], seqused_k int32 [T])`: each row's used entries (not -1, left of topk_length)
    moved to the front in their order, the rest of the row the token's first used slot (0 where it has none)."""
    T, topk = indices.shape
    used = used_entries(indices, topk_length)
    # (a slot out of range, possible only in unvalidated GPU indices, is clamped into the cache: a wrong answer for
    # its token, never an out-of-bounds read; clamped before the int32 cast, which could wrap a wider value)
    indices = indices.clamp(0, num_slots - 1).to(torch.int32)
    counts = used.sum(dim=1, dtype=torch.int32)
    position = torch.cumsum(used, dim=1, dtype=torch.int64) - 1
    # Unused entries land in a spare last column, cut off below (which of them wins there does not matter).
    column = torch.where(used, position, topk)
    compact = torch.zeros((T, topk + 1), dtype=torch.int32, device=indices.device)
    compact.scatter_(1, column, indices)
    compact = compact[:, :topk]
    first = torch.where(counts > 0, compact[:, 0], 0)
    live = torch.arange(topk, device=indices.device)[None, :] < counts[:, None]
    return torch.where(live, compact, first[:, None]).contiguous(), counts


def sparse_mla_decode(q, kv_cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None,
                      config: MLAConfig, *, fa3_provider=None):
    """The sparse decode on FA3. q: `[T, H, 576]` or `(q_nope, q_pe)`; kv_cache: `[num_blocks, page_size, 576]`,
    contiguous, q's dtype; indices `[T, topk]` and topk_length `[T]` (or None): integer tensors on the cache's
    device, validated by the caller (`mla_torch.sparse_mla_decode`). Returns `(out [T, H, 512] in q's dtype,
    lse [T, H] float32)`.

    fa3_provider: a given provider, skipping the lookup and the device check (for tests). Raises
    NotImplementedError for a config this path does not take, FA3UnavailableError where FA3 cannot run."""
    reason = config_reason(config)
    if reason is not None:
        raise NotImplementedError(f"FA3 sparse decode does not run this config: {reason}")
    if not kv_cache.is_contiguous():
        raise ValueError(
            f"kv_cache must be contiguous (FA3 reads it as one-token pages), got kv_cache.stride()={kv_cache.stride()}"
        )
    fa3 = fa3_provider if fa3_provider is not None else providers.require_fa3(kv_cache.device)
    L, R = config.kv_lora_rank, config.qk_rope_head_dim
    q_nope, q_pe = q if isinstance(q, tuple) else torch.split(q, [L, R], dim=-1)
    T, topk = indices.shape
    block_table, seqused_k = compact_block_table(indices, topk_length, kv_cache.shape[0] * kv_cache.shape[1])
    pages = kv_cache.view(-1, 1, 1, L + R)  # one-token pages, one KV head
    out, lse = fa3.flash_attn_varlen_func(
        q=q_pe,
        k=pages[..., L:],
        v=pages[..., :L],
        q_v=q_nope,
        max_seqlen_q=1,
        cu_seqlens_q=torch.arange(T + 1, dtype=torch.int32, device=kv_cache.device),
        max_seqlen_k=topk,
        seqused_k=seqused_k,
        block_table=block_table,
        softmax_scale=config.softmax_scale,
        causal=True,
        return_softmax_lse=True,
        fa_version=3,
        scheduler_metadata=None,
        num_splits=1 if config.batch_invariant else 0,
    )
    return mask_rows(out, lse.transpose(0, 1), seqused_k > 0)
