"""The benchmark's problem shapes: `Shape` (heads, batch, sequence length, query length, page size, dtype, and the
distribution of the requests' KV lengths), its bytes and FLOPs, the named grids of `python -m parity bench` and the
shape names the tools take (H16_B64_S4096_q2, H16_B64_S4096_q1_tail).

A shape's `seq_len` is the mean KV length of its requests. `dist` says how the lengths spread around it:

  uniform   every request seq_len long.
  random    uniformly random integers in [q_len, 2 seq_len - q_len] (1 to 2 seq_len - 1 at q_len 1).
  tail      long-tailed: x_r = exp(mu + sigma z_r), z_r standard normal, sigma = TAIL_SIGMA = 1.1 and
            mu = ln(seq_len) - sigma^2 / 2 (a lognormal of mean seq_len), within [q_len, 32 seq_len].
  fewlong   FEWLONG_COUNT = 2 long requests among batch - 2 short ones: the short ones uniformly random integers in
            [128, 512], the long ones splitting the rest of batch x seq_len evenly (the first of them one token more
            when the rest is odd), at random places in the batch. At B64 S4096 the long ones hold 121k tokens each,
            92% of the KV; the shape is refused where a long one would not be longer than 512.

random and tail then fit the draws to an exact total (`fit_total`): the lengths are clip(c x_r, lo, hi) for the one
scale c at which they add up to batch x seq_len, rounded to integers that keep that sum. So every ragged shape holds
exactly batch x seq_len KV tokens, as many as its uniform twin (`Shape.uniform_twin`, the uniform shape of the same
name without the distribution's suffix). The draws come from numpy.random.default_rng(seed): the lengths are a
function of the shape's fields. Every request has q_len query tokens (`Shape.query_lens`).

`SparseShape` is a problem of the sparse decode (DeepSeek-V3.2's top-k attention, `mla_spec.sparse`): `batch`
requests of `q_len` tokens over caches of `seq_len` tokens each, every token attending to `topk` distinct positions
of its request drawn uniformly at random (`parity.timing.make_sparse_inputs`), so the rows it reads are scattered
over the request's pages. Its name ends in `_top<topk>`: H128_B64_S32768_q1_top2048.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np

PAGE_SIZE = 64

DISTRIBUTIONS = ("uniform", "random", "tail", "fewlong")
"""The distributions of a shape's KV lengths (the module's docstring defines them)."""

TAIL_SIGMA = 1.1
"""tail: the lognormal's sigma (its coefficient of variation is sqrt(exp(sigma^2) - 1), 1.53)."""
TAIL_MAX = 32
"""tail: the longest request, in units of seq_len."""
FEWLONG_COUNT = 2
"""fewlong: how many long requests."""
FEWLONG_SHORT = (128, 512)
"""fewlong: the short requests' lengths, inclusive bounds."""


def fit_total(x, total: int, lo: int, hi: int) -> np.ndarray:
    """int64 lengths in [lo, hi] proportional to the positive weights x and summing to `total` exactly:
    v_r = clip(c x_r, lo, hi) with the scale c (found by bisection) at which sum(v) = total, then floor(v_r) plus
    one for the total - sum(floor(v)) requests of largest fractional part (the first such, on ties). ValueError
    where len(x) lengths in [lo, hi] cannot make `total`."""
    x = np.asarray(x, np.float64)
    n = x.shape[0]
    if not (n * lo <= total <= n * hi) or not (x > 0).all():
        raise ValueError(f"cannot fit {n} lengths in [{lo}, {hi}] to a total of {total} (weights > 0: "
                         f"{bool((x > 0).all())})")
    a, b = 0.0, hi / float(x.min())  # sum(clip(a x)) = n lo <= total <= n hi = sum(clip(b x))
    for _ in range(200):
        m = (a + b) / 2
        if m in (a, b):
            break
        if np.clip(m * x, lo, hi).sum() < total:
            a = m
        else:
            b = m
    v = np.clip(b * x, lo, hi)  # sum(v) >= total, by less than one token
    out = np.floor(v).astype(np.int64)
    missing = total - int(out.sum())
    frac = v - out  # > 0 only where v < hi, so a token more keeps it <= hi
    order = np.argsort(-frac, kind="stable")
    if missing < 0 or missing > int((frac > 0).sum()):  # (not reached: the bisection's sum is within a token)
        raise AssertionError(f"fit_total: {missing} tokens to place after rounding")
    out[order[:missing]] += 1
    return out


