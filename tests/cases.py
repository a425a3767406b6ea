"""The decode cases every implementation runs, and the base class that runs them.

`DecodeCases` holds the cases; tests/test_implementations.py subclasses it once per implementation
(tokamax's `ops/<op>/` test layout: one base, one subclass per backend). A subclass says how to call
its implementation (`decode`) and what it cannot run (`unsupported_reason`, the implementation's own
words); a case it cannot run is skipped with that reason.

Every case is a parity scenario (`parity.scenarios.Scenario`): block tables are random permutations
with block 0 unused, and every cache slot no request may read holds NaN (the tail of each last page
and the spare blocks). Every output and LSE is checked against the float64 reference
(`mla_spec.reference.mla_decode`) with the harness's dtype tolerances (`parity.compare.compare_out_lse`;
twice them for an fp8 cache, whose reference runs on the dequantized cache): a NaN that leaks from an
unreadable slot fails the comparator's NaN positions. Implementations that multiply masked (zero)
probabilities by the rows past seq_len (FA3, FlashMLA) set `page_tail = "finite"`: those slots then
hold +-1e4 garbage, still caught if attended to (`make_batch`'s `page_tail`).

The shapes are small: the Pallas kernels run in interpret mode on a CPU, the Mosaic GPU one at
seconds a call.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from mla_spec import Bucket, dtype_name, pad_to_bucket, reference
from parity.compare import TOLERANCES, compare
from parity.scenarios import Batch, Scenario, make_batch, make_fp8_batch


@dataclasses.dataclass(frozen=True)
class Case:
    """One problem: a scenario, q's dtype, and whether the cache is fp8 (float8_e4m3fn with a k_scale)."""

    scenario: Scenario
    dtype: str = "bfloat16"
    fp8: bool = False

    @property
    def id(self) -> str:
        return "-".join([self.scenario.name, self.dtype] + (["fp8"] if self.fp8 else []))

    def config(self):
        return self.scenario.config(self.dtype, kv_cache_dtype="fp8_e4m3" if self.fp8 else "auto")


def _sc(name, seq_lens, query_lens, *, heads=16, page=16) -> Scenario:
    return Scenario(name, seq_lens=seq_lens, query_lens=query_lens, num_heads=heads, page_size=page)


CASES = [
    # uniform batches: one seq_len and one q_len for every request (FlashMLA's shape: page 64, one q_len)
    Case(_sc("uniform_decode", (100,) * 4, (1,) * 4, page=64)),
    Case(_sc("uniform_q2_h128", (70,) * 2, (2,) * 2, heads=128, page=64), "float16"),
    Case(_sc("uniform_q2_h128", (70,) * 2, (2,) * 2, heads=128, page=64), "float32"),
    Case(_sc("uniform_q3", (50,) * 3, (3,) * 3, page=16)),
    # ragged lengths: one long request among short ones; lengths 1 to 250 with q_len 1 to 3 in one batch
    Case(_sc("ragged_one_long", (5, 1, 450, 12), (1,) * 4, page=64)),
    Case(_sc("ragged_spread", (1, 17, 130, 250, 40), (1, 2, 1, 3, 1), page=16)),
    # mixed q_len, one request's tokens past one 64-row tile of 16 heads (q_len 6)
    Case(_sc("mixed_q_len", (30, 100, 9, 130), (1, 3, 6, 2), page=16)),
    # page sizes 1 and 8 (16 and 64 above)
    Case(_sc("page_1", (1, 5, 17), (1, 2, 1), page=1)),
    Case(_sc("page_1", (1, 5, 17), (1, 2, 1), page=1), "float32"),
    Case(_sc("page_8", (7, 9, 40), (1, 2, 1), page=8), "float16"),
    # seq_len at page boundaries and one off either side, decode and q_len 2
    Case(_sc("boundaries_p16", (15, 16, 17, 47, 48, 49), (1,) * 6, page=16)),
    Case(_sc("boundaries_p64_q2", (63, 64, 65, 129), (2,) * 4, page=64)),
    # 128 heads with mixed q_len
    Case(_sc("heads_128_spec", (33, 97), (1, 2), heads=128, page=16), "float16"),
    # an fp8 cache with its per-tensor k_scale: bf16 q with mixed q_len, fp16 q at page boundaries
    Case(_sc("fp8_spec", (8, 70, 150), (3, 1, 2), page=16), "bfloat16", fp8=True),
    Case(_sc("boundaries_p64_q2", (63, 64, 65, 129), (2,) * 4, page=64), "float16", fp8=True),
]
CASE_IDS = [c.id for c in CASES]
assert len(set(CASE_IDS)) == len(CASE_IDS), "case ids must be unique"

