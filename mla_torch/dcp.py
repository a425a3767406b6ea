"""Decode context parallelism (DCP) on the torch side: the exact LSE merge of per-shard
partials (`merge_attn_states`, vLLM's name), and `dcp_mla_decode_local`, which runs each
DCP rank's share on one device, one shard after the other, and merges them.

Layout (`mla_spec.dcp`): interleaved as vLLM (`cp_kv_cache_interleave_size = 1`): global
KV position p of a request lives on shard `p % W` at local position `p // W`; per-shard
caches and metadata are stacked on a leading W axis (`mla_spec.dcp.shard_batch` builds
them from a global batch). One query token per request (vLLM's restriction under DCP).

Each shard runs the normal single-device call (`mla_torch.mla_decode`, impl "reference"
or "fa3") with `dcp_world_size=1`: the kernel sees one local KV shard. (vLLM's DCP runs FA3
with `num_heads * dcp_world_size` heads after an all-gather of q over the DCP group; here
every rank has all heads already, so the plain call is the same computation.) Empty shards
run at a dummy length 1 and their partial is overwritten with `lse = -inf`, `out = 0`.

A batch padded to a bucket and then sharded (`mla_spec.dcp`; padded=True) runs the same way:
each shard's call takes the padded metadata, and the rows of padding requests (q_len 0,
seq_len 0) and the token rows past `query_start_loc[-1]` are (0, -inf) in every partial and
after the merge.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from mla_spec import DecodeMetadata, MLAConfig, check_config_and_metadata, dtype_name, validate_inputs, validate_k_scale
from mla_spec.dcp import (
    check_partial_sequence,
    check_partials,
    check_world_size,
    local_config,
    shard_batch,
    shard_metadata,
    token_requests,
    validate_shards,
)
from mla_torch.api import check_same_device

__all__ = ["dcp_mla_decode_local", "merge_attn_states", "shard_batch"]

IMPLS = ("reference", "fa3")


def _partials_tensor(x, name: str) -> torch.Tensor:
    """`outs` or `lses` as one stacked tensor: a tensor or NumPy array as it is, a list or tuple of W
    per-shard tensors or arrays (one shape, W >= 1) stacked; anything else is a ValueError."""
    def one(item, shown):
        if isinstance(item, torch.Tensor):
            return item
        if isinstance(item, np.ndarray):
            try:
                return torch.from_numpy(np.ascontiguousarray(item))
            except TypeError as e:  # a dtype torch cannot take from NumPy (object, ml_dtypes' bfloat16)
                raise ValueError(
                    f"merge_attn_states takes tensors or NumPy arrays of a dtype torch takes, got {shown}.dtype={item.dtype}"
                ) from e
        raise ValueError(f"merge_attn_states takes tensors, got {shown}={type(item).__name__}")

    if isinstance(x, (list, tuple)):
        check_partial_sequence(x, name, "merge_attn_states")
        items = [one(item, f"{name}[{i}]") for i, item in enumerate(x)]
        check_same_device(items, [f"{name}[{i}]" for i in range(len(items))], "merge_attn_states takes partials")
        return torch.stack(items)
    return one(x, name)


def _out_dtype(out_dtype, default: torch.dtype) -> torch.dtype:
    """`out_dtype` (None: `default`; a torch.dtype, or its name: "bfloat16", "torch.float16") as a float
    torch.dtype; a ValueError naming anything else."""
    if out_dtype is None:
        return default
    resolved = out_dtype
    if not isinstance(resolved, torch.dtype):
        name = out_dtype if isinstance(out_dtype, str) else dtype_name(out_dtype)
        resolved = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        shown = repr(out_dtype) if isinstance(out_dtype, str) else dtype_name(out_dtype)
        raise ValueError(f"merge_attn_states takes a float out_dtype, got out_dtype={shown}")
    return resolved


def merge_attn_states(outs, lses, out_dtype: torch.dtype | str | None = None):
    """Exact LSE merge of stacked partials.

    outs `[W, T, H, L]` (or a sequence of W `[T, H, L]`), each normalized over its shard;
    lses `[W, T, H]` float32 (-inf for an empty shard). Returns `(out [T, H, L] in out_dtype
    (default outs' dtype; a torch.dtype or its name), lse [T, H] float32)`: lse = logsumexp over shards,
    out = sum_s exp(lse_s - lse) * out_s, computed in float32. A row with every shard empty
    gives out 0, lse -inf (no NaN); a NaN lse gives its row out NaN, lse NaN, and a +inf lse (which no decode
    returns) out NaN, lse +inf (never a plausible-looking finite row).
    Shapes and dtypes are checked as `mla_jax.merge_partials` checks them (ValueError naming them:
    float outs and lses, W >= 1, one shape per shard, a float out_dtype)."""
    outs, lses = _partials_tensor(outs, "outs"), _partials_tensor(lses, "lses")
    check_same_device([outs, lses], ["outs", "lses"], "merge_attn_states takes partials")
    check_partials(outs, lses, "merge_attn_states", dtype_name=dtype_name, is_float=lambda d: d.is_floating_point)
    out_dtype = _out_dtype(out_dtype, outs.dtype)
    lses = lses.float()
    m = lses.amax(dim=0)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lses - m_safe)  # 0 for empty shards
    w_sum = w.sum(dim=0)
    weighted = torch.where(w[..., None] > 0, w[..., None] * outs.float(), torch.zeros((), device=outs.device))
    out = weighted.sum(dim=0) / torch.where(w_sum > 0, w_sum, torch.ones_like(w_sum))[..., None]
    out = torch.where(torch.isnan(w_sum)[..., None], torch.full((), float("nan"), device=out.device), out)
    return out.to(out_dtype), m_safe + torch.log(w_sum)


def _check_cache_shards(kv_cache_shards) -> None:
    """Raises ValueError unless `kv_cache_shards` is a tensor `[W, ...]` or a list or tuple of W tensors (their
    shapes and dtypes are the caller's next checks)."""
    if isinstance(kv_cache_shards, torch.Tensor) and kv_cache_shards.dim() >= 1:
        return
    if isinstance(kv_cache_shards, (list, tuple)):
        for i, x in enumerate(kv_cache_shards):
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"kv_cache_shards must be a tensor or a sequence of W caches (torch tensors), got "
                                 f"kv_cache_shards[{i}]={type(x).__name__}")
        return
    shown = "a 0-d tensor" if isinstance(kv_cache_shards, torch.Tensor) else type(kv_cache_shards).__name__
    raise ValueError(f"kv_cache_shards must be a tensor or a sequence of W caches, got {shown}")


