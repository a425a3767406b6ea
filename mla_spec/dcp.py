"""Decode context parallelism (DCP): the KV layout across shards, and the sharding of a
batch (NumPy only, shared by `mla_jax.dcp` and `mla_torch.dcp`).

Layout: interleaved, as vLLM with `cp_kv_cache_interleave_size = 1`. Global KV position
p of a request lives on shard `p % world_size`, at local position `p // world_size`.
Shard s of a request with seq_len S therefore holds
`local_len(S, s) = max(0, ceil((S - s) / world_size))` tokens (0 when S <= s: an empty
shard). Each shard has its own paged cache `[num_blocks_local, page_size, L+R]` and its
own block table of local page ids.

Stacked form: the per-shard data of a batch is stacked on a leading world axis, which is
what `mla_jax.dcp_mla_decode` shards over a mesh axis and what `mla_torch.dcp` loops over:
  kv_cache_shards `[W, num_blocks_local, P, L+R]`;
  metadata_shards: a `DecodeMetadata` whose arrays carry a leading W axis:
    query_start_loc `[W, R+1]` (the same on every shard), seq_lens `[W, R]` (the local
    lengths, 0 for an empty shard), block_table `[W, R, max_blocks_local]` (one width for
    all shards); the ints are shared: max_query_len (1), max_seq_len (a bound on the local
    lengths, >= 1: `stacked_bounds`), num_decode_tokens (T: R, or a bucket's token rows with
    padded=True), padded (the global batch's).

Queries: one token per request (q_len == 1), as vLLM restricts DCP decode
(`reorder_batch_threshold = 1` when `dcp_world_size > 1`). Such a token sits at the last
global position and sees every KV position, so each shard attends to all its local
tokens and no cross-shard causal mask is needed.

Empty shards: the kernels take `1 <= q_len <= seq_len` only (validation stays strict).
`kernel_seq_lens` gives them a dummy length 1 (reading local slot 0 through block_table
column 0, possibly padding or NaN), and the DCP entry points then overwrite that request's
partial with `lse = -inf`, `out = 0`, which the LSE merge weighs 0.

Padded buckets: a serving loop pads the global batch to a `Bucket` first (`pad_to_bucket`),
then shards it (`shard_batch`), as vLLM builds each rank's DCP metadata (its local seq_lens)
from the batch already padded to a CUDA-graph size. Padding requests (q_len 0, seq_len 0)
then hold no KV on any shard and keep length 0 in the kernels' metadata (`padded=True` lets
them through); token rows past `query_start_loc[-1]` are padding. Every shard gives those
rows (0, -inf), and so does the merge. Padding first keeps the stacked form static: its
shapes and static ints (`stacked_bounds`: the local block-table width and max_seq_len, from
the bucket's `max_blocks` and `max_seq_len`; the requests and token rows; the local cache's
blocks, by default `1 + num_reqs * local width`) are functions of the bucket and W alone, so
a jitted `mla_jax.dcp_mla_decode` compiles once per bucket, whatever the lengths. Sharding
first would size the local tables by each batch's longest shard, and a second "local bucket"
would then have to be derived from the global one anyway.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mla_spec.config import MLAConfig, check_config
from mla_spec.inputs import (_FLOAT_DTYPE_NAMES, FP8_DTYPE_NAMES, check_config_and_metadata, check_kv_cache_shape,
                              dtype_name)
from mla_spec.metadata import DecodeMetadata, check_fits_int32, check_metadata_arrays


def local_len(seq_len, rank: int, world_size: int):
    """Number of global positions p < seq_len with p % world_size == rank (arrays broadcast)."""
    seq_len = np.asarray(seq_len, np.int64)
    return np.maximum(0, (seq_len - rank + world_size - 1) // world_size)


def local_seq_lens(seq_lens, world_size: int) -> np.ndarray:
    """`[W, R]` int32: the local KV length of each request on each shard."""
    seq_lens = np.asarray(seq_lens, np.int64)
    return np.stack([local_len(seq_lens, s, world_size) for s in range(world_size)]).astype(np.int32)


def kernel_seq_lens(local_lens, query_lens=None):
    """The lengths the per-shard kernel runs with: `max(local_len, 1)` (the dummy length 1 of
    an empty shard; its partial is overwritten with lse = -inf, out = 0 afterwards), except
    for padding requests (q_len 0 in `query_lens`, where given), which keep their length 0."""
    local = np.asarray(local_lens)
    lens = np.maximum(local, 1)
    if query_lens is not None:
        lens = np.where(np.asarray(query_lens) == 0, local, lens)
    return lens.astype(np.int32)


def token_requests(query_start_loc, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """`(request [T], real [T])` for T = num_tokens query rows: the request each token row belongs
    to, and whether the row is a real token (False past `query_start_loc[-1]`: a padded batch's
    padding rows, whose request index is clipped to a valid one and means nothing)."""
    qsl = np.asarray(query_start_loc, np.int64)
    t = np.arange(num_tokens)
    req = np.clip(np.searchsorted(qsl, t, side="right") - 1, 0, qsl.shape[0] - 2)
    return req, t < qsl[-1]


def stacked_bounds(max_seq_len: int, max_blocks: int, page_size: int, world_size: int) -> tuple[int, int]:
    """`(max_seq_len_local, max_blocks_local)` of the stacked form of a batch whose global
    metadata has these bounds: a request holds at most `min(max_seq_len, max_blocks * page_size)`
    tokens, shard 0 the most of them (`local_len(n, 0, W)`), in that many pages. Functions of
    the global static fields only, so a padded batch's stacked shapes are its bucket's."""
    bound = min(int(max_seq_len), int(max_blocks) * int(page_size))
    local_max = max(1, int(local_len(bound, 0, world_size)))
    return local_max, -(-local_max // int(page_size))


def check_world_size(config: MLAConfig, world_size: int) -> None:
    """Raises ValueError unless `world_size` is an int >= 1 equal to `config.dcp_world_size`."""
    check_config(config)
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size=!r}")
    if config.dcp_world_size != world_size:
        raise ValueError(
            f"config.dcp_world_size must equal the DCP world size, got "
            f"config.dcp_world_size={config.dcp_world_size}, {world_size=}"
        )


def check_single_token_queries(query_start_loc, *, padded: bool = False, seq_lens=None) -> None:
    """DCP decodes one query token per request; raises ValueError naming the first request that
    does not. With `padded=True` (a batch padded to a bucket) a request may also be padding:
    q_len 0, and seq_len 0 where `seq_lens` (`[R]`, the requests' total lengths) is given.
    `query_start_loc` is `[R+1]`, or stacked `[W, R+1]`."""
    qsl = np.asarray(query_start_loc, np.int64)
    query_lens = np.diff(qsl, axis=-1).reshape(-1, qsl.shape[-1] - 1)
    seq = None if seq_lens is None else np.asarray(seq_lens, np.int64).reshape(-1)
    for row in query_lens:
        bad = row != 1
        if padded:
            bad &= ~((row == 0) & ((seq == 0) if seq is not None else True))
        hits = np.flatnonzero(bad)
        if not hits.size:
            continue
        r = int(hits[0])
        q_len = int(row[r])
        if q_len == 0 and not padded:
            raise ValueError(
                f"decode context parallelism takes q_len == 1 per request, got q_len=0 for request {r} (a padding "
                f"request, q_len 0 and seq_len 0, needs padded=True: pad_to_bucket)"
            )
        if q_len == 0:
            raise ValueError(
                f"a padding request has q_len 0 and seq_len 0, got q_len=0 with seq_len={int(seq[r])} for request {r}"
            )
        raise ValueError(
            f"decode context parallelism takes q_len == 1 per request (vLLM's reorder_batch_threshold=1 "
            f"under DCP), got q_len={q_len} for request {r}"
        )


def local_config(config: MLAConfig) -> MLAConfig:
    """The config a per-shard kernel runs with: the same layer, dcp_world_size=1 (it sees one KV shard)."""
    check_config(config)
    return config.replace(dcp_world_size=1)


@dataclasses.dataclass(frozen=True)
class DCPShards:
    """A batch split across `world_size` DCP shards (stacked form, see the module docstring)."""

    kv_cache: np.ndarray  # [W, num_blocks_local, P, L+R]
    metadata: DecodeMetadata  # arrays with a leading W axis
    world_size: int

    def shard_metadata(self, rank: int) -> DecodeMetadata:
        return shard_metadata(self.metadata, rank)


def shard_metadata(metadata_shards: DecodeMetadata, rank: int, *, for_kernel: bool = False) -> DecodeMetadata:
    """Shard `rank`'s own `DecodeMetadata` from the stacked form. `for_kernel=True` gives the
    empty shards of real requests the dummy length 1 (`kernel_seq_lens`; padding requests keep 0),
    so that it passes validation."""
    seq_lens = np.asarray(metadata_shards.seq_lens[rank], np.int32)
    qsl = np.asarray(metadata_shards.query_start_loc[rank], np.int32)
    if for_kernel:
        seq_lens = kernel_seq_lens(seq_lens, np.diff(qsl))
    return metadata_shards.replace(
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_table=np.asarray(metadata_shards.block_table[rank], np.int32),
        max_seq_len=max(1, int(seq_lens.max())),
        scheduler_metadata=None,
    )


def validate_shards(
    config: MLAConfig, metadata_shards: DecodeMetadata, *, world_size: int, num_blocks_local: int,
    check_values: bool = True,
) -> None:
    """Checks the stacked metadata: leading axes of size world_size, one token per request, and
    every shard's kernel metadata (empty shards at their dummy length 1) valid for a cache of
    `num_blocks_local` blocks, and the local lengths those of the interleaved layout (shard s of a
    request of S tokens in all holds `local_len(S, s)`). Raises ValueError naming what broke."""
    check_config_and_metadata(config, metadata_shards, metadata_name="metadata_shards")
    check_world_size(config, world_size)
    for name in ("query_start_loc", "seq_lens", "block_table"):
        arr = getattr(metadata_shards, name)
        want = {"query_start_loc": 2, "seq_lens": 2, "block_table": 3}[name]
        if not hasattr(arr, "shape") or len(arr.shape) != want or arr.shape[0] != world_size:
            shape = tuple(getattr(arr, "shape", ()))
            raise ValueError(
                f"metadata_shards.{name} must be stacked per shard with a leading axis of {world_size=} "
                f"({want}-D), got metadata_shards.{name}.shape={shape}"
            )
    if metadata_shards.max_query_len != 1:
        raise ValueError(
            f"decode context parallelism takes q_len == 1 per request, got "
            f"metadata_shards.max_query_len={metadata_shards.max_query_len}"
        )
    # integer dtypes (a float block table would be truncated into block ids), then, with the values, every entry
    # inside int32 (the shards' kernel metadata is cast to int32: 2**32 + 3 must not run as block 3)
    check_metadata_arrays(metadata_shards, "metadata_shards")
    if not check_values:
        return
    for name in ("query_start_loc", "seq_lens", "block_table"):
        check_fits_int32(f"metadata_shards.{name}", np.asarray(getattr(metadata_shards, name)))
    qsl = np.asarray(metadata_shards.query_start_loc)
    seq_lens = np.asarray(metadata_shards.seq_lens)
    if (seq_lens < 0).any():
        s, r = (int(i) for i in np.argwhere(seq_lens < 0)[0])
        raise ValueError(f"local seq_lens must be >= 0, got metadata_shards.seq_lens[{s}, {r}]={int(seq_lens[s, r])}")
    padded = bool(metadata_shards.padded)
    check_single_token_queries(qsl, padded=padded, seq_lens=seq_lens.astype(np.int64).sum(axis=0))
    if not (qsl == qsl[:1]).all():
        raise ValueError("metadata_shards.query_start_loc must be the same on every shard")
    # A request with no KV anywhere: a padding request (q_len 0, with padded=True) only.
    no_kv = (seq_lens.sum(axis=0) < 1) & (np.diff(qsl[0]) != 0)
    if no_kv.any():
        r = int(np.flatnonzero(no_kv)[0])
        raise ValueError(f"request {r} has no KV on any shard: metadata_shards.seq_lens[:, {r}] are all 0")
    # The interleaved layout fixes each shard's share of a request's tokens: a shard cut short
    # drops tokens (a finite, wrong answer), a shard too long reads slots that hold no token.
    totals = seq_lens.astype(np.int64).sum(axis=0)  # [R]
    expected = local_seq_lens(totals, world_size)  # [W, R]
    if (seq_lens != expected).any():
        s, r = (int(i) for i in np.argwhere(seq_lens != expected)[0])
        raise ValueError(
            f"local seq_lens do not fit the interleaved layout (KV position p on shard p % {world_size}): request {r} "
            f"has {int(totals[r])} tokens over the shards, which puts {expected[:, r].tolist()} on shards "
            f"0..{world_size - 1}; got metadata_shards.seq_lens[:, {r}]={seq_lens[:, r].tolist()} (first difference: "
            f"shard {s} of request {r}, expected {int(expected[s, r])}, got metadata_shards.seq_lens[{s}, {r}]="
            f"{int(seq_lens[s, r])})"
        )
    longest, msl = int(seq_lens.max()), metadata_shards.max_seq_len
    # (an upper bound, as DecodeMetadata's; a non-int or one below 1 is named by the shapes' check)
    if isinstance(msl, (int, np.integer)) and not isinstance(msl, bool) and 1 <= msl < longest:
        raise ValueError(
            f"metadata_shards.max_seq_len is below the longest local sequence, got "
            f"metadata_shards.max_seq_len={metadata_shards.max_seq_len} < {longest}"
        )
    lc = local_config(config)
    for s in range(world_size):
        shard_metadata(metadata_shards, s, for_kernel=True).validate(lc, num_blocks=num_blocks_local)


def shard_layout(
    metadata: DecodeMetadata,
    config: MLAConfig,
    *,
    world_size: int | None = None,
    num_blocks: int | None = None,
    num_blocks_local: int | None = None,
    permute_blocks: bool = False,
    seed: int = 0,
) -> tuple[DecodeMetadata, np.ndarray]:
    """The interleaved sharding of a global batch, without its data: `(metadata_shards, source)`,
    `source [W, num_blocks_local, P]` int64 the global slot (`block * P + offset` of the global
    cache) that each local slot holds, -1 for a slot no request reads. `shard_batch` gathers a
    NumPy cache through it; a benchmark can gather a device array the same way. `num_blocks`:
    the global cache's blocks, for the block-id range check.

    The stacked shapes and static ints are functions of the global metadata's (`stacked_bounds`):
    a batch padded to a bucket (`pad_to_bucket`, padded=True) has those of its bucket.
    `num_blocks_local` (the local caches' blocks): None takes `1 + num_reqs * max_blocks_local`
    for a padded batch (the bucket's bound: static) and the fewest that hold the batch otherwise;
    an int must hold the batch (ValueError naming both). Local block 0 is left unused (the padding
    target of the block tables); local pages are numbered from 1 in request order, or in a random
    order with `permute_blocks=True` (drawn with `seed`). Every real request must have q_len == 1;
    a padded batch's padding requests (q_len 0, seq_len 0) get no pages.
    """
    check_config(config)
    world_size = config.dcp_world_size if world_size is None else world_size
    check_world_size(config, world_size)
    check_single_token_queries(metadata.query_start_loc, padded=bool(metadata.padded), seq_lens=metadata.seq_lens)
    metadata.validate(config, num_blocks=num_blocks)
    P = config.page_size
    seq_lens = np.asarray(metadata.seq_lens, np.int64)
    bt = np.asarray(metadata.block_table, np.int64)
    R = seq_lens.shape[0]
    lens = local_seq_lens(seq_lens, world_size).astype(np.int64)  # [W, R]
    pages = (lens + P - 1) // P  # [W, R]
    max_seq_len_local, max_blocks_local = stacked_bounds(metadata.max_seq_len, metadata.max_blocks, P, world_size)
    need = 1 + int(pages.sum(axis=1).max())
    if num_blocks_local is None:
        num_blocks_local = 1 + R * max_blocks_local if metadata.padded else need
    elif isinstance(num_blocks_local, bool) or not isinstance(num_blocks_local, (int, np.integer)) \
            or num_blocks_local < need:
        raise ValueError(
            f"num_blocks_local must be an int that holds the batch's local pages (block 0 unused: >= {need}), "
            f"got num_blocks_local={num_blocks_local!r}"
        )
    num_blocks_local = int(num_blocks_local)
    rng = np.random.default_rng(seed)
    source = np.full((world_size, num_blocks_local, P), -1, np.int64)
    tables = np.zeros((world_size, R, max_blocks_local), np.int32)
    for s in range(world_size):
        ids = np.arange(1, 1 + int(pages[s].sum()))
        if permute_blocks:
            ids = rng.permutation(np.arange(1, num_blocks_local))[: ids.size]
        k = 0
        for r in range(R):
            n = int(pages[s, r])
            tables[s, r, :n] = ids[k : k + n]
            k += n
            j = np.arange(lens[s, r])  # local positions
            p = j * world_size + s  # their global positions
            source[s, tables[s, r, j // P], j % P] = bt[r, p // P] * P + p % P
    qsl = np.asarray(metadata.query_start_loc, np.int32)
    md = DecodeMetadata(
        query_start_loc=np.broadcast_to(qsl, (world_size, qsl.shape[0])).copy(),
        seq_lens=lens.astype(np.int32),
        block_table=tables,
        max_query_len=1,
        max_seq_len=max_seq_len_local,
        num_decode_tokens=int(metadata.num_decode_tokens),
        max_num_splits=metadata.max_num_splits,
        padded=bool(metadata.padded),
    )
    validate_shards(config, md, world_size=world_size, num_blocks_local=num_blocks_local)
    return md, source


def shard_batch(
    kv_cache: np.ndarray,
    metadata: DecodeMetadata,
    config: MLAConfig,
    *,
    world_size: int | None = None,
    num_blocks_local: int | None = None,
    permute_blocks: bool = False,
    seed: int = 0,
    fill: float = np.nan,
) -> DCPShards:
    """Splits a global batch (`kv_cache [num_blocks, P, L+R]` + its `metadata`) into
    `world_size` (default `config.dcp_world_size`) interleaved shards (`shard_layout`: the
    local tables, and `num_blocks_local`, `permute_blocks`, `seed`).

    Unread slots (local block 0, the padding target of the block tables, among them) are set
    to `fill` (NaN by default, so that a kernel reading them shows). Every real request must
    have q_len == 1; a batch padded to a bucket (padded=True) is sharded into the stacked form
    of that bucket, whatever its lengths. The cache's shape is checked against the config as the
    decode checks it (`check_kv_cache_shape`), and its dtype must be a float one (NumPy batches hold a
    16-bit or fp8 cache's values as float32): ValueError naming them otherwise.
    """
    check_config(config)
    kv_cache = np.asarray(kv_cache)
    check_kv_cache_shape(config, tuple(kv_cache.shape))
    if dtype_name(kv_cache.dtype) not in _FLOAT_DTYPE_NAMES + FP8_DTYPE_NAMES:
        raise ValueError(f"kv_cache must hold floats, got kv_cache.dtype={dtype_name(kv_cache.dtype)}")
    md, source = shard_layout(metadata, config, world_size=world_size, num_blocks=int(kv_cache.shape[0]),
                              num_blocks_local=num_blocks_local, permute_blocks=permute_blocks, seed=seed)
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    caches = np.where((source >= 0)[..., None], flat[np.maximum(source, 0)], np.asarray(fill, kv_cache.dtype))
    return DCPShards(kv_cache=caches.astype(kv_cache.dtype, copy=False), metadata=md, world_size=md.seq_lens.shape[0])


def check_partial_sequence(items, name: str, fn: str) -> None:
    """For `outs` or `lses` given as a list or tuple of W per-shard arrays (before they are stacked): raises
    ValueError on an empty sequence (W = 0) or on arrays of different shapes, naming the first that differs.
    A sequence of other things (nested lists of numbers) is left to the caller's conversion."""
    if not isinstance(items, (list, tuple)):
        return
    if len(items) == 0:
        raise ValueError(f"{fn} needs at least one shard (W >= 1), got an empty {name} (len({name})=0)")
    if not all(hasattr(x, "shape") for x in items):
        return
    first = tuple(items[0].shape)
    for i, x in enumerate(items):
        if tuple(x.shape) != first:
            raise ValueError(
                f"{fn} takes W partials of one shape, got {name}[{i}].shape={tuple(x.shape)} != {name}[0].shape={first}"
            )


def check_partials(outs, lses, fn: str, *, dtype_name, is_float=None) -> None:
    """Raises ValueError unless outs is `[W, T, H, L]` and lses `[W, T, H]` with W >= 1, both of a
    float dtype (shapes only: fine on traced arrays)."""
    shapes = f"outs.shape={tuple(outs.shape)}, lses.shape={tuple(lses.shape)}"
    if len(outs.shape) != 4 or len(lses.shape) != 3 or tuple(outs.shape[:3]) != tuple(lses.shape):
        raise ValueError(f"{fn} takes outs [W, T, H, L] and lses [W, T, H], got {shapes}")
    if outs.shape[0] < 1:
        raise ValueError(f"{fn} needs at least one shard (W >= 1), got {shapes}")
    # NumPy's own floats, or ml_dtypes' (bfloat16, float8_*: kind "V" to NumPy)
    is_float = is_float or (lambda d: np.dtype(d).kind == "f" or np.dtype(d).name.startswith(("bfloat", "float")))
    for name, x in (("outs", outs), ("lses", lses)):
        if not is_float(x.dtype):
            raise ValueError(f"{fn} takes float {name}, got {name}.dtype={dtype_name(x.dtype)}")


def merge_partials(outs, lses):
    """The exact LSE merge, float64 NumPy (the definition the backends follow):
    outs `[W, T, H, L]` (each normalized over its shard), lses `[W, T, H]` (-inf for an empty
    shard) -> `(out [T, H, L], lse [T, H])`; lse = logsumexp over shards,
    out = sum_s exp(lse_s - lse) * out_s. A row with every shard empty gives out 0, lse -inf; a NaN lse (a
    non-finite q entry of that head) gives its row out NaN, lse NaN, and a +inf lse (which no decode returns) out
    NaN, lse +inf: never a plausible-looking finite row."""
    check_partial_sequence(outs, "outs", "merge_partials")
    check_partial_sequence(lses, "lses", "merge_partials")
    outs = np.asarray(outs)
    lses = np.asarray(lses)
    check_partials(outs, lses, "merge_partials", dtype_name=lambda d: np.dtype(d).name)
    outs = outs.astype(np.float64)
    lses = lses.astype(np.float64)
    m = lses.max(axis=0)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(lses - m_safe)
    w_sum = w.sum(axis=0)
    out = np.where(w[..., None] > 0, w[..., None] * outs, 0.0).sum(axis=0) / np.where(w_sum > 0, w_sum, 1.0)[..., None]
    out = np.where(np.isnan(w_sum)[..., None], np.nan, out)
    with np.errstate(divide="ignore"):
        lse = m_safe + np.log(w_sum)
    return out, lse