# the cases padded to a bucket (test_padded_bucket): ragged q_len 1-3 in bf16, and an fp8 cache
PADDED_CASES = [c for c in CASES if c.id in ("ragged_spread-bfloat16", "fp8_spec-bfloat16-fp8")]
PADDED_IDS = [c.id for c in PADDED_CASES]

# the case the NaN-teeth test poisons: one every implementation runs (FlashMLA's page 64 and one q_len)
READ_NAN_CASE = CASES[0]


@dataclasses.dataclass(frozen=True)
class Prepared:
    batch: Batch  # float32 NumPy inputs (fp8 values for an fp8 cache), NaN where no request may read
    k_scale: float
    ref_out: np.ndarray  # float64
    ref_lse: np.ndarray


@functools.lru_cache(maxsize=None)
def prepare(case: Case, page_tail: str = "nan") -> Prepared:
    """The case's batch and its float64 reference (on the dequantized cache for fp8)."""
    if case.fp8:
        batch, k_scale = make_fp8_batch(case.scenario, case.dtype, page_tail=page_tail)
        kv = batch.kv_cache.astype(np.float64) * k_scale
        ref_out, ref_lse = reference.mla_decode(batch.q, kv, batch.metadata,
                                                batch.config.replace(kv_cache_dtype="auto"))
    else:
        batch, k_scale = make_batch(case.scenario, case.dtype, page_tail=page_tail), 1.0
        ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    assert np.isfinite(ref_out).all() and np.isfinite(ref_lse).all()
    return Prepared(batch, k_scale, ref_out, ref_lse)


def tolerances(dtype: str, fp8: bool) -> dict:
    """The harness tolerances of q's dtype (`parity.compare.TOLERANCES`), twice them with an fp8 cache."""
    tol = TOLERANCES[dtype]
    if not fp8:
        return dict(tol)
    return dict(out_rel=2 * tol["out_rel"], out_cos=1 - 2 * (1 - tol["out_cos"]), lse_abs=2 * tol["lse_abs"])


def to_numpy(x) -> np.ndarray:
    """A torch tensor or JAX array as a float32 NumPy array (on the host)."""
    if hasattr(x, "detach"):  # torch
        return x.detach().float().cpu().numpy()
    return np.asarray(x.astype("float32"))


def assert_matches_reference(out, lse, p: Prepared, case: Case, what: str):
    """Shapes and dtypes (out in q's dtype, lse float32), then out and lse against the float64 reference."""
    T, H, L = p.ref_out.shape
    assert tuple(out.shape) == (T, H, L), f"{what}: out.shape={tuple(out.shape)}, expected {(T, H, L)}"
    assert tuple(lse.shape) == (T, H), f"{what}: lse.shape={tuple(lse.shape)}, expected {(T, H)}"
    assert dtype_name(out.dtype) == case.dtype, f"{what}: out.dtype={out.dtype}, expected {case.dtype}"
    assert dtype_name(lse.dtype) == "float32", f"{what}: lse.dtype={lse.dtype}, expected float32"
    tol = tolerances(case.dtype, case.fp8)
    c_out = compare(to_numpy(out), p.ref_out, name="out", rel_tol=tol["out_rel"], cos_tol=tol["out_cos"])
    c_lse = compare(to_numpy(lse), p.ref_lse, name="lse", abs_tol=tol["lse_abs"])
    assert c_out.ok, f"{what}: {c_out.message}"
    assert c_lse.ok, f"{what}: {c_lse.message}"


