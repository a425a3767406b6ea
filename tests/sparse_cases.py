"""The sparse decode cases every sparse implementation runs, and the base class that runs them.

`SparseCases` holds the cases (tests/cases.py's layout for the dense decode): a subclass in tests/test_sparse.py
says how to call its implementation (`decode`) and what it cannot run (`unsupported_reason`, the implementation's
own words); a case it cannot run is skipped with that reason.

Every case is a `SparseScenario`: a paged cache whose block 0 and every slot no used entry names hold NaN (bf16
cache) or 0xFF bytes (NaN in each part of the fp8_ds_mla layout), and one row of top-k slots per query token
drawn from the live slots. Out and LSE are checked against the float64 reference
(`mla_spec.reference.sparse_mla_decode`) on the same cache (its bytes for fp8_ds_mla) with the harness's
tolerances, twice them for the fp8 cache; tokens with no used entry must give out exactly 0 and lse -inf.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from mla_spec import MLAConfig, SparseMetadata, build_sparse_metadata, quantize_sparse_fp8, reference
from parity.scenarios import round_to
from tests.cases import assert_matches_reference, to_numpy


@dataclasses.dataclass(frozen=True)
class SparseScenario:
    """One sparse decode problem.

    Rows are drawn from `pool` live slots (block 0 is never live): distinct within a row unless
    `repeat_in_row`; a pool smaller than `num_tokens * topk` makes tokens share slots. `minus_one` is the share of
    entries set to -1 (anywhere in a row); `empty_rows` are all -1; `topk_length` (one per token, or None) cuts the
    rows, and the entries past it name NaN slots of block 0 (and one an out-of-range slot) so that reading them
    shows. `pairs`: tokens 2i and 2i + 1 are one request's two tokens (speculative decode), the second row the first
    with its last entry replaced."""

    name: str
    num_tokens: int
    topk: int
    num_heads: int = 16
    page_size: int = 64
    num_blocks: int = 8
    pool: int | None = None  # default: every non-zero block's slots
    minus_one: float = 0.0
    repeat_in_row: bool = False
    empty_rows: tuple[int, ...] = ()
    topk_length: tuple[int, ...] | None = None
    pairs: bool = False

    def config(self, dtype: str) -> MLAConfig:
        return MLAConfig(num_heads=self.num_heads, page_size=self.page_size, dtype=dtype)


@dataclasses.dataclass(frozen=True)
class SparseCase:
    scenario: SparseScenario
    dtype: str = "bfloat16"
    cache_format: str = "auto"

    @property
    def id(self) -> str:
        return "-".join([self.scenario.name, self.dtype] + (["fp8_ds_mla"] if self.cache_format != "auto" else []))

    @property
    def fp8(self) -> bool:
        return self.cache_format == "fp8_ds_mla"

    def config(self) -> MLAConfig:
        return self.scenario.config(self.dtype)


_S = SparseScenario
SCENARIOS = {s.name: s for s in [
    _S("minus_one_scattered", num_tokens=4, topk=64, minus_one=0.25),
    _S("repeats_across_tokens", num_tokens=6, topk=32, page_size=16, num_blocks=5, pool=48),
    _S("repeats_within_row", num_tokens=3, topk=16, page_size=16, num_blocks=3, pool=8, repeat_in_row=True),
    _S("topk_length", num_tokens=5, topk=128, minus_one=0.1, topk_length=(128, 1, 0, 77, 64)),
    _S("empty_rows", num_tokens=4, topk=8, page_size=16, num_blocks=3, empty_rows=(1,), topk_length=(8, 5, 3, 0)),
    _S("topk_1", num_tokens=3, topk=1, page_size=16, num_blocks=2, pool=2),
    _S("topk_2", num_tokens=3, topk=2, page_size=16, num_blocks=3, minus_one=0.2),
    _S("topk_2048", num_tokens=2, topk=2048, num_blocks=40, minus_one=0.05),
    _S("q_len_2", num_tokens=4, topk=32, page_size=16, num_blocks=6, pairs=True),
    _S("heads_128", num_tokens=3, topk=64, num_heads=128, minus_one=0.1),
    _S("page_1", num_tokens=3, topk=16, page_size=1, num_blocks=64, minus_one=0.2),
]}
SPARSE_CASES = [
    *(SparseCase(s) for s in SCENARIOS.values()),
    SparseCase(SCENARIOS["minus_one_scattered"], "float16"),
    SparseCase(SCENARIOS["topk_length"], "float32"),
    SparseCase(SCENARIOS["heads_128"], "float16"),
    *(SparseCase(SCENARIOS[name], cache_format="fp8_ds_mla") for name in (
        "minus_one_scattered", "repeats_within_row", "topk_length", "empty_rows", "topk_1", "topk_2048", "q_len_2",
        "heads_128", "page_1")),
]
SPARSE_CASE_IDS = [c.id for c in SPARSE_CASES]
assert len(set(SPARSE_CASE_IDS)) == len(SPARSE_CASE_IDS), "case ids must be unique"

READ_NAN_CASES = [c for c in SPARSE_CASES if c.id in ("minus_one_scattered-bfloat16",
                                                      "minus_one_scattered-bfloat16-fp8_ds_mla")]

NAN_BYTE = 0xFF
"""0xFF in every byte of an fp8_ds_mla slot: NaN as fp8 value, float32 scale and bfloat16 rope value alike."""


def make_indices(sc: SparseScenario, rng: np.random.Generator):
    """`(indices int64 [T, topk], topk_length or None)` for the scenario."""
    P = sc.page_size
    live = P + rng.permutation((sc.num_blocks - 1) * P)[: sc.pool or (sc.num_blocks - 1) * P]
    rows = np.empty((sc.num_tokens, sc.topk), np.int64)
    for t in range(sc.num_tokens):
        rows[t] = rng.choice(live, size=sc.topk, replace=sc.repeat_in_row or sc.topk > live.size)
    if sc.pairs:
        rows[1::2] = rows[0::2]
        rows[1::2, -1] = rng.choice(live, size=rows[1::2].shape[0])
    rows[rng.random(rows.shape) < sc.minus_one] = -1
    rows[list(sc.empty_rows)] = -1
    if sc.topk_length is None:
        return rows, None
    lengths = np.asarray(sc.topk_length, np.int64)
    past = np.arange(sc.topk)[None, :] >= lengths[:, None]
    rows[past] = rng.integers(0, P, size=int(past.sum()))  # block 0: NaN, never to be read
    t, j = np.argwhere(past)[0]
    rows[t, j] = 2**31 - 1  # past topk_length any int32 is allowed (and ignored)
    return rows, lengths


@dataclasses.dataclass(frozen=True)
class SparseInputs:
    config: MLAConfig
    cache_format: str
    q: np.ndarray  # [T, H, 576] float32, values representable in config.dtype
    kv_cache: np.ndarray  # [N, P, 576] float32 (NaN where unused) or uint8 [N, P, 656] (0xFF where unused)
    metadata: SparseMetadata  # int32 NumPy
    ref_out: np.ndarray  # float64
    ref_lse: np.ndarray

    @property
    def empty_tokens(self) -> np.ndarray:
        """The tokens with no used entry (out 0, lse -inf)."""
        used = self.metadata.indices != -1
        if self.metadata.topk_length is not None:
            used &= np.arange(self.metadata.topk)[None, :] < self.metadata.topk_length[:, None]
        return np.flatnonzero(~used.any(axis=1))


def make_inputs(case: SparseCase, seed: int = 0) -> SparseInputs:
    """The case's inputs and float64 reference: random rows in the slots the indices name, NaN everywhere else."""
    sc, config = case.scenario, case.config()
    rng = np.random.default_rng(seed)
    indices, lengths = make_indices(sc, rng)
    metadata = build_sparse_metadata(indices, lengths, config=config, num_blocks=sc.num_blocks)
    N, P, D = sc.num_blocks, sc.page_size, config.head_dim
    used = indices != -1
    if lengths is not None:
        used &= np.arange(sc.topk)[None, :] < lengths[:, None]
    named = np.unique(indices[used])
    rows = np.full((N * P, D), np.nan, np.float32)
    rows[named] = rng.standard_normal((named.size, D), dtype=np.float32)
    rows = round_to(rows, "bfloat16" if case.fp8 else case.dtype)
    if case.fp8:
        cache = quantize_sparse_fp8(rows)
        cache[np.isnan(rows).any(axis=1)] = NAN_BYTE
        cache = cache.reshape(N, P, -1)
    else:
        cache = rows.reshape(N, P, D)
    q = round_to(rng.standard_normal((sc.num_tokens, sc.num_heads, D), dtype=np.float32), case.dtype)
    ref_out, ref_lse = reference.sparse_mla_decode(q, cache, metadata, config, cache_format=case.cache_format)
    return SparseInputs(config, case.cache_format, q, cache, metadata, ref_out, ref_lse)


