"""Decode context parallelism (DCP) in JAX: `dcp_mla_decode`, a `jax.shard_map` over a 1-D
mesh axis, each device running the single-device kernel on its KV shard, the partials
merged exactly through the LSE with collectives.

Layout (`mla_spec.dcp`): interleaved as vLLM (`cp_kv_cache_interleave_size = 1`): global
KV position p of a request lives on shard `p % W` at local position `p // W`. Per-shard
data is stacked on a leading axis of size W: `kv_cache_shards [W, num_blocks_local, P, L+R]`
and a `DecodeMetadata` with `query_start_loc [W, R+1]`, `seq_lens [W, R]` (local lengths,
0 for an empty shard), `block_table [W, R, max_blocks_local]` (one width for all shards).
`shard_batch` builds both from a global batch. Shard s of the stacks goes to device s of
the mesh axis; `q` is replicated; `out` and `lse` come back replicated.

One query token per request (q_len == 1, vLLM's restriction under DCP): it sees every KV
position, so each shard attends to all its local tokens. q_len > 1 raises ValueError.

Empty shards (seq_len <= s): the kernels validate `seq_len >= 1`, so the kernel runs them
with a dummy length 1 and their partial is then overwritten with `lse = -inf`, `out = 0`.

Padded buckets (`mla_spec.dcp`: pad to the bucket, then shard): padding requests (q_len 0,
seq_len 0) and token rows past `query_start_loc[-1]` are (0, -inf) on every shard, so after
the merge too. The stacked shapes and static ints of a padded batch are its bucket's, so
`dcp_mla_decode` (its own jitted shard_map, or inside the caller's `jax.jit`) compiles once
per bucket.

Merge on device s, with (o_s, lse_s) its partial:
    m = pmax(lse_s);  w_s = exp(lse_s - m);  W = psum(w_s);  out = psum(w_s * o_s) / W;
    lse = m + log(W)
in float32 (exact up to rounding), out cast to q's dtype. `merge_partials` does the same
on stacked partials without a mesh.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mla_jax import api as _api  # registers DecodeMetadata as a pytree
from mla_jax.combine import combine_ref
from mla_jax.reference import token_positions
from mla_spec import DecodeMetadata, MLAConfig, check_config_and_metadata, dtype_name, validate_inputs, validate_k_scale
from mla_spec.dcp import (
    DCPShards,
    check_partial_sequence,
    check_partials,
    check_world_size,
    local_config,
    local_len,
    local_seq_lens,
    shard_batch,
    shard_metadata,
    validate_shards,
)

__all__ = [
    "DCPShards",
    "DCP_IMPLS",
    "dcp_mla_decode",
    "local_len",
    "local_seq_lens",
    "make_dcp_mesh",
    "merge_over_axis",
    "merge_partials",
    "shard_batch",
    "shard_metadata",
]

DCP_IMPLS = ("xla", "pallas_triton", "pallas_mosaic_gpu")


def _as_partials(x, name: str):
    """`outs` or `lses` as a JAX array (jnp.asarray); ValueError naming `name` and the type where it cannot be one
    (None, a string)."""
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise ValueError(f"merge_partials takes arrays, got {name}={type(x).__name__}") from e


def merge_partials(outs, lses, out_dtype=None):
    """Exact LSE merge of stacked partials, no mesh needed.

    outs `[W, T, H, L]` (each normalized over its shard), lses `[W, T, H]` float32 (-inf for
    an empty shard) -> `(out [T, H, L] in out_dtype (default outs' dtype), lse [T, H] float32)`:
    lse = logsumexp over shards, out = sum_s exp(lse_s - lse) * out_s, computed in float32.
    A row with every shard empty gives out 0, lse -inf (no NaN); a NaN lse gives its row out NaN, lse NaN, and a
    +inf lse (which no decode returns) out NaN, lse +inf (never a plausible-looking finite row). Shapes and dtypes
    are checked (ValueError naming them; they are static, so also under jax.jit). outs and lses may also be
    sequences of W per-shard arrays of one shape; out_dtype a dtype or its name ("bfloat16")."""
    check_partial_sequence(outs, "outs", "merge_partials")
    check_partial_sequence(lses, "lses", "merge_partials")
    outs, lses = _as_partials(outs, "outs"), _as_partials(lses, "lses")
    check_partials(outs, lses, "merge_partials", dtype_name=dtype_name,
                   is_float=lambda d: jnp.issubdtype(d, jnp.floating))
    if out_dtype is None:
        out_dtype = outs.dtype
    else:
        try:
            is_float = jnp.issubdtype(out_dtype, jnp.floating)
        except TypeError:  # not a dtype: "nonsense", 5
            is_float = False
        if type(out_dtype).__module__.startswith("torch"):  # (jnp reads torch.float32 as no float dtype)
            raise ValueError(f"merge_partials takes a NumPy or JAX float out_dtype (or its name), got "
                             f"out_dtype={out_dtype} (a torch dtype)")
        if not is_float:
            shown = repr(out_dtype) if isinstance(out_dtype, str) else dtype_name(out_dtype)
            raise ValueError(f"merge_partials takes a float out_dtype, got out_dtype={shown}")
    # the split-KV combine's formula (mla_jax.combine): shards merge as splits do
    return combine_ref(outs.astype(jnp.float32), lses.astype(jnp.float32), out_dtype)


def _local_partial(q, kv_cache, md: DecodeMetadata, config: MLAConfig, impl: str, interpret: bool, k_scale=None):
    """One shard's `(out float32 [T,H,L], lse [T,H])`. q: `(q_packed,)` or `(q_nope, q_pe)`.
    The rows of a token whose request has no KV on this shard (md.seq_lens == 0: an empty shard,
    or a padding request) and the padding rows past query_start_loc[-1] are set to (0, -inf).
    k_scale: the fp8 cache's scale (None for other caches, where the kernels take none)."""
    T = q[0].shape[0]
    qsl, seq_lens = md.query_start_loc, md.seq_lens
    req, _ = token_positions(md, T)  # (past qsl[-1]: one past the last request, clamped by the gather below)
    empty = (jnp.arange(T) >= qsl[-1]) | (seq_lens[req] == 0)  # [T]
    # the dummy length 1 for a real request's empty shard; a padding request (q_len 0) keeps 0
    kmd = md.replace(seq_lens=jnp.where(qsl[1:] > qsl[:-1], jnp.maximum(seq_lens, 1), seq_lens))
    lc = local_config(config)
    if impl == "xla":
        from mla_jax import reference

        q_nope, q_pe = q if len(q) == 2 else _api.split_q(q[0], config)
        extra = () if k_scale is None else (k_scale,)
        out, lse = reference.mla_decode(q_nope, q_pe, kv_cache, kmd, lc, *extra)
    else:
        # the Pallas kernels read a packed q themselves (as mla_jax.mla_decode passes it)
        mod = _api._module(impl)
        q_nope, q_pe = q if len(q) == 2 else (q[0], None)
        extra = {} if k_scale is None else dict(k_scale=k_scale)
        out, lse = mod.mla_decode(q_nope, q_pe, kv_cache, kmd, lc, interpret=interpret, **extra)
    out = jnp.where(empty[:, None, None], 0.0, out.astype(jnp.float32))
    lse = jnp.where(empty[:, None], -jnp.inf, lse)
    return out, lse