class DecodeCases:
    """The cases, for one implementation. A subclass defines:

    - `decode(batch, k_scale)`: runs the implementation on the case's batch (float32 NumPy q and cache whose
      values are those of the case's dtypes: the subclass casts them) and returns `(out, lse)` as it gives them;
    - `unsupported_reason(config, query_lens)`: the implementation's own reason not to run a problem, or None;
    - `page_tail`: "nan" (the strict batch) or "finite" (see the module docstring).
    """

    page_tail = "nan"

    def decode(self, batch: Batch, k_scale: float):
        raise NotImplementedError

    def unsupported_reason(self, config, query_lens) -> str | None:
        raise NotImplementedError

    def _prepare_or_skip(self, case: Case) -> Prepared:
        reason = self.unsupported_reason(case.config(), case.scenario.query_lens)
        if reason is not None:
            pytest.skip(reason)
        return prepare(case, self.page_tail)

    @pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
    def test_matches_reference(self, case: Case):
        p = self._prepare_or_skip(case)
        assert np.isnan(p.batch.kv_cache).any(), "the unreadable slots hold NaN, to be leaked"
        out, lse = self.decode(p.batch, p.k_scale)
        assert_matches_reference(out, lse, p, case, f"{type(self).__name__} {case.id}")

    @pytest.mark.parametrize("case", PADDED_CASES, ids=PADDED_IDS)
    def test_padded_bucket(self, case: Case):
        """The batch padded to a bucket (two padding requests, token rows and block-table columns past the
        batch's, max_seq_len a bound): the real rows match the reference, and every padding row, whose q is NaN,
        gives out 0 and lse -inf (block 0, which the padding's block-table entries name, holds NaN)."""
        p = self._prepare_or_skip(case)
        md = p.batch.metadata
        T = int(md.num_decode_tokens)
        bucket = Bucket(num_reqs=md.num_reqs + 2, num_tokens=T + 3, max_blocks=md.max_blocks + 2,
                        max_seq_len=md.max_seq_len + 100, max_query_len=3)
        padded = pad_to_bucket(md, bucket, p.batch.config, num_blocks=p.batch.kv_cache.shape[0])
        assert np.isnan(p.batch.kv_cache[0]).all(), "block 0 (the padding's) holds NaN"
        q = np.concatenate([p.batch.q, np.full((3,) + p.batch.q.shape[1:], np.nan, np.float32)])
        out, lse = self.decode(dataclasses.replace(p.batch, metadata=padded, q=q), p.k_scale)
        assert_matches_reference(out[:T], lse[:T], p, case, f"{type(self).__name__} {case.id} padded")
        out, lse = to_numpy(out), to_numpy(lse)
        assert (out[T:] == 0).all(), f"padding rows' out: {out[T:].min()} .. {out[T:].max()}, expected 0"
        assert (lse[T:] == -np.inf).all(), f"padding rows' lse: {lse[T:].min()} .. {lse[T:].max()}, expected -inf"

    def test_a_read_nan_shows(self):
        """The NaN checks have teeth: NaN in a slot request 0 reads makes its out NaN, and only its out."""
        p = self._prepare_or_skip(READ_NAN_CASE)
        kv = p.batch.kv_cache.copy()
        kv[int(p.batch.metadata.block_table[0, 0]), 0] = np.nan  # position 0: every token of request 0 reads it
        out, lse = self.decode(dataclasses.replace(p.batch, kv_cache=kv), p.k_scale)
        out, lse = to_numpy(out), to_numpy(lse)
        q0 = READ_NAN_CASE.scenario.query_lens[0]
        assert np.isnan(out[:q0]).all(), "a NaN that request 0 reads does not show in its out"
        assert np.isfinite(out[q0:]).all() and np.isfinite(lse[q0:]).all(), "request 0's NaN spread to others"