def dcp_mla_decode_local(
    q,
    kv_cache_shards,
    metadata_shards: DecodeMetadata,
    config: MLAConfig,
    *,
    impl: str = "reference",
    k_scale=1.0,
    return_partials: bool = False,
):
    """DCP decode with every rank's share computed in this process, then merged.

    q: `[T, H, L+R]` or `(q_nope, q_pe)`; kv_cache_shards: `[W, num_blocks_local, P, L+R]` (a
    tensor, or a sequence of W caches; a cache may sit on its own device: q is copied there
    and the partials come back to q's device for the merge); metadata_shards: the stacked
    `DecodeMetadata` (`mla_spec.dcp`), NumPy arrays or torch tensors; padded=True for a batch
    padded to a bucket, then sharded (q then has the bucket's token rows; padding rows come back
    out 0, lse -inf). `config.dcp_world_size` is W. impl: "reference" or "fa3". k_scale: the
    fp8 cache's per-tensor scale (one for all shards), passed to each shard's call when
    kv_cache_dtype="fp8_e4m3", 1.0 otherwise.
    Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`, and with
    `return_partials=True` also the stacked partials `(outs [W,T,H,L] float32, lses [W,T,H])`.
    """
    from mla_torch.api import check_metadata_data, mla_decode  # the package's entry point, with its checks

    if impl not in IMPLS:
        raise ValueError(f"unknown DCP impl={impl!r}; expected one of {IMPLS}")
    check_config_and_metadata(config, metadata_shards)
    check_metadata_data(metadata_shards, "metadata_shards.")
    _check_cache_shards(kv_cache_shards)
    world_size = len(kv_cache_shards)
    check_world_size(config, world_size)

    def host(x):
        return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

    host_md = metadata_shards.replace(
        query_start_loc=host(metadata_shards.query_start_loc),
        seq_lens=host(metadata_shards.seq_lens),
        block_table=host(metadata_shards.block_table),
        scheduler_metadata=None,
    )
    num_blocks_local = int(kv_cache_shards[0].shape[0])
    for s in range(world_size):
        if tuple(kv_cache_shards[s].shape) != tuple(kv_cache_shards[0].shape):
            raise ValueError(
                f"every shard's cache must have one shape, got kv_cache_shards[{s}].shape="
                f"{tuple(kv_cache_shards[s].shape)} != {tuple(kv_cache_shards[0].shape)}"
            )
    validate_shards(config, host_md, world_size=world_size, num_blocks_local=num_blocks_local)
    lc = local_config(config)
    # The shared ints of the stacked metadata (max_seq_len >= 1, ...), and shapes and dtypes, as
    # mla_jax.dcp_mla_decode checks them: each shard's call below recomputes max_seq_len from its
    # local lengths, so without this a bad value would pass unseen.
    md0 = host_md.replace(
        query_start_loc=host_md.query_start_loc[0], seq_lens=host_md.seq_lens[0], block_table=host_md.block_table[0]
    )
    parts = q if isinstance(q, tuple) else (q,)
    for x in parts + (kv_cache_shards[0],):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"q and kv_cache_shards must be torch tensors, got {type(x).__name__}")
    validate_inputs(
        lc,
        md0,
        q_shapes=tuple(tuple(x.shape) for x in parts),
        q_dtypes=tuple(dtype_name(x.dtype) for x in parts),
        kv_cache_shape=tuple(kv_cache_shards[0].shape),
        kv_cache_dtype=dtype_name(kv_cache_shards[0].dtype),
        check_values=False,
    )
    # The same k_scale check as mla_torch.mla_decode (NumPy / 0-d tensor scalars compare as floats).
    validate_k_scale(k_scale, config)
    extra = dict(k_scale=k_scale) if config.is_fp8_kv_cache else {}
    q_device = (q[0] if isinstance(q, tuple) else q).device
    # token row t is request req[t]'s (one token a real request); rows past query_start_loc[-1] are padding
    req, real = token_requests(host_md.query_start_loc[0], int(parts[0].shape[0]))
    outs, lses = [], []
    for s in range(world_size):
        md = shard_metadata(host_md, s, for_kernel=True)
        cache = kv_cache_shards[s]
        q_s = tuple(x.to(cache.device) for x in q) if isinstance(q, tuple) else q.to(cache.device)
        with torch.cuda.device(cache.device) if cache.device.type == "cuda" else contextlib.nullcontext():
            out, lse = mla_decode(q_s, cache, md, lc, impl=impl, **extra)
        out, lse = out.to(q_device), lse.to(q_device)
        empty = torch.as_tensor(~real | (np.asarray(host_md.seq_lens[s])[req] == 0), device=out.device)
        outs.append(torch.where(empty[:, None, None], torch.zeros((), device=out.device), out.float()))
        lses.append(torch.where(empty[:, None], torch.full((), float("-inf"), device=lse.device), lse.float()))
    outs, lses = torch.stack(outs), torch.stack(lses)
    q_dtype = (q[0] if isinstance(q, tuple) else q).dtype
    out, lse = merge_attn_states(outs, lses, out_dtype=q_dtype)
    return (out, lse, (outs, lses)) if return_partials else (out, lse)
