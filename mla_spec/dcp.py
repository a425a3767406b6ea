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
    all shards); the ints are shared: max_query_len (1), max_seq_len (the longest local
    length, >= 1), num_decode_tokens (T = R).

Queries: one token per request (q_len == 1), as vLLM restricts DCP decode
(`reorder_batch_threshold = 1` when `dcp_world_size > 1`). Such a token sits at the last
global position and sees every KV position, so each shard attends to all its local
tokens and no cross-shard causal mask is needed.

Empty shards: the kernels take `1 <= q_len <= seq_len` only (validation stays strict).
`kernel_seq_lens` gives them a dummy length 1 (reading local slot 0 through block_table
column 0, possibly padding or NaN), and the DCP entry points then overwrite that request's
partial with `lse = -inf`, `out = 0`, which the LSE merge weighs 0.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mla_spec.config import MLAConfig, check_config
from mla_spec.inputs import check_config_and_metadata
from mla_spec.metadata import DecodeMetadata


def local_len(seq_len, rank: int, world_size: int):
    """Number of global positions p < seq_len with p % world_size == rank (arrays broadcast)."""
    seq_len = np.asarray(seq_len, np.int64)
    return np.maximum(0, (seq_len - rank + world_size - 1) // world_size)


def local_seq_lens(seq_lens, world_size: int) -> np.ndarray:
    """`[W, R]` int32: the local KV length of each request on each shard."""
    seq_lens = np.asarray(seq_lens, np.int64)
    return np.stack([local_len(seq_lens, s, world_size) for s in range(world_size)]).astype(np.int32)


def kernel_seq_lens(local_lens):
    """The lengths the per-shard kernel runs with: `max(local_len, 1)` (the dummy length 1 of
    an empty shard; its partial is overwritten with lse = -inf, out = 0 afterwards)."""
    return np.maximum(np.asarray(local_lens), 1).astype(np.int32)


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


def check_single_token_queries(query_start_loc) -> None:
    """DCP decodes one query token per request; raises ValueError naming the first q_len > 1."""
    qsl = np.asarray(query_start_loc, np.int64)
    query_lens = np.diff(qsl, axis=-1).reshape(-1, qsl.shape[-1] - 1)
    for row in query_lens:
        bad = np.flatnonzero(row != 1)
        if bad.size:
            r = int(bad[0])
            raise ValueError(
                f"decode context parallelism takes q_len == 1 per request (vLLM's reorder_batch_threshold=1 "
                f"under DCP), got q_len={int(row[r])} for request {r}"
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
    empty shards the dummy length 1 (`kernel_seq_lens`), so that it passes validation."""
    seq_lens = np.asarray(metadata_shards.seq_lens[rank], np.int32)
    if for_kernel:
        seq_lens = kernel_seq_lens(seq_lens)
    return metadata_shards.replace(
        query_start_loc=np.asarray(metadata_shards.query_start_loc[rank], np.int32),
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
    if not check_values:
        return
    qsl = np.asarray(metadata_shards.query_start_loc)
    check_single_token_queries(qsl)
    if not (qsl == qsl[:1]).all():
        raise ValueError("metadata_shards.query_start_loc must be the same on every shard")
    seq_lens = np.asarray(metadata_shards.seq_lens)
    if not np.issubdtype(seq_lens.dtype, np.integer):
        raise ValueError(f"seq_lens must have an integer dtype, got metadata_shards.seq_lens.dtype={seq_lens.dtype}")
    if (seq_lens < 0).any():
        s, r = (int(i) for i in np.argwhere(seq_lens < 0)[0])
        raise ValueError(f"local seq_lens must be >= 0, got metadata_shards.seq_lens[{s}, {r}]={int(seq_lens[s, r])}")
    if (seq_lens.sum(axis=0) < 1).any():
        r = int(np.flatnonzero(seq_lens.sum(axis=0) < 1)[0])
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


def shard_batch(
    kv_cache: np.ndarray,
    metadata: DecodeMetadata,
    config: MLAConfig,
    *,
    world_size: int | None = None,
    permute_blocks: bool = False,
    seed: int = 0,
    fill: float = np.nan,
) -> DCPShards:
    """Splits a global batch (`kv_cache [num_blocks, P, L+R]` + its `metadata`) into
    `world_size` (default `config.dcp_world_size`) interleaved shards.

    Each shard gets its own cache; local block 0 is left unused (the padding target of the
    block tables), local pages are numbered from 1 in request order, or in a random order
    with `permute_blocks=True`. Unread slots are set to `fill` (NaN by default, so that a
    kernel reading them shows). Every request must have q_len == 1.
    """
    check_config(config)
    world_size = config.dcp_world_size if world_size is None else world_size
    check_world_size(config, world_size)
    kv_cache = np.asarray(kv_cache)
    check_single_token_queries(metadata.query_start_loc)
    metadata.validate(config, num_blocks=int(kv_cache.shape[0]))
    P = config.page_size
    seq_lens = np.asarray(metadata.seq_lens, np.int64)
    bt = np.asarray(metadata.block_table, np.int64)
    R = seq_lens.shape[0]
    lens = local_seq_lens(seq_lens, world_size).astype(np.int64)  # [W, R]
    pages = (lens + P - 1) // P  # [W, R]
    max_blocks_local = max(1, int(pages.max()))
    num_blocks_local = 1 + int(pages.sum(axis=1).max())
    rng = np.random.default_rng(seed)
    caches = np.full((world_size, num_blocks_local, P, kv_cache.shape[-1]), fill, kv_cache.dtype)
    tables = np.zeros((world_size, R, max_blocks_local), np.int32)
    for s in range(world_size):
        ids = np.arange(1, 1 + int(pages[s].sum()))
        if permute_blocks:
            ids = rng.permutation(ids)
        k = 0
        for r in range(R):
            n = int(pages[s, r])
            tables[s, r, :n] = ids[k : k + n]
            k += n
            j = np.arange(lens[s, r])  # local positions
            p = j * world_size + s  # their global positions
            caches[s, tables[s, r, j // P], j % P] = kv_cache[bt[r, p // P], p % P]
    qsl = np.asarray(metadata.query_start_loc, np.int32)
    md = DecodeMetadata(
        query_start_loc=np.broadcast_to(qsl, (world_size, qsl.shape[0])).copy(),
        seq_lens=lens.astype(np.int32),
        block_table=tables,
        max_query_len=1,
        max_seq_len=max(1, int(lens.max())),
        num_decode_tokens=int(metadata.num_decode_tokens),
        max_num_splits=metadata.max_num_splits,
    )
    validate_shards(config, md, world_size=world_size, num_blocks_local=num_blocks_local)
    return DCPShards(kv_cache=caches, metadata=md, world_size=world_size)


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
    non-finite q entry of that head) gives its row out NaN, lse NaN, never a plausible-looking 0."""
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
