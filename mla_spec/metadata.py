"""`DecodeMetadata`: the per-batch metadata both backends consume, its validation,
the builder from a plain batch description, and vLLM's decode/prefill split.

Built once per batch (on the host, NumPy int32), then run for every layer.
`mla_torch` turns the arrays into torch tensors, `mla_jax` registers the class as
a pytree (the ints are static fields).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from mla_spec.config import MLAConfig, check_config


@dataclasses.dataclass(frozen=True)
class DecodeMetadata:
    """Decode metadata in vLLM's vocabulary (MLACommonDecodeMetadata + FlashAttnMLA's fields).

    query_start_loc: int32 `[R+1]`, cumulative query lengths (`cu_seqlens_q`).
    seq_lens: int32 `[R]`, KV length per request, new tokens included.
    block_table: int32 `[R, max_blocks]`; KV position p of request r lives at
        `kv_cache[block_table[r, p // page_size], p % page_size]`. Entries past a
        request's last page are padding and are never read.
    max_query_len, max_seq_len: upper bounds (>= the true maxima; the builder sets
        them exactly, or to a bucket's bounds). `max_query_len >= 1`.
    num_decode_tokens: T, the number of query tokens (`query_start_loc[-1]`; with
        `padded`, the bucket's token rows, >= `query_start_loc[-1]`).
    scheduler_metadata: backend-private (FA3's ahead-of-time schedule), or None.
    max_num_splits: split-KV bound; 0 lets the kernel's heuristic choose.
    padded: the batch is padded to a static shape (`Bucket`, `pad_to_bucket`): requests
        with q_len 0 and seq_len 0 are padding, and so are the token rows past
        `query_start_loc[-1]`; every implementation gives those rows out 0, lse -inf.
        The static fields then come from the bucket, so a jitted decode compiles once
        per bucket, whatever the lengths of its batches.
    """

    query_start_loc: Any
    seq_lens: Any
    block_table: Any
    max_query_len: int
    max_seq_len: int
    num_decode_tokens: int
    scheduler_metadata: Any = None
    max_num_splits: int = 0
    padded: bool = False

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def max_blocks(self) -> int:
        return int(self.block_table.shape[1])

    def replace(self, **changes) -> "DecodeMetadata":
        return dataclasses.replace(self, **changes)

    def validate(self, config: MLAConfig, num_blocks: int | None = None, *, check_values: bool = True) -> None:
        """Checks every invariant; raises ValueError naming the one that broke.

        `num_blocks` (the cache's first dimension) enables the block-id range check.
        `check_values=False` checks only shapes, dtypes and the static ints (for
        traced arrays under `jax.jit`).
        """
        validate_metadata(self, config, num_blocks=num_blocks, check_values=check_values)


def _is_integer_dtype(dtype) -> bool:
    try:
        return bool(np.issubdtype(np.dtype(dtype), np.integer))
    except TypeError:  # a torch dtype
        return str(dtype).removeprefix("torch.") in (
            "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"
        )


def _check_static_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {name}={value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")


def check_metadata(metadata, name: str = "metadata") -> None:
    """Raises ValueError naming `name` and the type unless `metadata` is a `DecodeMetadata` (rather than an
    AttributeError on its first field)."""
    if not isinstance(metadata, DecodeMetadata):
        raise ValueError(f"{name} must be an mla_spec.DecodeMetadata, got {name}={type(metadata).__name__}")


def check_metadata_arrays(md: DecodeMetadata, md_name: str = "") -> None:
    """Raises ValueError naming the first of query_start_loc, seq_lens, block_table that is not an array
    (NumPy, torch, JAX) of an integer dtype (None, a list, float values), as `md_name`.field where given."""
    for field in ("query_start_loc", "seq_lens", "block_table"):
        arr = getattr(md, field)
        name = f"{md_name}.{field}" if md_name else field
        if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
            raise ValueError(f"{name} must be an array, got {name}={type(arr).__name__}")
        if not _is_integer_dtype(arr.dtype):
            raise ValueError(f"{name} must have an integer dtype, got {name}.dtype={arr.dtype}")


def check_metadata_shapes(md: DecodeMetadata) -> None:
    """The array checks of `validate_metadata` that need no config (NumPy, torch, JAX arrays alike; traced ones
    too): `check_metadata_arrays`, then 1-D query_start_loc `[R+1]` and seq_lens `[R]` with R >= 1, and a 2-D
    block_table `[R, max_blocks >= 1]`. ValueError naming what broke."""
    check_metadata(md)
    check_metadata_arrays(md)
    qsl, seq_lens, bt = md.query_start_loc, md.seq_lens, md.block_table
    if len(seq_lens.shape) != 1:
        raise ValueError(f"seq_lens must be 1-D, got seq_lens.shape={tuple(seq_lens.shape)}")
    if len(qsl.shape) != 1:
        raise ValueError(f"query_start_loc must be 1-D, got query_start_loc.shape={tuple(qsl.shape)}")
    if len(bt.shape) != 2:
        raise ValueError(f"block_table must be 2-D [num_reqs, max_blocks], got block_table.shape={tuple(bt.shape)}")
    num_reqs = seq_lens.shape[0]
    if num_reqs < 1:
        raise ValueError(f"need at least one request, got seq_lens.shape={tuple(seq_lens.shape)}")
    if qsl.shape[0] != num_reqs + 1:
        raise ValueError(
            "query_start_loc must have num_reqs + 1 entries, got "
            f"query_start_loc.shape={tuple(qsl.shape)}, seq_lens.shape={tuple(seq_lens.shape)}"
        )
    if bt.shape[0] != num_reqs:
        raise ValueError(
            f"block_table must have one row per request, got block_table.shape={tuple(bt.shape)}, "
            f"seq_lens.shape={tuple(seq_lens.shape)}"
        )
    if bt.shape[1] < 1:
        raise ValueError(f"block_table needs at least one column, got block_table.shape={tuple(bt.shape)}")


def validate_metadata(
    md: DecodeMetadata, config: MLAConfig, *, num_blocks: int | None = None, check_values: bool = True
) -> None:
    """`DecodeMetadata.validate`: shapes, dtypes and static ints always, array values with
    `check_values` (see `_validate_values`)."""
    check_config(config)
    check_metadata_shapes(md)
    _check_static_int("max_query_len", md.max_query_len, 1)
    _check_static_int("max_seq_len", md.max_seq_len, 1)
    _check_static_int("num_decode_tokens", md.num_decode_tokens, 1)
    _check_static_int("max_num_splits", md.max_num_splits, 0)
    if not isinstance(md.padded, (bool, np.bool_)):
        raise ValueError(f"padded must be a bool, got padded={md.padded!r}")
    if num_blocks is not None:
        _check_static_int("num_blocks", num_blocks, 1)
    if check_values:
        _validate_values(md, config, num_blocks)
    if md.max_query_len > md.max_seq_len:
        raise ValueError(
            f"max_query_len must be <= max_seq_len, got max_query_len={md.max_query_len}, max_seq_len={md.max_seq_len}"
        )
    if md.max_query_len > config.reorder_batch_threshold:  # (the kernels size query tiles and partials by it)
        raise ValueError(
            f"max_query_len={md.max_query_len} > reorder_batch_threshold={config.reorder_batch_threshold}: a decode "
            "batch holds decodes only (split prefills off with mla_spec.split_decodes_and_prefills)"
        )


def _validate_values(md: DecodeMetadata, config: MLAConfig, num_blocks: int | None) -> None:
    """The checks that read the arrays: int32 range, query and sequence lengths, the
    bounds, and every block id a request reads."""
    arrays = {name: np.asarray(getattr(md, name)) for name in ("query_start_loc", "seq_lens", "block_table")}
    # The backends run int32 metadata: a wider value must not wrap into a plausible one on the cast.
    for name, arr in arrays.items():
        check_fits_int32(name, arr)
    qsl = arrays["query_start_loc"].astype(np.int64)
    seq_lens = arrays["seq_lens"].astype(np.int64)
    bt = arrays["block_table"].astype(np.int64)
    if qsl[0] != 0:
        raise ValueError(f"query_start_loc must start at 0, got query_start_loc[0]={qsl[0]}")
    query_lens = np.diff(qsl)
    padding = (query_lens == 0) & (seq_lens == 0) if md.padded else np.zeros(seq_lens.shape, bool)
    # Vectorized screen, then the first offending request's message, so that the per-call
    # cost stays flat in the batch size while the message names the first bad request.
    bad = ~padding & ((seq_lens < 1) | (query_lens < 1) | (query_lens > seq_lens))
    for r in np.flatnonzero(bad)[:1]:
        q_len, seq_len = int(query_lens[r]), int(seq_lens[r])
        hint = "" if md.padded else " (a padding request, q_len 0 and seq_len 0, needs padded=True: pad_to_bucket)"
        if seq_len < 1:
            raise ValueError(f"seq_lens must be >= 1, got seq_lens[{r}]={seq_len}"
                             + (f" with q_len={q_len}" if md.padded else hint))
        if q_len < 1:
            raise ValueError(
                f"each request needs q_len >= 1 (query_start_loc must increase), got q_len={q_len} for request {r} "
                f"(query_start_loc[{r}]={qsl[r]}, query_start_loc[{r + 1}]={qsl[r + 1]})"
                + (f" with seq_len={seq_len}" if md.padded else hint)
            )
        if q_len > seq_len:
            raise ValueError(f"q_len must be <= seq_len, got q_len={q_len} > seq_len={seq_len} for request {r}")
    if padding.all():
        raise ValueError(f"a padded batch needs at least one request with q_len >= 1, got all {seq_lens.shape[0]} "
                         "requests padding (q_len 0, seq_len 0)")
    if md.padded:
        if int(qsl[-1]) > md.num_decode_tokens:
            raise ValueError(
                f"num_decode_tokens must be >= query_start_loc[-1] (the bucket's token rows), got "
                f"num_decode_tokens={md.num_decode_tokens}, query_start_loc[-1]={int(qsl[-1])}"
            )
    elif int(qsl[-1]) != md.num_decode_tokens:
        raise ValueError(
            f"num_decode_tokens must equal query_start_loc[-1], got num_decode_tokens={md.num_decode_tokens}, "
            f"query_start_loc[-1]={int(qsl[-1])} (rows past it are padding only with padded=True: pad_to_bucket)"
        )
    if int(query_lens.max()) > md.max_query_len:
        raise ValueError(
            f"max_query_len is below the longest query, got max_query_len={md.max_query_len} < {int(query_lens.max())}"
        )
    if int(query_lens.max()) > config.reorder_batch_threshold:
        raise ValueError(
            f"a request has q_len={int(query_lens.max())} > reorder_batch_threshold={config.reorder_batch_threshold}: "
            "it is a prefill; split the batch with mla_spec.split_decodes_and_prefills"
        )
    if int(seq_lens.max()) > md.max_seq_len:
        raise ValueError(f"max_seq_len is below the longest sequence, got max_seq_len={md.max_seq_len} < {int(seq_lens.max())}")
    page = config.page_size
    blocks_needed = (seq_lens + page - 1) // page
    max_blocks = bt.shape[1]
    used = np.arange(max_blocks)[None, :] < blocks_needed[:, None]
    bad = (blocks_needed > max_blocks) | (used & (bt < 0)).any(axis=1)
    if num_blocks is not None:
        bad |= (used & (bt >= num_blocks)).any(axis=1)
    for r in np.flatnonzero(bad)[:1]:
        need = int(blocks_needed[r])
        if need > max_blocks:
            raise ValueError(
                f"too few blocks for seq_len: seq_lens[{r}]={int(seq_lens[r])} needs {need} blocks of "
                f"page_size={page}, block_table has {max_blocks} columns"
            )
        used = bt[r, :need]
        if used.size and used.min() < 0:
            c = int(np.argmin(used))
            raise ValueError(f"negative block id: block_table[{r}, {c}]={int(used[c])}")
        if num_blocks is not None and used.size and used.max() >= num_blocks:
            c = int(np.argmax(used))
            raise ValueError(
                f"block id out of range: block_table[{r}, {c}]={int(used[c])} >= num_blocks={num_blocks}"
            )


_INT32 = np.iinfo(np.int32)


def _exact_ints(arr: np.ndarray) -> np.ndarray:
    """`arr` unchanged when it has an integer dtype; an object array of Python ints (NumPy's
    dtype for ints beyond int64/uint64, e.g. [2**64]) as that object array; else None."""
    if np.issubdtype(arr.dtype, np.integer):
        return arr
    if arr.dtype == object and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in arr.flat
    ):
        return arr
    return None


def first_outside_int32(arr: np.ndarray):
    """The index of the first entry of an integer (or object-of-int) array outside int32, or None.
    Compares the values as they are (no cast that could wrap them first)."""
    if arr.size == 0 or (arr.dtype != object and np.can_cast(arr.dtype, np.int32)):
        return None
    bad = np.array([not (_INT32.min <= int(x) <= _INT32.max) for x in arr.flat]).reshape(arr.shape) \
        if arr.dtype == object else (arr < _INT32.min) | (arr > _INT32.max)
    hits = np.argwhere(bad)
    return tuple(int(i) for i in hits[0]) if hits.size else None


def check_fits_int32(name: str, arr) -> None:
    """Raises ValueError naming the first entry of `arr` (a NumPy array, or values NumPy can read) outside int32:
    the backends cast metadata to int32, and a wider value must not wrap into a plausible one (2**32 + 3 into 3)."""
    arr = np.asarray(arr)
    i = first_outside_int32(arr)
    if i is not None:
        raise ValueError(f"{name} values must fit in int32, got {name}[{', '.join(map(str, i))}]={int(arr[i])}")


def first_bool(values, index: tuple = ()):
    """The index of the first bool (Python or NumPy) among the entries of `values`, nested lists and tuples
    walked, or None. NumPy makes [20, True] the int array [20, 1], where `_exact_ints` no longer sees the bool."""
    if isinstance(values, (bool, np.bool_)):
        return index
    if isinstance(values, (list, tuple)):
        for i, x in enumerate(values):
            hit = first_bool(x, index + (i,))
            if hit is not None:
                return hit
    return None


def check_no_bools(name: str, values, index: tuple = ()) -> None:
    """Raises ValueError naming the first bool entry of the list or tuple `values` (see `first_bool`), which is
    `name[index]` (e.g. one row of a table)."""
    i = first_bool(values, index)
    if i is not None:
        entry = values
        for j in i[len(index):]:
            entry = entry[j]
        raise ValueError(f"{name} must hold integers, got {name}[{', '.join(map(str, i))}]={entry!r} (a bool)")


def as_array(name: str, values, ndim: int) -> np.ndarray:
    """`np.asarray(values)`, with NumPy's error on a ragged nested list as a ValueError naming `name`."""
    try:
        return np.asarray(values)
    except ValueError as e:  # a ragged nested list
        raise ValueError(f"{name} must be a {ndim}-D integer array, got a {type(values).__name__} NumPy cannot make "
                         f"one array of: {e}") from e


def _as_int_vector(name: str, values) -> np.ndarray:
    arr = as_array(name, values, 1)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {name}.shape={arr.shape}")
    if arr.size and _exact_ints(arr) is None:
        raise ValueError(f"{name} must hold integers, got {name}.dtype={arr.dtype}")
    check_no_bools(name, values)
    if arr.size and (arr < 0).any():
        i = int(np.argmin(arr))
        raise ValueError(f"{name} must be >= 0, got {name}[{i}]={int(arr[i])}")
    if arr.size and arr.max() > np.iinfo(np.int32).max:
        i = int(np.argmax(arr))
        raise ValueError(f"{name} must fit in int32, got {name}[{i}]={int(arr[i])}")
    return arr.astype(np.int32)


def _as_block_table(block_table, num_reqs: int) -> np.ndarray:
    if isinstance(block_table, np.ndarray):
        if block_table.ndim != 2:
            raise ValueError(f"block_table must be 2-D, got block_table.shape={block_table.shape}")
        if _exact_ints(block_table) is None:
            raise ValueError(f"block_table must hold integers, got block_table.dtype={block_table.dtype}")
        rows = list(block_table)
    else:
        if block_table is None or isinstance(block_table, (str, bytes)) or not hasattr(block_table, "__iter__"):
            raise ValueError(
                "block_table must be a 2-D integer array or one list of block ids per request, got "
                f"block_table={block_table!r}"
            )
        given = list(block_table)
        rows = [as_array(f"block_table[{r}]", row, 1) for r, row in enumerate(given)]
        for r, row in enumerate(rows):
            if row.ndim != 1:
                raise ValueError(f"block_table[{r}] must be a 1-D list of block ids, got shape {row.shape}")
            if row.size and _exact_ints(row) is None:
                raise ValueError(f"block_table[{r}] must hold integers, got dtype {row.dtype}")
            check_no_bools("block_table", given[r], (r,))
    # Range before the int32 cast below, which would wrap 2**32 + 3 to 3 (a valid-looking id).
    for r, row in enumerate(rows):
        c = first_outside_int32(row)
        if c is not None:
            raise ValueError(f"block ids must fit in int32, got block_table[{r}, {c[0]}]={int(row[c])}")
    if len(rows) != num_reqs:
        raise ValueError(f"block_table must have one row per request, got {len(rows)} rows for {num_reqs} requests")
    width = max(1, max((len(row) for row in rows), default=1))
    out = np.zeros((num_reqs, width), np.int32)  # vLLM pads block tables with block 0
    for r, row in enumerate(rows):
        out[r, : len(row)] = row
    return out


def build_decode_metadata(
    *,
    seq_lens: Sequence[int],
    query_lens: Sequence[int],
    block_table,
    config: MLAConfig,
    num_blocks: int | None = None,
    max_num_splits: int = 0,
    bucket: "Bucket | None" = None,
) -> DecodeMetadata:
    """Builds validated int32 `DecodeMetadata` from a plain batch description.

    seq_lens[r]: KV length of request r (new tokens included); query_lens[r]: its
    new tokens (1 for plain decode, up to 8 or so for speculative decode);
    block_table: a 2-D integer array or one list of block ids per request (padded
    with block 0). Every request must be a decode (q_len <= reorder_batch_threshold);
    use `split_decodes_and_prefills` first on a mixed batch. `bucket`: the result
    padded to it (`pad_to_bucket`).
    """
    check_config(config)
    seq = _as_int_vector("seq_lens", seq_lens)
    qlen = _as_int_vector("query_lens", query_lens)
    if seq.shape != qlen.shape:
        raise ValueError(
            f"seq_lens and query_lens must have the same length, got len(seq_lens)={seq.shape[0]}, "
            f"len(query_lens)={qlen.shape[0]}"
        )
    if seq.size == 0:
        raise ValueError("need at least one request, got len(seq_lens)=0")
    if (qlen < 1).any():
        r = int(np.argmin(qlen))
        raise ValueError(f"each request needs q_len >= 1, got q_len={int(qlen[r])} for request {r}")
    bt = _as_block_table(block_table, seq.shape[0])
    qsl = np.zeros(seq.shape[0] + 1, np.int32)
    np.cumsum(qlen, out=qsl[1:])
    md = DecodeMetadata(
        query_start_loc=qsl,
        seq_lens=seq,
        block_table=bt,
        max_query_len=max(int(qlen.max()), 1),
        max_seq_len=max(int(seq.max()), 1),
        num_decode_tokens=int(qsl[-1]),
        max_num_splits=max_num_splits,
    )
    md.validate(config, num_blocks=num_blocks)
    return md if bucket is None else pad_to_bucket(md, bucket, config, num_blocks=num_blocks)


@dataclasses.dataclass(frozen=True)
class Bucket:
    """A static batch shape that decode batches are padded to (`pad_to_bucket`), as a serving
    loop does so that each compiled decode (a `jax.jit` program, a CUDA graph) serves every
    batch that fits: the requests, the query token rows, the block table's width and the
    bounds on q_len and seq_len. Every field is an int >= 1."""

    num_reqs: int
    num_tokens: int
    max_blocks: int
    max_seq_len: int
    max_query_len: int = 1

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _check_static_int(f.name, getattr(self, f.name), 1)
        if self.max_query_len > self.max_seq_len:
            raise ValueError(f"max_query_len must be <= max_seq_len, got max_query_len={self.max_query_len}, "
                             f"max_seq_len={self.max_seq_len}")

    def misfit(self, md: DecodeMetadata) -> str | None:
        """Why the batch of `md` does not fit this bucket (None: it fits); reads the arrays."""
        qsl = np.asarray(md.query_start_loc, np.int64)
        seq = np.asarray(md.seq_lens, np.int64)
        need = {"num_reqs": md.num_reqs, "num_tokens": int(qsl[-1]), "max_blocks": md.max_blocks,
                "max_seq_len": int(seq.max()), "max_query_len": int(np.diff(qsl).max())}
        for name, value in need.items():
            if value > getattr(self, name):
                return f"the batch needs {name}={value} > the bucket's {name}={getattr(self, name)}"
        return None


def pad_to_bucket(md: DecodeMetadata, bucket: Bucket, config: MLAConfig, *,
                  num_blocks: int | None = None) -> DecodeMetadata:
    """`md` padded to `bucket`, vLLM's way: requests past the batch's get q_len 0 and seq_len 0
    (query_start_loc repeats its last entry), block-table rows and columns are padded with
    block 0 (never read), and max_query_len, max_seq_len and num_decode_tokens are the bucket's
    (token rows past query_start_loc[-1] are padding). The result has `padded=True` and is
    validated; ValueError names what does not fit. q must then have bucket.num_tokens rows."""
    check_config(config)
    check_metadata(md, "md")
    if not isinstance(bucket, Bucket):
        raise ValueError(f"bucket must be an mla_spec.Bucket, got bucket={type(bucket).__name__}")
    md.validate(config, num_blocks=num_blocks)
    if bucket.max_query_len > config.reorder_batch_threshold:
        raise ValueError(f"bucket.max_query_len={bucket.max_query_len} > reorder_batch_threshold="
                         f"{config.reorder_batch_threshold}: a decode bucket holds decodes only")
    reason = bucket.misfit(md)
    if reason is not None:
        raise ValueError(f"the batch does not fit {bucket}: {reason}")
    qsl = np.asarray(md.query_start_loc, np.int32)
    seq = np.zeros(bucket.num_reqs, np.int32)
    seq[: md.num_reqs] = np.asarray(md.seq_lens)
    qsl_pad = np.full(bucket.num_reqs + 1, qsl[-1], np.int32)
    qsl_pad[: qsl.shape[0]] = qsl
    bt = np.zeros((bucket.num_reqs, bucket.max_blocks), np.int32)  # vLLM pads block tables with block 0
    bt[: md.num_reqs, : md.max_blocks] = np.asarray(md.block_table)
    out = md.replace(query_start_loc=qsl_pad, seq_lens=seq, block_table=bt, max_query_len=bucket.max_query_len,
                     max_seq_len=bucket.max_seq_len, num_decode_tokens=bucket.num_tokens, padded=True,
                     scheduler_metadata=None)
    out.validate(config, num_blocks=num_blocks)
    return out


def capture_size_buckets(max_num_seqs: int, *, max_blocks: int, max_seq_len: int, max_query_len: int = 1,
                         max_size: int | None = None) -> list[Bucket]:
    """vLLM's default CUDA-graph capture sizes as buckets, smallest first: 1, 2, 4, then multiples of 8 below 256, then
    multiples of 16, up to min(2 max_num_seqs, 512) tokens (or max_size). A size is the bucket's token rows and its
    requests (a decode has at least one token); the block-table width and the length bounds are the same for all."""
    _check_static_int("max_num_seqs", max_num_seqs, 1)
    top = min(2 * max_num_seqs, 512) if max_size is None else max_size
    _check_static_int("max_size", top, 1)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, min(256, top + 1), 8)) + list(range(256, top + 1, 16))
    return [Bucket(num_reqs=s, num_tokens=s, max_blocks=max_blocks, max_seq_len=max_seq_len,
                   max_query_len=max_query_len) for s in sizes]


def smallest_bucket(buckets: Sequence[Bucket], md: DecodeMetadata) -> Bucket:
    """The first bucket of `buckets` (ordered smallest first) that the batch of `md` fits;
    ValueError naming the batch's needs when none does. `md`'s arrays are checked first
    (`check_metadata_shapes`: types, dtypes, shapes; their values are not read beyond what fitting needs)."""
    check_metadata(md, "md")
    check_metadata_shapes(md)
    buckets = check_buckets(buckets)
    for b in buckets:
        if b.misfit(md) is None:
            return b
    raise ValueError(f"no bucket fits the batch: the largest, {buckets[-1]}, says {buckets[-1].misfit(md)}")


def check_buckets(buckets) -> list[Bucket]:
    """`buckets` as a list; ValueError unless it is a non-empty sequence (any iterable) of `Bucket`s."""
    try:
        given = list(buckets) if not isinstance(buckets, (str, bytes, Bucket)) else None
    except TypeError:  # not iterable: None, an int
        given = None
    if not given:
        raise ValueError(f"buckets must be a non-empty sequence of mla_spec.Bucket, got buckets={buckets!r}")
    for i, b in enumerate(given):
        if not isinstance(b, Bucket):
            raise ValueError(f"buckets must be a non-empty sequence of mla_spec.Bucket, got buckets[{i}]="
                             f"{type(b).__name__}")
    return given


@dataclasses.dataclass(frozen=True)
class BatchSplit:
    """vLLM's reordering: decodes (q_len <= threshold) first, then prefills."""

    order: np.ndarray  # request indices, decodes first (stable)
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int


def split_decodes_and_prefills(query_lens: Sequence[int], config: MLAConfig) -> BatchSplit:
    """Orders requests with q_len <= `config.reorder_batch_threshold` first (as vLLM's
    `reorder_batch_to_split_decodes_and_prefills`), and says how many are decodes. Every q_len is >= 1
    (a scheduled request has a new token; padding comes later, from `pad_to_bucket`): ValueError otherwise."""
    check_config(config)
    qlen = _as_int_vector("query_lens", query_lens)
    if qlen.size and (qlen < 1).any():
        r = int(np.argmin(qlen))
        raise ValueError(f"query_lens must be >= 1 (each request needs q_len >= 1), got query_lens[{r}]={int(qlen[r])}")
    is_decode = qlen <= config.reorder_batch_threshold
    order = np.concatenate([np.flatnonzero(is_decode), np.flatnonzero(~is_decode)]).astype(np.int64)
    return BatchSplit(
        order=order,
        num_decodes=int(is_decode.sum()),
        num_prefills=int((~is_decode).sum()),
        num_decode_tokens=int(qlen[is_decode].sum()),
        num_prefill_tokens=int(qlen[~is_decode].sum()),
    )