@functools.lru_cache(maxsize=None)
def prepare(case: SparseCase) -> SparseInputs:
    inputs = make_inputs(case)
    empty = inputs.empty_tokens
    live = np.setdiff1d(np.arange(inputs.q.shape[0]), empty)
    assert np.isfinite(inputs.ref_out[live]).all() and np.isfinite(inputs.ref_lse[live]).all()
    assert (inputs.ref_lse[empty] == -np.inf).all() and (inputs.ref_out[empty] == 0).all()
    return inputs


def assert_sparse_matches(out, lse, inputs: SparseInputs, case: SparseCase, what: str):
    """Shapes, dtypes and values against the float64 reference (tests/cases.py's check: `inputs` and `case` carry
    what it reads), and exactly 0 / -inf for the tokens with no used entry."""
    assert_matches_reference(out, lse, inputs, case, what)
    empty = inputs.empty_tokens
    out, lse = to_numpy(out), to_numpy(lse)
    assert (out[empty] == 0).all(), f"{what}: out of the tokens {empty.tolist()} with no used entry is not 0"
    assert (lse[empty] == -np.inf).all(), f"{what}: lse of the tokens {empty.tolist()} with no used entry: {lse[empty]}"


class SparseCases:
    """The sparse cases, for one implementation. A subclass defines:

    - `decode(inputs)`: runs the implementation on the case's `SparseInputs` (float32 NumPy q and float32 or uint8
      cache whose values are those of the case: the subclass casts them) and returns `(out, lse)` as it gives them;
    - `unsupported_reason(config, cache_format)`: the implementation's own reason not to run a problem, or None.
    """

    def decode(self, inputs: SparseInputs):
        raise NotImplementedError

    def unsupported_reason(self, config: MLAConfig, cache_format: str) -> str | None:
        raise NotImplementedError

    def _prepare_or_skip(self, case: SparseCase) -> SparseInputs:
        reason = self.unsupported_reason(case.config(), case.cache_format)
        if reason is not None:
            pytest.skip(reason)
        return prepare(case)

    @pytest.mark.parametrize("case", SPARSE_CASES, ids=SPARSE_CASE_IDS)
    def test_matches_reference(self, case: SparseCase):
        inputs = self._prepare_or_skip(case)
        out, lse = self.decode(inputs)
        assert_sparse_matches(out, lse, inputs, case, f"{type(self).__name__} {case.id}")

    @pytest.mark.parametrize("case", READ_NAN_CASES, ids=[c.id for c in READ_NAN_CASES])
    def test_a_read_nan_shows(self, case: SparseCase):
        """The NaN checks have teeth: NaN in one slot token 0 uses makes its out NaN, and no other token's."""
        inputs = self._prepare_or_skip(case)
        indices = inputs.metadata.indices
        slot = int(indices[0][indices[0] != -1][0])
        others = [t for t in range(1, indices.shape[0]) if slot not in indices[t]]
        kv = inputs.kv_cache.copy().reshape(-1, inputs.kv_cache.shape[-1])
        kv[slot] = NAN_BYTE if case.fp8 else np.nan
        out, lse = self.decode(dataclasses.replace(inputs, kv_cache=kv.reshape(inputs.kv_cache.shape)))
        out, lse = to_numpy(out), to_numpy(lse)
        assert np.isnan(out[0]).all(), "a NaN that token 0 reads does not show in its out"
        assert others and np.isfinite(out[others]).all() and np.isfinite(lse[others]).all(), (
            "token 0's NaN spread to tokens that do not read its slot"
        )