def draw_seq_lens(dist: str, batch: int, seq_len: int, q_len: int, seed: int) -> tuple[int, ...]:
    """The KV lengths of `batch` requests of mean `seq_len` drawn from `dist` (the module's docstring defines each)
    with numpy.random.default_rng(seed); ValueError naming the problem for a shape the distribution cannot make."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"dist must be one of {DISTRIBUTIONS}, got dist={dist!r}")
    if dist == "uniform":
        return (seq_len,) * batch
    if seq_len < q_len:
        raise ValueError(f"a {dist} shape needs seq_len >= q_len, got seq_len={seq_len}, q_len={q_len}")
    rng = np.random.default_rng(seed)
    total = batch * seq_len
    if dist == "random":
        lens = fit_total(rng.integers(q_len, 2 * seq_len - q_len, size=batch, endpoint=True), total, q_len,
                         2 * seq_len - q_len)
    elif dist == "tail":
        mu = math.log(seq_len) - TAIL_SIGMA**2 / 2
        lens = fit_total(np.exp(mu + TAIL_SIGMA * rng.standard_normal(batch)), total, q_len, TAIL_MAX * seq_len)
    else:  # fewlong
        lo, hi = FEWLONG_SHORT
        if batch <= FEWLONG_COUNT or q_len > lo:
            raise ValueError(f"fewlong needs batch > {FEWLONG_COUNT} and q_len <= {lo}, got batch={batch}, "
                             f"q_len={q_len}")
        short = rng.integers(lo, hi, size=batch - FEWLONG_COUNT, endpoint=True)
        rest = total - int(short.sum())
        long_len, extra = divmod(rest, FEWLONG_COUNT)
        if long_len <= hi:
            raise ValueError(f"fewlong needs long requests longer than {hi} tokens: batch={batch} x "
                             f"seq_len={seq_len} leaves {rest} tokens for {FEWLONG_COUNT} of them")
        where = rng.choice(batch, size=FEWLONG_COUNT, replace=False)
        lens = np.empty(batch, np.int64)
        mask = np.zeros(batch, bool)
        mask[where] = True
        lens[~mask] = short
        lens[np.sort(where)] = [long_len + (k < extra) for k in range(FEWLONG_COUNT)]
    return tuple(int(n) for n in lens)


@dataclasses.dataclass(frozen=True)
class Shape:
    """One bench problem: `batch` requests of `q_len` query tokens each and KV lengths of mean `seq_len`, spread
    as `dist` says (with `seed`; the module's docstring defines each distribution), over a paged cache of
    `page_size`. A uniform shape's seed is 0 whatever was passed (its lengths draw nothing)."""

    num_heads: int
    batch: int
    seq_len: int
    q_len: int = 1
    page_size: int = PAGE_SIZE
    dtype: str = "bfloat16"
    dist: str = "uniform"
    seed: int = 0

    def __post_init__(self):
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"dist must be one of {DISTRIBUTIONS}, got dist={self.dist!r}")
        if self.dist == "uniform":
            object.__setattr__(self, "seed", 0)
        else:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
                raise ValueError(f"seed must be an int >= 0, got seed={self.seed!r}")
            self.seq_lens  # noqa: B018 (a shape its distribution cannot make fails here, naming why)

    @property
    def name(self) -> str:
        base = f"H{self.num_heads}_B{self.batch}_S{self.seq_len}_q{self.q_len}"
        if self.dist == "uniform":
            return base
        return f"{base}_{self.dist}" + (f"_s{self.seed}" if self.seed else "")

    @property
    def ragged(self) -> bool:
        """Whether the requests' KV lengths differ (any dist but uniform)."""
        return self.dist != "uniform"

    @functools.cached_property
    def seq_lens(self) -> tuple[int, ...]:
        """Each request's KV length (`draw_seq_lens`): mean seq_len, the same for the same fields."""
        return draw_seq_lens(self.dist, self.batch, self.seq_len, self.q_len, self.seed)

    @property
    def query_lens(self) -> tuple[int, ...]:
        """Each request's query tokens: q_len for every request."""
        return (self.q_len,) * self.batch

    @property
    def kv_tokens(self) -> int:
        """The KV tokens of the batch: sum(seq_lens)."""
        return sum(self.seq_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)

    @property
    def num_pages(self) -> int:
        """The cache pages the requests use: sum of ceil(seq_lens[r] / page_size)."""
        return sum(-(-n // self.page_size) for n in self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return self.batch * self.q_len

    def uniform_twin(self) -> "Shape":
        """The uniform shape of the same heads, batch, q_len, page size and dtype holding as many KV tokens:
        seq_len = kv_tokens / batch, rounded half up (exact for the grids' shapes, whose totals are batch x
        seq_len). A uniform shape is its own twin."""
        return dataclasses.replace(self, seq_len=(2 * self.kv_tokens + self.batch) // (2 * self.batch),
                                   dist="uniform", seed=0)

    def bytes(self, L=512, R=64, itemsize=2, kv_itemsize=None) -> int:
        """KV read once (sum of seq_lens) + q + out; kv_itemsize (default itemsize) for the cache: 1 for fp8."""
        kv = self.kv_tokens * (L + R) * (itemsize if kv_itemsize is None else kv_itemsize)
        q = self.num_tokens * self.num_heads * (L + R) * itemsize
        out = self.num_tokens * self.num_heads * L * itemsize
        return kv + q + out

    def flops(self, L=512, R=64) -> int:
        """2 x H x q_len x sum(seq_lens) x (L + R + L): every query token of a request against its whole KV (the
        causal savings of q_len > 1 not subtracted)."""
        return 2 * self.num_heads * self.q_len * self.kv_tokens * (L + R + L)


@dataclasses.dataclass(frozen=True)
class SparseShape:
    """One sparse-decode bench problem: `batch` requests of `q_len` query tokens, each request's cache `seq_len`
    tokens long, each token reading `topk` of its request's positions (all distinct; topk <= seq_len)."""

    num_heads: int
    batch: int
    seq_len: int
    q_len: int = 1
    topk: int = 2048
    page_size: int = PAGE_SIZE
    dtype: str = "bfloat16"

    def __post_init__(self):
        if self.topk > self.seq_len:
            raise ValueError(f"topk must be <= seq_len (distinct positions), got topk={self.topk}, "
                             f"seq_len={self.seq_len}")

    ragged = False
    """(the bench's ragged summary does not apply: every token reads topk keys)"""

    @property
    def name(self) -> str:
        return f"H{self.num_heads}_B{self.batch}_S{self.seq_len}_q{self.q_len}_top{self.topk}"

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return (self.seq_len,) * self.batch

    @property
    def query_lens(self) -> tuple[int, ...]:
        return (self.q_len,) * self.batch

    @property
    def num_tokens(self) -> int:
        return self.batch * self.q_len

    @property
    def num_pages(self) -> int:
        return self.batch * -(-self.seq_len // self.page_size)

    @property
    def kv_tokens(self) -> int:
        """The keys the batch reads: num_tokens x topk (the selected rows, not the cache)."""
        return self.num_tokens * self.topk

    def bytes(self, L=512, R=64, itemsize=2, kv_itemsize=None) -> int:
        """The selected rows read once per token (num_tokens x topk rows: 576 values at itemsize, or the fp8_ds_mla
        layout's 656 bytes where kv_itemsize is 1) + q + out + the indices (4 bytes an entry)."""
        from mla_spec.fp8_sparse import BYTES_PER_TOKEN

        row = BYTES_PER_TOKEN if kv_itemsize == 1 else (L + R) * (itemsize if kv_itemsize is None else kv_itemsize)
        q = self.num_tokens * self.num_heads * (L + R) * itemsize
        out = self.num_tokens * self.num_heads * L * itemsize
        return self.kv_tokens * (row + 4) + q + out

    def flops(self, L=512, R=64) -> int:
        """2 x H x num_tokens x topk x (L + R + L)."""
        return 2 * self.num_heads * self.kv_tokens * (L + R + L)


def _sparse_grid(heads, batch_seqs, q_lens, topk=2048):
    return [SparseShape(h, b, s, q, topk) for q in q_lens for h in heads for b, s in batch_seqs]


def _grid(heads, batches, seqs, q_lens):
    return [Shape(h, b, s, q) for q in q_lens for h in heads for b in batches for s in seqs]


def _ragged_grid(bases, dists=("random", "tail", "fewlong")):
    """For each (H, B, S, q_len) of `bases`: the uniform shape, then the shape of each of `dists`, whose uniform
    twin it is (the same total KV tokens)."""
    return [Shape(h, b, s, q, dist=d) for h, b, s, q in bases for d in ("uniform", *dists)]


GRIDS = {
    # issue [pallas-triton]: H x B x S x q_len at page 64
    "triton": _grid((16, 128), (1, 8, 32, 64, 128), (1024, 4096, 16384), (1, 2)),
    # issue [mosaic]: the same plus (H=128, B=128, S=8192, q_len=2)
    "mosaic": _grid((16, 128), (1, 8, 32, 64, 128), (1024, 4096, 16384), (1, 2)) + [Shape(128, 128, 8192, 2)],
    # the mosaic grid's H = 16, q_len 2 rows alone (32-row query tiles)
    "mosaic_h16_q2": _grid((16,), (1, 8, 32, 64, 128), (1024, 4096, 16384), (2,)),
    # the anchors' headline shapes (memory-bound, compute-bound, latency)
    "headline": [Shape(16, 128, 16384), Shape(128, 64, 16384), Shape(16, 1, 1024), Shape(128, 1, 1024),
                 Shape(16, 64, 4096, 2), Shape(128, 32, 4096)],
    "smoke": [Shape(16, 4, 1024), Shape(128, 2, 2048, 2)],
    # fp8 KV cache against bf16 (--impls torch.fa3,jax.pallas_triton,jax.pallas_triton.fp8): memory-bound and mid
    "fp8": [Shape(16, 128, 16384), Shape(16, 64, 4096, 2), Shape(16, 32, 16384), Shape(128, 64, 16384),
            Shape(128, 32, 4096), Shape(16, 1, 1024), Shape(128, 1, 1024)],
    # fp8 with each request's last step masked (sequence lengths one short of a multiple of 64, as most real ones are
    # not multiples): the fp8 grid's bytes-bound rows and the 32-row ones, where a masked step shows most
    "fp8_tails": [Shape(16, 128, 16383), Shape(16, 64, 4095, 2), Shape(16, 32, 16383), Shape(32, 64, 4095),
                  Shape(16, 8, 4095), Shape(128, 64, 16383), Shape(16, 1, 1023)],
    # ragged batches (random, tail, fewlong; `Shape.dist`), each beside its uniform twin of the same total KV tokens:
    # H 16/64/128, B 32-128, mean KV 1k-8k, q_len 1/2/3, 131k or 262k KV tokens a row (fewlong's long requests
    # 45k-126k). 20 shapes: at about 20 s a shape for FA3 and the two Mosaic GPU rows (the H100 fp8 baseline's
    # pace, compiles included) about 7 minutes
    # the sparse decode (DeepSeek-V3.2, topk 2048): H 16/64/128 x (batch, cache length) from one 128k request to 128
    # requests of 8k, at q_len 1, and q_len 2 at H 16 and 128 on the two batches that fill the GPU; the caches hold
    # at most 4M tokens (4.8 GB in bf16). 19 shapes
    "sparse": _sparse_grid((16, 64, 128), ((1, 131072), (8, 32768), (32, 8192), (64, 65536), (128, 8192)), (1,))
              + _sparse_grid((16, 128), ((64, 65536), (128, 8192)), (2,)),
    "ragged": _ragged_grid([(16, 64, 4096, 1), (16, 128, 1024, 3), (64, 64, 2048, 1), (128, 32, 4096, 1),
                            (128, 32, 8192, 2)]),
}


def grid_shapes(grid: str, shard: tuple[int, int] | None = None, names: list[str] | None = None) -> list:
    """The shapes of GRIDS[grid] a run times: every N-th from the I-th with shard (I, N), then only those
    named in `names` (in grid order); a name not in the grid is a ValueError naming it."""
    shapes = GRIDS[grid]
    if names is not None:
        unknown = [n for n in names if n not in {s.name for s in shapes}]
        if unknown:
            raise ValueError(f"--shapes {','.join(unknown)} not in grid {grid!r} "
                             f"({', '.join(s.name for s in shapes)})")
    if shard is not None:
        shapes = shapes[shard[0]::shard[1]]
    if names is not None:
        shapes = [s for s in shapes if s.name in names]
        if not shapes:
            where = f"shard {shard[0]}/{shard[1]} of grid {grid!r}" if shard else f"grid {grid!r}"
            raise ValueError(f"--shapes {','.join(names)!r}: none in {where}")
    return shapes


_SPARSE_NAME = re.compile(r"H(\d+)_B(\d+)_S(\d+)_q(\d+)_top(\d+)(?:_P(\d+))?")
_NAME = re.compile(r"H(\d+)_B(\d+)_S(\d+)(?:_q(\d+))?(?:_(" + "|".join(DISTRIBUTIONS) + r")(?:_s(\d+))?)?(?:_P(\d+))?")


def parse_shape(name: str) -> "Shape | SparseShape":
    """A shape from its name: H128_B64_S16384_q1 (q_len 1 where `_q` is left out), then optionally the
    distribution of its KV lengths and its seed (`_tail`, `_random_s3`; uniform where left out, seed 0 where `_s` is
    left out), then optionally `_P<page size>`: H16_B64_S4096_q1_fewlong_P32. Shape.name gives the same name back
    (without the `_P` suffix). A name with `_top<k>` after `_q` is a SparseShape: H128_B64_S32768_q1_top2048."""
    m = _SPARSE_NAME.fullmatch(name)
    if m:
        h, b, s, q, k, p = m.groups()
        return SparseShape(int(h), int(b), int(s), int(q), int(k), **({"page_size": int(p)} if p else {}))
    m = _NAME.fullmatch(name)
    if not m:
        raise ValueError(f"shape must look like H128_B64_S16384_q1 (optionally _random, _tail or _fewlong, with "
                         f"_s<seed>, then _P64; or H128_B64_S32768_q1_top2048, a sparse shape), got {name!r}")
    h, b, s, q, dist, seed, p = m.groups()
    kw = {"page_size": int(p)} if p else {}
    if dist:
        kw.update(dist=dist, seed=int(seed or 0))
    return Shape(int(h), int(b), int(s), int(q or 1), **kw)
