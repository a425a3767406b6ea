"""The sparse Pallas Triton kernel (mla_jax.sparse_triton, DeepSeek-V3.2 DSA top-k decode) in interpret mode.

The shared sparse cases (tests/sparse_cases.py: -1 scattered, repeats, topk_length, empty rows, topk 1, 2 and
2048, 128 heads, page 1, both cache formats) run this kernel in tests/test_sparse.py. Here, against mla_spec's
float64 reference, what is the kernel's own: explicit tunings (splits merged by LSE, an empty split, a head block
wider than the heads), topk 3, head counts it pads (8, 24) and head blocks of 32 on the fp8 layout. Every cache
slot that no used entry names holds NaN (in the fp8 layout: NaN values 0x7F / 0xFF, NaN scales, NaN rope), and
entries past topk_length name such slots: a leak shows up as a NaN-position mismatch. Then the Triton lowering for an abstract H200, the views XLA copies, the tuning, the
heuristic and bad input.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mla_jax import sparse_triton
from mla_jax.sparse_triton import SparseTritonConfig, sparse_decode, sparse_heuristic
from mla_spec import MLAConfig, SparseMetadata
from mla_spec import reference as spec_reference
from mla_spec.fp8_sparse import dequantize_sparse_fp8
from mla_spec.fp8_sparse import quantize_sparse_fp8 as quantize_fp8
from parity.compare import compare_out_lse
from parity.h200 import lower_for_h200

SCALE = 576**-0.5
JNP = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


# ----------------------------------------------------------------------------- reference and the fp8 layout


def reference(q, rows, indices, topk_length=None):
    """float64 (mla_spec's sparse reference, the definition): q [T, H, 576], rows [num_slots, 576] (float, or the
    uint8 fp8 layout) -> out [T, H, 512], lse [T, H]."""
    fp8 = rows.dtype == np.uint8
    config = MLAConfig(num_heads=q.shape[1], page_size=1, softmax_scale=SCALE, dtype="float32")
    md = SparseMetadata(indices=np.asarray(indices, np.int32),
                        topk_length=None if topk_length is None else np.asarray(topk_length, np.int32))
    out, lse = spec_reference.sparse_mla_decode(np.asarray(q, np.float64), rows[:, None], md, config,
                                                cache_format="fp8_ds_mla" if fp8 else "auto")
    return np.asarray(out, np.float64), np.asarray(lse, np.float64)


def dequantize_fp8(cache):
    """uint8 [..., 656] -> float64 [..., 576] (mla_spec's decode; exact in float32)."""
    return dequantize_sparse_fp8(cache).astype(np.float64)


def used_slots(indices, topk_length):
    n = indices.shape[1]
    lengths = np.full(indices.shape[0], n) if topk_length is None else np.asarray(topk_length)
    used = (np.arange(n)[None, :] < lengths[:, None]) & (indices >= 0)
    return np.unique(indices[used])


def poison(cache, keep):
    """A copy of the cache (rows [..., 576] or the uint8 fp8 layout) with NaN in every slot not in `keep`."""
    cache = cache.copy()
    flat = cache.reshape(-1, cache.shape[-1])
    bad = np.setdiff1d(np.arange(flat.shape[0]), keep)
    if cache.dtype == np.uint8:  # NaN e4m3 values (0x7F and 0xFF), NaN scales, NaN bf16 rope
        flat[bad, :512] = np.where(np.arange(512) % 2, 0xFF, 0x7F)
        flat[bad, 512:528] = np.full((4,), np.nan, "<f4").view(np.uint8)
        flat[bad, 528:] = np.full((64,), np.nan, ml_dtypes.bfloat16).view(np.uint8)
    else:
        flat[bad] = np.nan
    return cache


# ----------------------------------------------------------------------------- scenarios


@dataclasses.dataclass(frozen=True)
class Case:
    """A problem: T tokens of H heads over num_blocks pages of page_size slots, topk entries a token drawn by
    `kind` (see make_indices)."""

    name: str
    T: int
    H: int
    topk: int
    page_size: int = 16
    num_blocks: int = 16
    kind: str = "mixed"


def make_indices(case: Case, rng):
    """(indices [T, topk] int32, topk_length [T] int32 or None). kind "mixed": row 0 random slots with -1
    scattered, row 1 the same slots permuted (repeats across tokens), row 2 one slot three times and another twice
    (repeats within a row), row 3 topk_length 37 with -1 and an int32-max slot past it, row 4 topk_length 0, row 5
    -1 only. kind "random": distinct random slots, a few -1. Slot 0 is never named in either (it holds NaN). kind
    "unique": the first topk slots shuffled."""
    num_slots = case.num_blocks * case.page_size
    T, K = case.T, case.topk
    if case.kind == "unique":
        return np.stack([rng.permutation(K) for _ in range(T)]).astype(np.int32), None
    # slot 0 is never named (NaN): a kernel that reads slot 0 for its skipped entries shows it
    idx = np.stack([1 + rng.choice(num_slots - 1, K, replace=False) for _ in range(T)]).astype(np.int32)
    idx[rng.random(idx.shape) < 0.2] = -1
    if case.kind == "random":
        return idx, None
    assert T == 6 and K >= 40
    idx[1] = rng.permutation(idx[0])
    idx[2, [1, 5, K - 1]] = idx[2, 3]
    idx[2, [0, 7]] = idx[2, 2]
    idx[3, 37:] = idx[0, 37:]  # past topk_length: slots that row 0 uses or NaN ones, and an int32-max slot
    idx[3, 38] = np.iinfo(np.int32).max
    idx[5] = -1
    length = np.array([K, K, K, 37, 0, K], np.int32)
    return idx, length


MIXED = Case("mixed", T=6, H=16, topk=80)


def run(case: Case, dtype: str = "bfloat16", fmt: str = "bf16", tuning=None, seed: int = 0, interpret: bool = True):
    """The kernel against the float64 reference, NaN in every slot no used entry names."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((case.T, case.H, 576)).astype(NP[dtype])
    kv = rng.standard_normal((case.num_blocks, case.page_size, 576)).astype(np.float32)
    indices, topk_length = make_indices(case, rng)
    keep = used_slots(indices, topk_length)
    if fmt == "fp8":
        cache = poison(quantize_fp8(kv), keep)
        rows = dequantize_fp8(cache).reshape(-1, 576)
    else:
        cache = poison(kv.astype(NP[dtype]), keep)
        rows = cache.reshape(-1, 576).astype(np.float64)
    assert np.isnan(rows[0]).all() or case.kind == "unique"  # the poison is there to be leaked
    want_out, want_lse = reference(q.astype(np.float64), rows, indices, topk_length)
    out, lse = sparse_decode(jnp.asarray(q), jnp.asarray(cache), jnp.asarray(indices),
                             None if topk_length is None else jnp.asarray(topk_length), softmax_scale=SCALE,
                             interpret=interpret, tuning=tuning)
    assert out.shape == (case.T, case.H, 512) and out.dtype == JNP[dtype]
    assert lse.shape == (case.T, case.H) and lse.dtype == jnp.float32
    c_out, c_lse = compare_out_lse(np.asarray(out, np.float32), np.asarray(lse), want_out, want_lse, dtype)
    what = f"{case} {dtype} {fmt} {tuning}"
    assert c_out.ok, f"{what}: {c_out.message}"
    assert c_lse.ok, f"{what}: {c_lse.message}"
    return np.asarray(out, np.float32), np.asarray(lse), want_lse


# ----------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("tuning", [
    SparseTritonConfig(block_h=16, block_k=16, num_splits=3),  # splits merged by LSE; the third ends past row 3
    SparseTritonConfig(block_h=32, block_k=32, num_splits=1, num_warps=8),  # 16 heads in a 32 block
    SparseTritonConfig(block_h=16, block_k=128, num_splits=2),  # one step holds all 80 entries: split 2 is empty
], ids=["splits3", "block_h32", "empty_split"])
def test_mixed_rows_tunings(tuning, fmt):
    run(MIXED, "bfloat16", fmt, tuning)


@pytest.mark.parametrize("topk", [3])
def test_tiny_topk(topk):
    """topk below block_k (16) and not a power of two: one step, mostly masked (topk 1 and 2: the shared cases)."""
    run(Case(f"topk{topk}", T=3, H=16, topk=topk, kind="random"), seed=topk)


@pytest.mark.parametrize("H, page_size, fmt", [
    (8, 1, "bf16"),  # heads padded to 16
    (128, 1, "fp8"),  # 4 head blocks of 32
    (24, 64, "fp8"),  # 24 heads in a block of 32
])
def test_heads_and_pages(H, page_size, fmt):
    run(Case(f"h{H}_p{page_size}", T=2, H=H, topk=64, page_size=page_size, num_blocks=256 // page_size,
             kind="random"),
        fmt=fmt, seed=H + page_size)


def test_out_of_range_index_is_skipped():
    """A used entry outside [0, num_slots) is skipped like -1 (never read out of bounds)."""
    case = Case("oob", T=2, H=16, topk=32, kind="unique")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 16, 576)).astype(ml_dtypes.bfloat16)
    kv = rng.standard_normal((16, 16, 576)).astype(ml_dtypes.bfloat16)
    idx, _ = make_indices(case, rng)
    bad = idx.copy()
    bad[0, 3], bad[1, 0], bad[1, 9] = 256, np.iinfo(np.int32).max, -7
    want = idx.copy()
    want[0, 3] = want[1, 0] = want[1, 9] = -1
    out, lse = sparse_decode(jnp.asarray(q), jnp.asarray(kv), jnp.asarray(bad), softmax_scale=SCALE, interpret=True)
    ref_out, ref_lse = reference(q.astype(np.float64), kv.reshape(-1, 576).astype(np.float64), want)
    c_out, c_lse = compare_out_lse(np.asarray(out, np.float32), np.asarray(lse), ref_out, ref_lse, "bfloat16")
    assert c_out.ok and c_lse.ok, (c_out.message, c_lse.message)


def test_new_indices_reuse_the_compiled_call():
    """Under jax.jit, new indices and lengths of the same shapes: one trace, each against the reference."""
    traces = []

    def decode(q, kv, idx, length):
        traces.append(1)  # runs only while tracing
        return sparse_decode(q, kv, idx, length, softmax_scale=SCALE, interpret=True)

    fn = jax.jit(decode)
    rng = np.random.default_rng(7)
    q = rng.standard_normal((6, 16, 576)).astype(ml_dtypes.bfloat16)
    kv = rng.standard_normal((16, 16, 576)).astype(ml_dtypes.bfloat16)
    for seed in (1, 2):
        idx, length = make_indices(MIXED, np.random.default_rng(seed))
        out, lse = fn(jnp.asarray(q), jnp.asarray(kv), jnp.asarray(idx), jnp.asarray(length))
        want = reference(q.astype(np.float64), kv.reshape(-1, 576).astype(np.float64), idx, length)
        c_out, c_lse = compare_out_lse(np.asarray(out, np.float32), np.asarray(lse), *want, "bfloat16")
        assert c_out.ok and c_lse.ok, (c_out.message, c_lse.message)
    assert len(traces) == 1 and fn._cache_size() == 1


@pytest.mark.gpu
@pytest.mark.parametrize("case, fmt, tuning", [
    (MIXED, "bf16", None),
    (MIXED, "fp8", None),
    (MIXED, "fp8", SparseTritonConfig(block_h=16, block_k=16, num_splits=3)),
    (Case("v32_h128", T=4, H=128, topk=2048, page_size=64, num_blocks=64, kind="random"), "bf16", None),
    (Case("v32_h128", T=4, H=128, topk=2048, page_size=64, num_blocks=64, kind="random"), "fp8", None),
    (Case("v32_h16", T=64, H=16, topk=2048, page_size=64, num_blocks=64, kind="random"), "bf16", None),
    (Case("topk3", T=3, H=16, topk=3, kind="random"), "fp8", None),
], ids=["mixed", "mixed_fp8", "mixed_fp8_splits", "h128_bf16", "h128_fp8", "h16_t64", "topk3_fp8"])
def test_compiled_on_gpu(case, fmt, tuning):
    """The kernel compiled through the Triton lowering on a GPU, against the same reference."""
    if jax.default_backend() != "gpu":
        pytest.skip(f"JAX has no GPU (default backend {jax.default_backend()!r})")
    run(case, fmt=fmt, tuning=tuning, interpret=False)


# ----------------------------------------------------------------------------- Triton lowering, XLA views


def _abstract(T, H, topk, cache_shape, cache_dtype, q_dtype=jnp.bfloat16, with_length=True):
    sds = jax.ShapeDtypeStruct
    return (sds((T, H, 576), q_dtype), sds(cache_shape, cache_dtype), sds((T, topk), jnp.int32),
            sds((T,), jnp.int32) if with_length else None)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("args, tuning", [
    (_abstract(64, 128, 2048, (1024, 64, 576), jnp.bfloat16), None),  # one program a head block: no split
    (_abstract(2, 128, 2048, (1024, 64, 656), jnp.uint8), None),  # fp8 layout, splits and the merge
    (_abstract(4, 16, 3, (64, 1, 576), jnp.float16, jnp.float16, False),
     SparseTritonConfig(block_h=16, block_k=16, num_splits=2, num_warps=2, num_stages=3)),
], ids=["bf16_h128", "fp8_splits", "fp16_tiny"])
def test_lowers_to_triton_for_an_abstract_h200(args, tuning):
    """The kernel goes through the Pallas Triton lowering (power-of-two arrays, supported primitives: the fp8
    decode's bitcasts, shifts and split included) for an abstract H200, without a GPU; the cache reaches the
    kernel without a bitcast_convert (no copy). Resource limits (registers, shared memory) need a GPU."""
    q, cache, idx, length = args
    tc = tuning or sparse_heuristic(q.shape[1], idx.shape[1], q.shape[0], cache.dtype)

    def fn(q, cache, idx, length):
        return sparse_decode(q, cache, idx, length, softmax_scale=SCALE, tuning=tc)

    text = lower_for_h200(fn, q, cache, idx, length).as_text()
    assert "__gpu$xla.gpu.triton" in text and "mla_sparse_decode" in text
    assert f"num_warps = {tc.num_warps} : i32" in text and f"num_stages = {tc.num_stages} : i32" in text
    assert ("mla_combine_splits" in text) == (tc.num_splits > 1)
    assert "stablehlo.bitcast_convert" not in text  # the cache reaches the kernel through a reshape alone


def test_only_the_reshape_view_is_free():
    """What the kernel's byte decoding avoids: in front of a custom call (here a CPU callback, as the kernel is
    one on the GPU), XLA:CPU passes the reshaped uint8 cache as a bitcast, but writes every bitcast_convert_type
    view out as a new array (a fusion): float8_e4m3fn (same width), float32 scales and bfloat16 rope (widths
    changed: BitcastDtypesExpander's shifts and ors)."""
    cache = jnp.zeros((4, 16, 656), jnp.uint8)

    def consume(x):
        return jax.pure_callback(lambda a: np.zeros((), np.float32), jax.ShapeDtypeStruct((), jnp.float32), x)

    views = {
        "reshape": lambda c: c.reshape(-1, 656),
        "float8_e4m3fn": lambda c: jax.lax.bitcast_convert_type(c.reshape(-1, 656), jnp.float8_e4m3fn),
        "float32": lambda c: jax.lax.bitcast_convert_type(c.reshape(-1, 164, 4), jnp.float32),
        "bfloat16": lambda c: jax.lax.bitcast_convert_type(c.reshape(-1, 328, 2), jnp.bfloat16),
    }
    copies = {}
    for name, view in views.items():
        hlo = jax.jit(lambda c, view=view: consume(view(c))).lower(cache).compile().as_text()
        copies[name] = " fusion(" in hlo[hlo.index("ENTRY"):]
    assert copies == {"reshape": False, "float8_e4m3fn": True, "float32": True, "bfloat16": True}


# ----------------------------------------------------------------------------- tuning and heuristic


def test_default_config_is_valid_and_frozen():
    tc = SparseTritonConfig()
    assert (tc.block_h, tc.block_k, tc.num_splits) == (16, 64, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tc.num_splits = 2  # type: ignore[misc]


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_h=24), "block_h=24"),
    (dict(block_h=8), "block_h=8"),
    (dict(block_h=16.0), "block_h=16.0"),
    (dict(block_k=48), "block_k=48"),
    (dict(block_k=True), "block_k=True"),
    (dict(num_splits=0), "num_splits=0"),
    (dict(num_splits=2.0), "num_splits=2.0"),
    (dict(num_stages=0), "num_stages=0"),
    (dict(num_warps=3), "num_warps=3"),
    (dict(num_warps=True), "num_warps=True"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SparseTritonConfig(**kwargs)


def test_heuristic():
    # V3.2 at a big batch: 2 head blocks of 64 rows x 64 tokens fill the SMs, no split
    big = sparse_heuristic(128, 2048, 64, jnp.bfloat16)
    assert big == SparseTritonConfig(block_h=64, block_k=64, num_splits=1, num_warps=8, num_stages=2)
    # one token: 2 programs; splits up to 2048 / 64 / MIN_STEPS_PER_SPLIT = 8
    assert sparse_heuristic(128, 2048, 1, jnp.bfloat16).num_splits == 8
    # 16 heads: 128-row steps (M = 16), splits by the SMs: 132 // 16 = 8, within 2048 / 128 / 4 = 4
    small = sparse_heuristic(16, 2048, 16, jnp.float16)
    assert (small.block_h, small.block_k, small.num_warps, small.num_splits) == (16, 128, 4, 4)
    # fp8: at most 32 rows, 8 warps
    fp8 = sparse_heuristic(128, 2048, 64, jnp.uint8)
    assert (fp8.block_h, fp8.block_k, fp8.num_warps, fp8.num_stages, fp8.num_splits) == (32, 64, 8, 3, 1)
    # a short topk: one 16-row step, no split; few heads padded to 16
    tiny = sparse_heuristic(4, 3, 1, jnp.bfloat16)
    assert (tiny.block_h, tiny.block_k, tiny.num_splits) == (16, 16, 1)
    assert sparse_heuristic(16, 2048, 1, jnp.bfloat16, num_sms=8).num_splits == 4
    assert sparse_heuristic(16, 2048, 1000, jnp.bfloat16).num_splits == 1


# ----------------------------------------------------------------------------- bad input


def _inputs(**changes):
    base = dict(q=np.zeros((2, 16, 576), ml_dtypes.bfloat16), kv_cache=np.zeros((4, 16, 576), ml_dtypes.bfloat16),
                indices=np.zeros((2, 8), np.int32), topk_length=None)
    base.update(changes)
    return base


@pytest.mark.parametrize("changes, error, match", [
    (dict(q=np.zeros((2, 576), ml_dtypes.bfloat16)), ValueError, r"q.shape=\(2, 576\)"),
    (dict(q=np.zeros((2, 16, 512), ml_dtypes.bfloat16)), NotImplementedError, r"q.shape=\(2, 16, 512\)"),
    (dict(q=np.zeros((2, 16, 576), np.float32)), ValueError, "q.dtype=float32"),
    (dict(kv_cache=np.zeros((64, 576), ml_dtypes.bfloat16)), ValueError, r"kv_cache.shape=\(64, 576\)"),
    (dict(kv_cache=np.zeros((4, 16, 576), np.float16)), ValueError, "kv_cache.dtype=float16"),
    (dict(kv_cache=np.zeros((4, 16, 512), ml_dtypes.bfloat16)), NotImplementedError, r"kv_cache.shape=\(4, 16, 512\)"),
    (dict(kv_cache=np.zeros((4, 16, 576), np.uint8)), ValueError, r"656.*kv_cache.shape=\(4, 16, 576\)"),
    (dict(kv_cache=np.zeros((0, 16, 576), ml_dtypes.bfloat16)), ValueError, r"kv_cache.shape=\(0, 16, 576\)"),
    (dict(indices=np.zeros((2, 8), np.int64)), ValueError, "indices.dtype=int64"),
    (dict(indices=np.zeros((3, 8), np.int32)), ValueError, r"indices.shape=\(3, 8\)"),
    (dict(indices=np.zeros((2, 0), np.int32)), ValueError, r"indices.shape=\(2, 0\)"),
    (dict(indices=np.zeros((16,), np.int32)), ValueError, r"indices.shape=\(16,\)"),
    (dict(topk_length=np.zeros((3,), np.int32)), ValueError, r"topk_length.shape=\(3,\)"),
    (dict(topk_length=np.zeros((2, 1), np.int32)), ValueError, r"topk_length.shape=\(2, 1\)"),
    (dict(topk_length=np.zeros((2,), np.int64)), ValueError, "topk_length.dtype=int64"),
    (dict(topk_length=[8, 8]), ValueError, r"topk_length=\[8, 8\]"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(changes, error, match):
    with pytest.raises(error, match=match):
        sparse_decode(**_inputs(**changes), softmax_scale=SCALE, interpret=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(softmax_scale=-1.0), "softmax_scale=-1.0"),
    (dict(softmax_scale=float("nan")), "softmax_scale=nan"),
    (dict(softmax_scale=jnp.float32(0.1)), "softmax_scale=Array"),  # a traced-able array: not static
    (dict(tuning={"block_h": 16}), "tuning={'block_h': 16}"),
    (dict(interpret="yes"), "interpret='yes'"),
])
def test_bad_arguments(kwargs, match):
    args = dict(softmax_scale=SCALE, interpret=True) | kwargs
    with pytest.raises(ValueError, match=match):
        sparse_decode(**_inputs(), **args)


def test_uint8_cache_with_int32_offsets_is_refused_compiled():
    """A uint8 cache of 2**31 to 2**32 bytes gets int32 gather offsets from JAX's Triton lowering, which overflow:
    refused when compiled (abstract shapes: nothing is allocated)."""
    q, cache, idx, _ = _abstract(1, 16, 64, (3_300_000, 1, 656), jnp.uint8)
    with pytest.raises(NotImplementedError, match=r"kv_cache.shape=\(3300000, 1, 656\)"):
        jax.eval_shape(lambda q, c, i: sparse_decode(q, c, i, softmax_scale=SCALE), q, cache, idx)