def merge_over_axis(o, lse, axis_name: str, out_dtype):
    """The exact LSE merge inside a `shard_map`: this device's partial `o [T,H,L]` float32,
    `lse [T,H]` with the other devices' of `axis_name` -> `(out [T,H,L] in out_dtype, lse [T,H]
    float32)`, the same on every device (pmax, then psum of the weights and of the weighted
    outs: two all-reduces of [T,H] and one of [T,H,L]). `merge_partials`' formula."""
    m = jax.lax.pmax(lse, axis_name)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    w = jnp.exp(lse - m_safe)  # 0 on an empty shard
    w_sum = jax.lax.psum(w, axis_name)
    acc = jax.lax.psum(jnp.where(w[..., None] > 0, w[..., None] * o, 0.0), axis_name)
    out = acc / jnp.where(w_sum > 0, w_sum, 1.0)[..., None]
    out = jnp.where(jnp.isnan(w_sum)[..., None], jnp.nan, out)  # a NaN shard: NaN, not 0 (combine_ref's rule)
    return out.astype(out_dtype), m_safe + jnp.log(w_sum)


@functools.lru_cache(maxsize=64)
def _build(mesh: Mesh, axis_name: str, config: MLAConfig, impl: str, interpret: bool,
           max_seq_len: int, num_decode_tokens: int, max_num_splits: int, padded: bool, return_partials: bool):
    """The jitted `shard_map` of one (mesh, config, impl, static metadata ints), built once: each
    device computes its shard's partial, then the exact LSE merge runs through pmax/psum
    (`merge_over_axis`). With return_partials the partials come back too, stacked over the axis."""
    spec = PartitionSpec(axis_name)

    def body(q, kv_cache, qsl, seq_lens, block_table, k_scale):
        md = DecodeMetadata(
            query_start_loc=qsl[0], seq_lens=seq_lens[0], block_table=block_table[0], max_query_len=1,
            max_seq_len=max_seq_len, num_decode_tokens=num_decode_tokens, max_num_splits=max_num_splits,
            padded=padded,
        )
        o, lse = _local_partial(q, kv_cache[0], md, config, impl, interpret,
                                k_scale if config.is_fp8_kv_cache else None)
        out, lse_all = merge_over_axis(o, lse, axis_name, q[0].dtype)
        return (out, lse_all, o[None], lse[None]) if return_partials else (out, lse_all)

    replicated = PartitionSpec()
    mapped = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(replicated, spec, spec, spec, spec, replicated),
        out_specs=(replicated, replicated) + ((spec, spec) if return_partials else ()),
        # The Pallas kernels' out_shape carries no vma (under check_vma=True, jax 0.11 asks for
        # manual_axis_type on its ShapeDtypeStruct), so the check runs on the XLA path only; the
        # outputs are psum/pmax results, replicated by construction.
        check_vma=impl == "xla",
    )
    return jax.jit(mapped)


def dcp_mla_decode(
    q,
    kv_cache_shards,
    metadata_shards: DecodeMetadata,
    config: MLAConfig,
    *,
    mesh: Mesh,
    axis_name: str = "dcp",
    impl: str = "xla",
    interpret: bool | None = None,
    k_scale=1.0,
    return_partials: bool = False,
):
    """Paged MLA decode with the KV sharded across the `axis_name` axis of `mesh`.

    q: `[T, H, L+R]` or `(q_nope, q_pe)`, replicated; kv_cache_shards: `[W, num_blocks_local,
    P, L+R]`; metadata_shards: the stacked `DecodeMetadata` (see the module docstring; from
    `shard_batch`; a batch padded to a bucket, then sharded, has padded=True and T = the
    bucket's token rows). `config.dcp_world_size` must equal the mesh axis size W. impl: "xla",
    "pallas_triton" or "pallas_mosaic_gpu" (interpret: None = on CPU). k_scale: the fp8 cache's
    per-tensor scale (one for all shards; kv_cache_dtype="fp8_e4m3"), 1.0 otherwise, as in
    `mla_jax.mla_decode`. Returns `(out [T, H, L] in q's dtype, lse [T, H] float32)`, replicated
    over the mesh; equal to the single-device result on the unsharded batch up to rounding;
    padding rows (0, -inf). With `return_partials=True` also the shards' partials `(outs [W, T,
    H, L] float32, lses [W, T, H])`, sharded over the axis (empty shards (0, -inf)).

    Shard s of the stacks runs on device s of the mesh axis (other mesh axes, if any, see the
    same data). Per-shard values (block ids in range, one token per request) are checked when
    the metadata is concrete; under an outer `jax.jit` only shapes and dtypes are.
    """
    check_config_and_metadata(config, metadata_shards, metadata_name="metadata_shards")
    _api.check_interpret(interpret, allow_none=True)
    if impl not in DCP_IMPLS:
        raise ValueError(f"unknown DCP impl={impl!r}; expected one of {DCP_IMPLS}")
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh, got mesh={type(mesh).__name__}")
    if axis_name not in mesh.shape:
        raise ValueError(f"axis_name={axis_name!r} is not an axis of the mesh, mesh.shape={dict(mesh.shape)}")
    world_size = int(mesh.shape[axis_name])
    check_world_size(config, world_size)
    parts = _api.array_parts(q, kv_cache_shards, "kv_cache_shards")
    _api.check_jax_arrays(query_start_loc=metadata_shards.query_start_loc, seq_lens=metadata_shards.seq_lens,
                          block_table=metadata_shards.block_table)
    if len(kv_cache_shards.shape) != 4 or kv_cache_shards.shape[0] != world_size:
        raise ValueError(
            f"kv_cache_shards must be [world_size={world_size}, num_blocks_local, page_size, "
            f"{config.head_dim}], got kv_cache_shards.shape={tuple(kv_cache_shards.shape)}"
        )
    concrete = all(
        _api._is_concrete(x)
        for x in (metadata_shards.query_start_loc, metadata_shards.seq_lens, metadata_shards.block_table)
    )
    num_blocks_local = int(kv_cache_shards.shape[1])
    validate_shards(
        config, metadata_shards, world_size=world_size, num_blocks_local=num_blocks_local, check_values=concrete
    )
    lc = local_config(config)
    # Shapes and dtypes of one shard's call (values: validate_shards above, per shard).
    md0 = metadata_shards.replace(
        query_start_loc=metadata_shards.query_start_loc[0],
        seq_lens=metadata_shards.seq_lens[0],
        block_table=metadata_shards.block_table[0],
    )
    validate_inputs(
        lc,
        md0,
        q_shapes=tuple(tuple(x.shape) for x in parts),
        q_dtypes=tuple(dtype_name(x.dtype) for x in parts),
        kv_cache_shape=tuple(kv_cache_shards.shape[1:]),
        kv_cache_dtype=dtype_name(kv_cache_shards.dtype),
        check_values=False,
    )
    if config.is_fp8_kv_cache or not (isinstance(k_scale, (int, float)) and k_scale == 1.0):
        validate_k_scale(k_scale, config, concrete=not isinstance(k_scale, jax.core.Tracer))
    if impl != "xla":
        reason = _api.unsupported_reason(impl, lc, None)
        if reason is not None:
            raise NotImplementedError(f"impl={impl!r} cannot run this problem: {reason}")
    if interpret is None:
        interpret = _api.default_interpret()
    if not isinstance(return_partials, bool):
        raise ValueError(f"return_partials must be a bool, got return_partials={return_partials!r}")
    sharded = NamedSharding(mesh, PartitionSpec(axis_name))
    replicated = NamedSharding(mesh, PartitionSpec())

    def put(x, dtype=None, sharding=sharded):
        x = jnp.asarray(x, dtype) if dtype is not None else x
        return jax.device_put(x, sharding)

    fn = _build(
        mesh, axis_name, config, impl, bool(interpret) if impl != "xla" else False,
        int(metadata_shards.max_seq_len), int(metadata_shards.num_decode_tokens), int(metadata_shards.max_num_splits),
        bool(metadata_shards.padded), return_partials,
    )
    return fn(
        tuple(put(x, sharding=replicated) for x in parts),
        put(kv_cache_shards),
        put(metadata_shards.query_start_loc, jnp.int32),
        put(metadata_shards.seq_lens, jnp.int32),
        put(metadata_shards.block_table, jnp.int32),
        put(k_scale, jnp.float32, sharding=replicated),
    )


def make_dcp_mesh(world_size: int, axis_name: str = "dcp", devices=None) -> Mesh:
    """A 1-D mesh of the first `world_size` devices (of `devices`, default `jax.devices()`); world_size an int >= 1
    (ValueError naming it otherwise)."""
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size=!r}")
    devices = jax.devices() if devices is None else list(devices)
    if len(devices) < world_size:
        raise ValueError(f"need {world_size=} devices, got {len(devices)} ({devices[0].platform})")
    return Mesh(np.array(devices[:world_size]), (axis_name,))
