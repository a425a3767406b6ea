"""FP8 KV cache (kv_cache_dtype="fp8_e4m3"): a float8_e4m3fn cache with vLLM's per-tensor
`k_scale` (real value = fp8 value * k_scale), q in bf16/fp16.

The jnp reference, the Pallas Triton kernel (interpret mode on the CPU; compiled in the `gpu`
tests) and the torch reference, against the float64 reference run on the dequantized cache,
within twice the harness tolerances of q's dtype. Unreadable cache slots hold fp8 NaN: they
must not leak. Plus the validation of k_scale and of the cache dtype, k_scale traced under
jit, FA3's refusal of fp8, and the Mosaic GPU kernel's fp8 path (interpret mode, lowering; compiled in the
`gpu` tests).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from jax.experimental.mosaic.gpu import fragmented_array as mfa

import mla_jax
import mla_torch
from mla_jax import pallas_triton
from mla_jax.pallas_triton import TritonConfig
from mla_spec import MLAConfig, reference, validate_inputs
from mla_spec.config import FP8_KV_CACHE_MSG
from parity.compare import TOLERANCES, compare
from parity.h200 import lower_for_h200
from parity.scenarios import FP8_E4M3_MAX, SCENARIOS, Scenario, make_fp8_batch

JNP_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}
# the parity scenarios and, for the Mosaic kernel's overlap_dequant, H = 16 at q_len 2 (32 rows of a tile in use),
# H = 8 up to q_len 3 (24 rows) at page 8 and H = 8 at q_len 2 (16 rows: the heuristic's transposed_pv too)
FP8_SCENARIOS = {**SCENARIOS,
                 "decode_q2_page_32": Scenario("decode_q2_page_32", seq_lens=(70, 200, 131), query_lens=(2, 1, 2),
                                               page_size=32),
                 "heads_8_page_8": Scenario("heads_8_page_8", seq_lens=(30, 150), query_lens=(1, 3), num_heads=8,
                                            page_size=8),
                 "heads_8_q2": Scenario("heads_8_q2", seq_lens=(45, 150), query_lens=(2, 2), num_heads=8,
                                        page_size=16),
                 # kv_halves: pages of two steps; and block tables past one chunk of a warpgroup (96 entries)
                 "page_128": Scenario("page_128", seq_lens=(100, 300, 700), query_lens=(1, 1, 1), page_size=128),
                 "long_page_8": Scenario("long_page_8", seq_lens=(1030, 1700), query_lens=(1, 1), page_size=8),
                 # kv_halves at 32 rows: H = 16 at q_len 2 past a block-table chunk, H = 32 at q_len 1
                 "long_q2_page_16": Scenario("long_q2_page_16", seq_lens=(1030, 1700), query_lens=(2, 2),
                                             page_size=16),
                 "heads_32": Scenario("heads_32", seq_lens=(300, 1100, 77), query_lens=(1, 1, 1), num_heads=32),
                 # and H = 8 at q_len 4 (four tokens a tile: their causal masks), beside a q_len-3 request
                 "heads_8_q4": Scenario("heads_8_q4", seq_lens=(300, 1100), query_lens=(4, 3), num_heads=8,
                                        page_size=32)}
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.lru_cache(maxsize=None)
def fp8_batch_and_reference(name: str, dtype: str = "bfloat16", seed: int = 0):
    """(batch, k_scale, ref_out, ref_lse): the float64 reference on the dequantized cache."""
    batch, k_scale = make_fp8_batch(FP8_SCENARIOS[name], dtype, seed=seed)
    return (batch, k_scale, *fp8_reference(batch, k_scale))


def fp8_reference(batch, k_scale):
    """(ref_out, ref_lse): the float64 reference of `batch` on its dequantized cache."""
    dequantized = batch.kv_cache.astype(np.float64) * k_scale
    return reference.mla_decode(batch.q, dequantized, batch.metadata, batch.config.replace(kv_cache_dtype="auto"))


def assert_close(out, lse, ref_out, ref_lse, dtype: str, what: str):
    """Twice the harness tolerances of q's dtype; NaN/Inf positions must match (none expected)."""
    tol = TOLERANCES[dtype]
    out = np.asarray(out, np.float64)
    assert out.shape == ref_out.shape and np.asarray(lse).shape == ref_lse.shape
    c_out = compare(out, ref_out, name="out", rel_tol=2 * tol["out_rel"], cos_tol=1 - 2 * (1 - tol["out_cos"]))
    c_lse = compare(lse, ref_lse, name="lse", abs_tol=2 * tol["lse_abs"])
    assert c_out.ok, f"{what}: {c_out.message}"
    assert c_lse.ok, f"{what}: {c_lse.message}"


def jax_inputs(batch, dtype: str):
    return (
        jnp.asarray(batch.q, JNP_DTYPES[dtype]),
        jnp.asarray(batch.kv_cache, jnp.float8_e4m3fn),
        mla_jax.to_jax_metadata(batch.metadata),
    )


# ----------------------------------------------------------------------------- the test batches


def test_make_fp8_batch():
    batch, k_scale = make_fp8_batch(SCENARIOS["spec_decode_page_16"])
    kv = batch.kv_cache
    assert batch.config.kv_cache_dtype == "fp8_e4m3" and batch.config.is_fp8_kv_cache
    assert kv.dtype == np.float32 and np.isnan(kv).any()  # unreadable slots stay NaN
    as_fp8 = kv.astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(as_fp8.astype(np.float32), kv)  # exactly fp8 values (NaN == NaN here)
    assert np.nanmax(np.abs(kv)) == FP8_E4M3_MAX  # amax / k_scale lands on 448
    assert k_scale == float(np.float32(k_scale)) and 0 < k_scale < 1
    # the NaN pattern is make_batch's: unused blocks and the tails of the last pages
    P = batch.config.page_size
    for r, seq_len in enumerate(batch.scenario.seq_lens):
        last = batch.metadata.block_table[r, (seq_len - 1) // P]
        assert not np.isnan(kv[last, (seq_len - 1) % P]).any()
        if seq_len % P:
            assert np.isnan(kv[last, seq_len % P :]).all()


def test_numpy_reference_fp8_is_the_reference_on_the_dequantized_cache():
    batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference("spec_decode")
    for kv in (batch.kv_cache, batch.kv_cache.astype(ml_dtypes.float8_e4m3fn)):
        out, lse = reference.mla_decode(batch.q, kv, batch.metadata, batch.config, k_scale=k_scale)
        np.testing.assert_array_equal(out, ref_out)
        np.testing.assert_array_equal(lse, ref_lse)
    out, _ = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config, k_scale=np.float32(k_scale))
    np.testing.assert_array_equal(out, ref_out)


# ----------------------------------------------------------------------------- JAX: reference and Triton kernel

TRITON_CASES = [
    ("decode_mixed_lengths", "bfloat16", None),
    ("spec_decode_page_16", "bfloat16", None),
    ("page_size_1", "float16", None),
    ("heads_128_spec", "bfloat16", None),  # the heuristic: 4 head blocks of 32 rows, runs compiled too
    ("heads_128", "float16", None),
    ("spec_decode_page_16", "bfloat16", TritonConfig(block_h=16, block_kv=32, num_parts=3, block_q=2)),
    ("decode_mixed_lengths", "bfloat16", TritonConfig(block_h=16, block_kv=16, num_parts=5, chunk_steps=4)),  # chunks
    # M = 64 rows x 64-row KV steps: right in interpret mode, refused compiled (shared memory: fp8_gpu_reason)
    ("heads_128_spec", "bfloat16", TritonConfig(block_h=64, num_warps=8)),
    ("single_token", "float16", TritonConfig(block_h=16, block_kv=16, num_parts=2)),  # an empty part
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_xla_reference_fp8(name, dtype):
    batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference(name, dtype)
    q, kv, md = jax_inputs(batch, dtype)
    out, lse = mla_jax.mla_decode(q, kv, md, batch.config, impl="xla", k_scale=k_scale)
    assert out.dtype == JNP_DTYPES[dtype] and lse.dtype == jnp.float32
    assert_close(out.astype(jnp.float32), lse, ref_out, ref_lse, dtype, f"xla fp8 {name} {dtype}")


def test_xla_reference_fp8_batch_invariant_path():
    batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference("spec_decode_page_16")
    q, kv, md = jax_inputs(batch, "bfloat16")
    out, lse = mla_jax.mla_decode(q, kv, md, batch.config.replace(batch_invariant=True), impl="xla", k_scale=k_scale)
    assert_close(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", "xla fp8 batch_invariant")


class _TritonFP8Cases:
    interpret: bool

    @pytest.mark.parametrize(
        "name, dtype, tuning", TRITON_CASES, ids=[f"{n}-{d}-{i}" for i, (n, d, _) in enumerate(TRITON_CASES)]
    )
    def test_triton_fp8(self, name, dtype, tuning):
        batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference(name, dtype)
        assert np.isnan(batch.kv_cache).any()  # fp8 NaN in the unreadable slots, to be leaked
        q, kv, md = jax_inputs(batch, dtype)
        q_nope, q_pe = mla_jax.split_q(q, batch.config)
        effective = tuning or pallas_triton.heuristic_config(
            batch.config, md.num_decode_tokens, md.max_blocks, max_query_len=md.max_query_len, num_reqs=md.num_reqs)
        if tuning is None:  # the heuristic's fp8 tiles are the ones that run compiled (H = 128: 4 blocks of 32)
            assert pallas_triton.fp8_gpu_reason(effective) is None and effective.block_h <= 32
        if not self.interpret and pallas_triton.fp8_gpu_reason(effective) is not None:
            # tiles that exceed Triton's shared memory with fp8 on the H200 are refused when compiled
            with pytest.raises(NotImplementedError, match="exceeds Triton's shared memory"):
                pallas_triton.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning=tuning, k_scale=k_scale)
            return
        out, lse = pallas_triton.mla_decode(
            q_nope, q_pe, kv, md, batch.config, tuning=tuning, interpret=self.interpret, k_scale=k_scale
        )
        assert out.dtype == JNP_DTYPES[dtype] and lse.dtype == jnp.float32
        assert_close(out.astype(jnp.float32), lse, ref_out, ref_lse, dtype, f"triton fp8 {name} {dtype} {tuning}")

    def test_traced_k_scale_under_jit(self):
        """k_scale is a traced argument: a new scale reuses the compiled function, and is applied."""
        batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference("spec_decode")
        ref2_out, ref2_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config,
                                                  k_scale=2 * k_scale)
        q, kv, md = jax_inputs(batch, "bfloat16")
        for impl in ("xla", "pallas_triton"):
            fn = jax.jit(
                functools.partial(mla_jax.mla_decode, config=batch.config, impl=impl, interpret=self.interpret)
            )
            out, lse = fn(q, kv, md, k_scale=jnp.float32(k_scale))
            assert_close(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", f"{impl} jit")
            # (a fresh process may trace twice: interpret mode's first run changes JAX's tracing
            # context, as it does for the seed's test_jit_through_api; count from the second run)
            out, lse = fn(q, kv, md, k_scale=jnp.float32(k_scale))
            compiled = fn._cache_size()
            out2, lse2 = fn(q, kv, md, k_scale=jnp.float32(2 * k_scale))
            assert_close(out2.astype(jnp.float32), lse2, ref2_out, ref2_lse, "bfloat16", f"{impl} jit, 2x k_scale")
            assert fn._cache_size() == compiled, f"{impl}: a new k_scale recompiled"


class TestInterpret(_TritonFP8Cases):
    interpret = True


@pytest.mark.gpu
class TestGPU(_TritonFP8Cases):
    interpret = False

    @pytest.fixture(autouse=True)
    def _needs_jax_gpu(self):
        if jax.default_backend() != "gpu":
            pytest.skip(f"JAX has no GPU (default backend {jax.default_backend()!r})")
        reason = pallas_triton.unsupported_reason(MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3"), jax.devices()[0])
        if reason is not None:
            pytest.skip(reason)

    def test_long_sequences_heuristic(self):
        sc = Scenario("long_h16_fp8", seq_lens=(4096, 2500, 17, 8192), query_lens=(1, 2, 1, 2), num_heads=16)
        batch, k_scale = make_fp8_batch(sc, "bfloat16")
        ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config, k_scale=k_scale)
        q, kv, md = jax_inputs(batch, "bfloat16")
        out, lse = mla_jax.mla_decode(q, kv, md, batch.config, impl="pallas_triton", interpret=False, k_scale=k_scale)
        assert_close(out.astype(jnp.float32), lse, ref_out, ref_lse, "bfloat16", "triton fp8 long")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fp8_triton_kernel_lowers_for_an_abstract_h200():
    """The fp8 loads and the float8_e4m3fn -> bf16 conversion go through the Triton lowering."""
    batch, k_scale, _, _ = fp8_batch_and_reference("spec_decode_page_16")
    q, kv, md = jax_inputs(batch, "bfloat16")
    q_nope, q_pe = mla_jax.split_q(q, batch.config)
    def fn(qn, qp, kv, md, s):
        return pallas_triton.mla_decode(qn, qp, kv, md, batch.config, k_scale=s)

    text = lower_for_h200(fn, q_nope, q_pe, kv, md, jnp.float32(k_scale)).as_text()
    assert "__gpu$xla.gpu.triton" in text
    assert "f8E4M3FN" in text


# ----------------------------------------------------------------------------- torch


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["decode_mixed_lengths", "spec_decode_page_16", "page_size_1", "heads_128_spec"])
def test_torch_reference_fp8(name, dtype):
    batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference(name, dtype)
    q = torch.from_numpy(batch.q).to(TORCH_DTYPES[dtype])
    kv = torch.from_numpy(batch.kv_cache).to(torch.float8_e4m3fn)
    for scale in (k_scale, torch.tensor(k_scale, dtype=torch.float32)):
        out, lse = mla_torch.mla_decode(q, kv, batch.metadata, batch.config, k_scale=scale)
        assert out.dtype == TORCH_DTYPES[dtype] and lse.dtype == torch.float32
        assert_close(out.float().numpy(), lse.numpy(), ref_out, ref_lse, dtype, f"torch fp8 {name} {dtype}")


def test_fa3_still_refuses_fp8_with_the_seed_message():
    batch, k_scale, _, _ = fp8_batch_and_reference("single_token")
    q = torch.from_numpy(batch.q).bfloat16()
    kv = torch.from_numpy(batch.kv_cache).to(torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match=FP8_KV_CACHE_MSG):
        mla_torch.mla_decode(q, kv, batch.metadata, batch.config, impl="fa3", k_scale=k_scale)
    # "auto" falls back to the reference, saying why
    impl, skipped = mla_torch.select_impl(batch.config)
    assert impl == "reference" and FP8_KV_CACHE_MSG in skipped["fa3"]


# ----------------------------------------------------------------------------- Mosaic GPU

# (scenario, dtype, tuning): one case a code path and its boundaries (each 4-12 s in interpret mode). H = 16 with up
# to 8 query tokens at page 16 (the heuristic's pick: plain scores)
MOSAIC_FP8_CASES = [
    ("spec_decode_page_16", "bfloat16", None),
    # the next step converted under this one's P @ V (transposed scores of at most 32 rows): H = 16 at q_len 1 (16
    # rows) with 4 splits, at q_len 2 (32 rows) in fp16
    ("decode_mixed_lengths", "bfloat16", dict(num_splits=4, transpose="scores")),
    ("decode_q2_page_32", "float16", dict(num_splits=2, transpose="scores")),
    # P @ V transposed too (transposed_pv): 16 rows with splits, 32 rows
    ("page_size_16", "float16", dict(num_splits=2, transpose="scores_and_pv")),
    ("decode_q2_page_32", "bfloat16", dict(transpose="scores_and_pv")),
    # each warpgroup its own half of a split's steps (kv_halves): 16 rows at page 16 with 2 splits, pages of 64
    # (one step a page) with 3 splits in fp16 (a warpgroup with no step where a split has one), page 8 at H = 8 with
    # q_len 2 (16 rows, two tokens: causal masks), pages of two steps, and each warpgroup's block table past its
    # first chunk (page 8, one split: warpgroup 0 crosses from chunk 0 to 1, warpgroup 1 from 1 to 2)
    ("page_size_16", "bfloat16", dict(num_splits=2, transpose="scores_and_pv", warpgroup_halves=True)),
    ("decode_mixed_lengths", "float16", dict(num_splits=3, transpose="scores_and_pv", warpgroup_halves=True)),
    ("heads_8_q2", "bfloat16", dict(transpose="scores_and_pv", warpgroup_halves=True)),
    ("page_128", "bfloat16", dict(num_splits=2, transpose="scores_and_pv", warpgroup_halves=True)),
    ("long_page_8", "bfloat16", dict(transpose="scores_and_pv", warpgroup_halves=True)),
    # (v_from_ring at 16 rows is compiled only: interpret mode runs V's f16 copies, the kv_halves cases above; its
    # lowering is tested below) kv_halves at 32 rows (H = 16 at q_len 2, H = 32 at q_len 1, H = 8 at q_len 4), where
    # it needs pv_registers (interpret mode: V's copies): 2 splits at page 32 (a q_len-1 request beside q_len-2 ones),
    # H = 32 with 3 splits, H = 8 with four tokens a tile (2 splits)
    ("decode_q2_page_32", "bfloat16", dict(num_splits=2, transpose="scores_and_pv", warpgroup_halves=True, v_from_ring=True, pv_in_flight=1)),
    ("heads_32", "bfloat16", dict(num_splits=3, transpose="scores_and_pv", warpgroup_halves=True, v_from_ring=True)),
    ("heads_8_q4", "bfloat16", dict(num_splits=2, transpose="scores_and_pv", warpgroup_halves=True, v_from_ring=True, pv_in_flight=1)),
    # the default fp8 path at H = 128 (two head tiles a token) with a bf16 q, 2 splits
    ("heads_128", "bfloat16", dict(num_splits=2)),
]


def _case_id(case) -> str:
    """A test id naming the tuning (e.g. page_size_16-float16-transposed_scores-overlap_dequant): -k can pick cases."""
    name, dtype, tuning = case
    fields = [k if v is True else f"{k}={v}" for k, v in (tuning or {}).items()]
    return "-".join([name, dtype] + fields)


def _mosaic_fp8(name, dtype, tuning, interpret):
    from mla_jax import pallas_mosaic_gpu

    batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference(name, dtype)
    q, kv, md = jax_inputs(batch, dtype)
    cfg = None if tuning is None else pallas_mosaic_gpu.MosaicConfig(**tuning)
    out, lse = pallas_mosaic_gpu.mla_decode(q, None, kv, md, batch.config, tuning=cfg, interpret=interpret,
                                            k_scale=k_scale)
    assert out.dtype == JNP_DTYPES[dtype]
    assert_close(out.astype(jnp.float32), lse, ref_out, ref_lse, dtype, f"mosaic fp8 {name} {tuning}")


@pytest.mark.parametrize("name,dtype,tuning", MOSAIC_FP8_CASES, ids=[_case_id(c) for c in MOSAIC_FP8_CASES])
def test_mosaic_gpu_fp8_interpret(name, dtype, tuning):
    """The Mosaic GPU kernel's fp8 path in interpret mode: each compute warpgroup dequantizes its columns of
    the next step; NaN in the unreadable slots (and in the tail of a request's last page) must not leak."""
    pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")
    _mosaic_fp8(name, dtype, tuning, interpret=True)


def test_mosaic_gpu_fp8_no_data_races_and_through_the_api():
    pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as ipc  # no public accessor

    from mla_jax import pallas_mosaic_gpu

    params = pallas_mosaic_gpu.plgpu.InterpretGPUParams(detect_races=True)
    for name, tuning in [("spec_decode_page_16", dict(num_splits=2)),
                         ("page_size_16", dict(num_splits=2, transpose="scores")),
                         ("page_size_16", dict(num_splits=2, transpose="scores_and_pv",
                                               warpgroup_halves=True))]:
        _mosaic_fp8(name, "bfloat16", tuning, interpret=params)
        assert not ipc.get_races().races_found, (name, tuning)
    # through mla_jax.mla_decode, k_scale traced under jit. A bf16 q is converted to f16 inside the same CPU
    # computation as the interpreted kernel (on a small CPU pool that needs mla_jax._cpu_pool's threads).
    for dtype in ("bfloat16", "float16"):
        batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference("single_token", dtype)
        q, kv, md = jax_inputs(batch, dtype)
        fn = jax.jit(lambda q, kv, md, s: mla_jax.mla_decode(q, kv, md, batch.config, impl="pallas_mosaic_gpu",
                                                             interpret=True, k_scale=s))
        out, lse = fn(q, kv, md, jnp.float32(k_scale))
        assert out.dtype == JNP_DTYPES[dtype]
        assert_close(out.astype(jnp.float32), lse, ref_out, ref_lse, dtype, f"mosaic fp8 api jit {dtype}")


def test_auto_picks_the_mosaic_kernel_for_fp8_on_hopper():
    """On Hopper, impl="auto" picks the Mosaic kernel for an fp8 cache (its compiled tests pass on the H200; it is
    1.9x faster than the Triton kernel's fp8 path there)."""
    import types

    from mla_jax import pallas_mosaic_gpu

    batch, k_scale, _, _ = fp8_batch_and_reference("single_token")
    q, kv, md = jax_inputs(batch, "bfloat16")
    hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0")
    assert pallas_mosaic_gpu.unsupported_reason(batch.config, hopper) is None
    impl, skipped = mla_jax.select_impl(batch.config, hopper)
    assert impl == "pallas_mosaic_gpu" and not skipped


def test_mosaic_gpu_fp8_q_beyond_f16_is_not_silently_clamped():
    """The fp8 path runs its wgmmas in f16: a bf16 q entry beyond f16's range (65504) becomes inf, and that
    head's output is not finite (never a silently clamped, plausible-looking result); the others stay right."""
    pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")
    from mla_jax import pallas_mosaic_gpu

    batch, k_scale, ref_out, _ = fp8_batch_and_reference("single_token")
    q, kv, md = jax_inputs(batch, "bfloat16")
    q = q.at[0, 0, 0].set(1e6)
    out, _ = pallas_mosaic_gpu.mla_decode(q, None, kv, md, batch.config, interpret=True, k_scale=k_scale)
    out = np.asarray(out.astype(jnp.float32))
    assert out.dtype == np.float32 and not np.isfinite(out[0, 0]).all()
    assert np.isfinite(out[:, 1:]).all()
    np.testing.assert_allclose(out[:, 1:], np.asarray(ref_out)[:, 1:], rtol=2e-2, atol=2e-2)


def _check_fp8_nan_in_one_head(interpret, **extra):
    """kv_halves merges its two warpgroups' partials column by column: a NaN in token 0's head 3 of q makes that
    head's output and lse NaN and leaves every other head and token right (within the fp8 tolerances). extra:
    more MosaicConfig fields."""
    from mla_jax import pallas_mosaic_gpu

    batch, k_scale, ref_out, ref_lse = fp8_batch_and_reference("page_size_16", "bfloat16")
    q, kv, md = jax_inputs(batch, "bfloat16")
    q = q.at[0, 3, 0].set(jnp.nan)
    tuning = pallas_mosaic_gpu.MosaicConfig(num_splits=2, transpose="scores_and_pv", warpgroup_halves=True,
                                            **extra)
    out, lse = pallas_mosaic_gpu.mla_decode(q, None, kv, md, batch.config, tuning=tuning, interpret=interpret,
                                            k_scale=k_scale)
    out, lse = np.asarray(out.astype(jnp.float32)), np.asarray(lse)
    assert np.isnan(out[0, 3]).all() and np.isnan(lse[0, 3])
    keep = np.ones(out.shape[:2], bool)
    keep[0, 3] = False
    assert np.isfinite(out[keep]).all() and np.isfinite(lse[keep]).all()
    np.testing.assert_allclose(out[keep], np.asarray(ref_out)[keep], rtol=4e-2, atol=4e-2)
    np.testing.assert_allclose(lse[keep], np.asarray(ref_lse)[keep], rtol=2e-3, atol=2e-3)


def test_mosaic_gpu_fp8_kv_halves_nan_in_one_head_stays_in_that_head():
    pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")
    _check_fp8_nan_in_one_head(interpret=True)


@pytest.mark.gpu
def test_mosaic_gpu_fp8_kv_halves_nan_in_one_head_compiled():
    _skip_without_hopper()
    _check_fp8_nan_in_one_head(interpret=False)


@pytest.mark.gpu
def test_mosaic_gpu_fp8_pv_registers_nan_in_one_head_compiled():
    _skip_without_hopper()
    _check_fp8_nan_in_one_head(interpret=False, v_from_ring=True)


@pytest.mark.parametrize("num_heads,tuning", [(16, None), (128, dict(num_splits=2)),
                                              (16, dict(num_splits=1)),
                                              (16, dict(num_splits=1, transpose="scores")),
                                              (16, dict(num_splits=2, transpose="scores")),
                                              (16, dict(num_splits=2, transpose="scores_and_pv")),
                                              # (kv_halves at H = 8: 16 rows at q_len 2, where it runs)
                                              (8, dict(num_splits=2, transpose="scores_and_pv",
                                                       warpgroup_halves=True)),
                                              (8, dict(num_splits=2, transpose="scores_and_pv",
                                                       warpgroup_halves=True, v_from_ring=True)),
                                              # (kv_halves at 32 rows: H = 16 at q_len 2, with pv_registers; one
                                              # split: the bf16 stage)
                                              (16, dict(num_splits=1, transpose="scores_and_pv",
                                                        warpgroup_halves=True, v_from_ring=True, pv_in_flight=1)),
                                              # (H = 128 with one split: the final stage in the output's dtype)
                                              (128, dict(num_splits=1)),
                                              # (H = 64: the plain scores' 64-row tile, a head a row)
                                              (64, dict(num_splits=2)),
                                              (8, None), (8, dict(num_splits=2, transpose="scores"))])
def test_mosaic_gpu_fp8_lowers_for_cuda(num_heads, tuning):
    """The fp8 ring (8 x 64 tiles, 64-byte swizzle), its WGMMA-layout loads and the conversion lower for CUDA."""
    from mla_jax import pallas_mosaic_gpu

    sc = Scenario("lower_fp8", seq_lens=(17, 300), query_lens=(1, 2), num_heads=num_heads, page_size=64)
    batch, k_scale = make_fp8_batch(sc, "bfloat16")
    q, kv, md = jax_inputs(batch, "bfloat16")
    cfg = None if tuning is None else pallas_mosaic_gpu.MosaicConfig(**tuning)
    def fn(q, kv, md, s):
        return pallas_mosaic_gpu.mla_decode(q, None, kv, md, batch.config, tuning=cfg, k_scale=s)

    text = lower_for_h200(fn, q, kv, md, jnp.float32(k_scale)).as_text()
    assert "mosaic_gpu" in text


def _skip_without_hopper():
    from mla_jax import pallas_mosaic_gpu

    if jax.default_backend() != "gpu":
        pytest.skip(f"JAX has no GPU (default backend {jax.default_backend()!r})")
    reason = pallas_mosaic_gpu.unsupported_reason(MLAConfig(num_heads=16), jax.devices()[0])
    if reason is not None:
        pytest.skip(reason)


# the heuristic's kv_halves path (pv_registers) at splits of one step or none (warpgroup 1 idle), without and with
# q_in_kernel
KV_HALVES_ONE_STEP = dict(num_splits=16, transpose="scores_and_pv", warpgroup_halves=True, v_from_ring=True)
COMPILED_FP8_CASES = (MOSAIC_FP8_CASES
                      + [("decode_mixed_lengths", "bfloat16", None), ("heads_128_spec", "bfloat16", None),
                         ("decode_mixed_lengths", "bfloat16", KV_HALVES_ONE_STEP),
                         ("decode_mixed_lengths", "bfloat16", dict(KV_HALVES_ONE_STEP, q_in_kernel=True)),
                         ("spec_decode_page_16", "bfloat16", dict(q_in_kernel=True)),
                         ("heads_128", "bfloat16", dict(num_splits=2, q_in_kernel=True))])


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,tuning", COMPILED_FP8_CASES, ids=[_case_id(c) for c in COMPILED_FP8_CASES])
def test_mosaic_gpu_fp8_compiled(name, dtype, tuning):
    _skip_without_hopper()
    _mosaic_fp8(name, dtype, tuning, interpret=False)


@pytest.mark.parametrize("fields, match", [
    (dict(warpgroup_halves=1), "warpgroup_halves=1"),
    (dict(warpgroup_halves=True), "warpgroup_halves=True .* got transpose='none'"),
    (dict(v_from_ring=1), "v_from_ring=1"),
    (dict(pv_in_flight=0), "pv_in_flight=0"),
    (dict(pv_in_flight=9), "pv_in_flight=9"),
    (dict(pv_in_flight=True), "pv_in_flight=True"),
])
def test_kv_halves_config_is_validated(fields, match):
    from mla_jax.pallas_mosaic_gpu import MosaicConfig

    assert MosaicConfig().warpgroup_halves is False
    with pytest.raises(ValueError, match=match):
        MosaicConfig(**fields)


# _build_kernel's arguments for an fp8 kernel at H = 16 (the kernel-builder tests below vary them)
FP8_BUILD_KW = dict(dtype=jnp.float16, page_size=64, num_tokens=4, heads=16, hp=16, num_h_tiles=1, q_tiles=1,
                    num_reqs=4, num_slots=4, bt_chunk=224, scale_log2=1.0, fp8=True)


def test_kv_halves_paths_are_checked_in_the_kernel_builder():
    """The kernel builder refuses pv_registers without kv_halves or in interpret mode, and kv_halves at 32 rows
    without pv_registers (V's f16 copies do not fit; interpret mode runs them), naming the value."""
    from mla_jax import pallas_mosaic_gpu

    kw = dict(FP8_BUILD_KW, bt_chunk=96, score_rows=16, transposed_pv=True)
    with pytest.raises(ValueError, match="kv_halves=False"):
        pallas_mosaic_gpu._build_kernel(pv_registers=True, **kw)
    with pytest.raises(ValueError, match="interpret=True"):
        pallas_mosaic_gpu._build_kernel(pv_registers=True, kv_halves=True, interpret=True, **kw)
    pallas_mosaic_gpu._build_kernel(pv_registers=True, kv_halves=True, **kw)
    pallas_mosaic_gpu._build_kernel(kv_halves=True, **kw)
    full32 = dict(kw, kv_halves=True, score_rows=32)
    with pytest.raises(ValueError, match="kv_halves at 32 rows .* got pv_registers=False"):
        pallas_mosaic_gpu._build_kernel(**full32)
    pallas_mosaic_gpu._build_kernel(interpret=True, **full32)  # (interpret mode: with the copies)
    pallas_mosaic_gpu._build_kernel(pv_registers=True, **full32)


def _layout_columns(layout, shape=(64, 64)):
    """{(thread, register index): [column of each vector element]} of a Mosaic GPU TiledLayout over `shape` (a
    mirror of TiledLayout.thread_idxs in Python; the rows are checked alike)."""
    tiling = layout.tiling
    strides = tiling.tile_strides(tuple(math.prod(shape[i + 1:]) for i in range(len(shape))))
    tiled_shape = layout.tiled_tiling_shape
    rank = layout.tiled_tiling_rank

    def offset(index, dims):
        sizes = [d.times if isinstance(d, mfa.Replicated) else tiled_shape[d] for d in dims]
        out = 0
        for j, (d, size) in enumerate(zip(dims, sizes)):
            if not isinstance(d, mfa.Replicated):
                out += (index // math.prod(sizes[j + 1:])) % size * strides[-rank:][d]
        return out

    result = {}
    for t in range(128):
        base = offset(t // 32 % 4, layout.warp_dims) + offset(t % 32, layout.lane_dims)
        for idx in np.ndindex(layout.registers_shape(shape)):
            lin = base + sum(i * s for i, s in zip(idx, strides))
            result[t, idx] = [divmod(lin + v * strides[layout.vector_dim], shape[1])
                              for v in range(layout.vector_length)]
    return result


def test_qk_perm_is_the_8bit_layout_seen_as_wgmma():
    """qk_permuted hands the WGMMA_8BIT layout's registers (4 values a piece) to the wgmma as the WGMMA layout's
    (2 a piece, each piece split in two: _rewrap_8bit_as_wgmma): for every thread and register, the element the
    WGMMA layout puts at (r, c) is the 8-bit layout's (r, QK_PERM_64[c]), the permutation q's columns get."""
    from mla_jax import pallas_mosaic_gpu as mg

    src, dst = _layout_columns(mfa.WGMMA_LAYOUT_8BIT), _layout_columns(mfa.WGMMA_LAYOUT)
    seen = {}
    for (t, idx), elems in src.items():
        for s in range(2):
            new = (idx[0], 2 * idx[1] + s, *idx[2:len(mfa.WGMMA_LAYOUT.registers_shape((64, 64)))])
            for (cr, cc), (tr, tc) in zip(dst[t, new], elems[2 * s:2 * s + 2]):
                assert cr == tr
                seen[cc] = seen.get(cc, tc)
                assert seen[cc] == tc
    assert [seen[c] for c in range(64)] == list(mg.QK_PERM_64)
    assert sorted(mg.QK_PERM) == list(range(576)) and list(mg.QK_PERM[:64]) == list(mg.QK_PERM_64)


def test_kv_halves_has_no_effect_where_it_does_not_apply():
    """kv_halves runs at 16 rows with an fp8 cache; a 16-bit cache (or 32 rows) keeps its path: the same results
    bit for bit in interpret mode."""
    pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")
    from mla_jax import pallas_mosaic_gpu as mg
    from parity.scenarios import make_batch

    batch = make_batch(SCENARIOS["page_size_16"], "float16")
    q = jnp.asarray(batch.q, jnp.float16)
    kv = jnp.asarray(batch.kv_cache, jnp.float16)
    md = mla_jax.to_jax_metadata(batch.metadata)
    base = dict(num_splits=2, transpose="scores_and_pv")
    runs = [mg.mla_decode(q, None, kv, md, batch.config, tuning=mg.MosaicConfig(**base, warpgroup_halves=h), interpret=True)
            for h in (False, True)]
    for a, b in zip(*runs):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def _assert_bitwise(name, dtype, tunings):
    """The compiled kernel under each of `tunings` (MosaicConfig fields) gives finite outputs, and the same out and
    lse bit for bit as under the first."""
    from mla_jax import pallas_mosaic_gpu

    batch, k_scale, _, _ = fp8_batch_and_reference(name, dtype)
    q, kv, md = jax_inputs(batch, dtype)
    runs = [pallas_mosaic_gpu.mla_decode(q, None, kv, md, batch.config, k_scale=k_scale,
                                         tuning=pallas_mosaic_gpu.MosaicConfig(**t)) for t in tunings]
    (out_b, lse_b), *others = [(np.asarray(o.astype(jnp.float32)), np.asarray(l)) for o, l in runs]
    assert np.isfinite(out_b).all(), name
    for t, (out_a, lse_a) in zip(tunings[1:], others):
        assert np.isfinite(out_a).all(), (name, t)
        np.testing.assert_array_equal(out_a.view(np.uint32), out_b.view(np.uint32), err_msg=f"{name} {t}")
        np.testing.assert_array_equal(lse_a.view(np.uint32), lse_b.view(np.uint32), err_msg=f"{name} {t}")


# the kv_halves bitwise tests' scenarios (name, dtype, tuning fields): 2 splits at page 16; H = 8 at q_len 2, masks;
# block tables past a chunk at page 8; pages of two steps in fp16
KV_HALVES_BITWISE_SCENARIOS = (("page_size_16", "bfloat16", dict(num_splits=2)), ("heads_8_q2", "bfloat16", {}),
                               ("long_page_8", "bfloat16", {}), ("page_128", "float16", dict(num_splits=2)))
# the heuristic's kv_halves path without pv_registers
QK_PERMUTED_TUNING = dict(transpose="scores_and_pv", warpgroup_halves=True)


@pytest.mark.gpu
def test_mosaic_gpu_fp8_pv_registers_is_bitwise_qk_permuted():
    """pv_registers loads P @ V's left operand from the fp8 slot (V^T by ldmatrix.trans, its rows permuted, the
    output's columns put back by the wrapper; the masked step's tail zeroed in the slot; each chunk's loads a chunk
    ahead) where kv_halves alone reads V's f16 copy: the same products in the same order, the same out and lse bit for bit compiled (2 splits at page 16; H = 8 at q_len 2, masks; block tables
    past a chunk at page 8; pages of two steps in fp16), however many chunks it leaves in flight (pv_wait)."""
    _skip_without_hopper()
    base = QK_PERMUTED_TUNING
    for name, dtype, extra in KV_HALVES_BITWISE_SCENARIOS:
        t = dict(base, **extra)
        _assert_bitwise(name, dtype, [t] + [dict(t, v_from_ring=True, pv_in_flight=d) for d in (1, 2, 4, 8)])


def _assert_option_bitwise_16_and_32_rows(base: dict, option: dict):
    """base and base | option, bit for bit compiled, on the bitwise test's 4 scenarios (16 rows) and at 32 rows (H =
    16 at q_len 2 with a q_len-1 request, 2 splits; H = 8 at q_len 4; one P @ V chunk in flight there)."""
    for name, dtype, extra in KV_HALVES_BITWISE_SCENARIOS + (("decode_q2_page_32", "bfloat16", dict(num_splits=2)),
                                                             ("heads_8_q4", "bfloat16", dict(num_splits=2))):
        t = dict(base, **extra, pv_in_flight=1 if name in ("decode_q2_page_32", "heads_8_q4") else 4)
        _assert_bitwise(name, dtype, [t, dict(t, **option)])


@pytest.mark.gpu
def test_mosaic_gpu_fp8_q_in_kernel_is_bitwise():
    """q_in_kernel converts a bf16 q to f16 inside the kernel (in place in shared memory after its TMA; with
    kv_halves in QK_PERM's column order) where the default converts it in an XLA fusion before the kernel: the same
    rounding, the same out and lse bit for bit compiled. On the heuristic's kv_halves path (16 rows on the bitwise
    test's 4 scenarios, 32 rows on two), kv_halves without pv_registers (V's f16 copies), the one-chain transposed path (warpgroup 0 alone converts) and the plain 64-row scores (H = 128).
    (An fp16 q, in two of the scenarios, has nothing to convert: the option does not run there.)"""
    _skip_without_hopper()
    option = dict(q_in_kernel=True)
    _assert_option_bitwise_16_and_32_rows(dict(QK_PERMUTED_TUNING, v_from_ring=True), option)
    for name, dtype, t in (("page_size_16", "bfloat16", dict(QK_PERMUTED_TUNING, num_splits=2)),
                           ("page_size_16", "bfloat16", dict(num_splits=2, transpose="scores")),
                           ("decode_q2_page_32", "bfloat16", dict(num_splits=2, transpose="scores")),
                           ("heads_128", "bfloat16", dict(num_splits=2)),
                           ("heads_128_spec", "bfloat16", dict(num_splits=1))):
        _assert_bitwise(name, dtype, [t, dict(t, **option)])


@pytest.mark.gpu
def test_mosaic_gpu_fp8_pair_ring_is_bitwise():
    """pair_ring holds each step as 32 rows of two tokens (the cache reshaped to [N, P / 2, 1152], 8 x 128 tiles,
    128-byte swizzle) and reads the scores' K chunks, V^T and the masked step's tail by its own ldmatrix / stmatrix
    addresses, each chunk's tokens in their order: the same values in the same order, the same out and lse bit for
    bit compiled, on the bitwise test's 4 scenarios (pages of 16 and 128: several pages a step, two steps a page; of
    8: the default ring) and at 32 rows; at pages of 64 (a page a step); and with q_in_kernel, as the heuristic picks
    it beside pv_registers at up to Q_IN_KERNEL_MAX_TOKENS tokens (q converted in its own shared memory tile)."""
    _skip_without_hopper()
    base = dict(QK_PERMUTED_TUNING, v_from_ring=True)
    _assert_option_bitwise_16_and_32_rows(base, dict(ring_pairs=True))
    for name, dtype, extra in (("contiguous_blocks", "bfloat16", {}),
                               ("page_size_16", "bfloat16", dict(num_splits=2, q_in_kernel=True))):
        t = dict(base, **extra)
        _assert_bitwise(name, dtype, [t, dict(t, ring_pairs=True)])


def _pair_slot_image() -> np.ndarray:
    """A pair slot's bytes as the TMA writes them (32 pair rows of 1152 bytes, 8 x 128 tiles, Mosaic GPU's 128-byte
    swizzle: a 16-byte unit at byte offset o moves to o ^ (((o // 128) % 8) * 16)), each byte naming its token and
    column as 1000 token + column (token 2 p + b // 576 at pair row p, byte b)."""
    p, b = np.meshgrid(np.arange(32), np.arange(1152), indexing="ij")
    o = ((p // 8) * 9 + b // 128) * 1024 + (p % 8) * 128 + b % 128
    o = o ^ (((o // 128) % 8) * 16)
    img = np.full(o.max() + 1, -1, np.int64)
    img[o] = (2 * p + b // 576) * 1000 + b % 576
    return img


def test_wgmma_8bit_registers_are_the_pair_loads_order():
    """_load_k_pair_fp8 puts ldmatrix call `call`'s matrix mm in register 4 call + mm of a [64, 64] WGMMA_8BIT array
    (flat order) and has it hold rows 8 (mm % 2) .. + 8 of the warp's 16, columns 16 (2 call + mm // 2) .. + 16, a
    thread's 4 bytes at row lane // 4, columns 4 (lane % 4) .. + 3 (ldmatrix's word lane % 4 of line lane // 4):
    jax 0.11.2's layout (its registers' first elements, by the layout's own tile strides, as thread_idxs)."""
    from jax.experimental.mosaic.gpu import fragmented_array as fa

    layout = fa.WGMMA_LAYOUT_8BIT
    strides = layout.tiling.tile_strides((64, 1))
    firsts = [divmod(sum(i * s for i, s in zip(idx, strides)), 64)
              for idx in np.ndindex(layout.registers_shape((64, 64)))]
    assert firsts == [(8 * (k % 4 % 2), 16 * (2 * (k // 4) + k % 4 // 2)) for k in range(8)]
    assert layout.vector_length == 4 and [strides[d] for d in layout.warp_dims] == [16 * 64]
    assert [strides[d] for d in layout.lane_dims] == [64, 4]  # (lane = 4 row + column group)


@pytest.mark.parametrize("chunk", range(9))
def test_pair_ring_lane_offsets_address_the_chunk(chunk):
    """pair_ring's ldmatrix addresses (_k_pair_lane_offset, _vt_pair_lane_offset: the kernel's own arithmetic on
    Python ints) over the pair slot's image, chunk c = 2 i + parity's window starting at tile column i: for every
    thread, the scores' K lines are token 16 w + 8 (mm % 2) + rr's columns 64 c + 16 (2 call + mm // 2) .. + 16
    (lane 8 mm + rr, warp w; the WGMMA_8BIT layout's register order), V^T's key 32 half + 8 m + rr's columns
    64 c + 16 w .. + 16; every line inside the window's 5 + parity tile columns; and each matrix's 8 lines on 8
    different 16-byte bank groups (no conflict)."""
    from mla_jax import pallas_mosaic_gpu as mg

    img, stride = _pair_slot_image(), 9 * 1024
    i, parity = divmod(chunk, 2)
    units = {}
    for tid in range(128):
        lane, w = tid % 32, tid // 32 % 4
        mm, rr = lane // 8, lane % 8
        for call in range(2):
            a = i * 1024 + mg._k_pair_lane_offset(tid, parity, call, stride)
            tok = 16 * w + 8 * (mm % 2) + rr
            want = tok * 1000 + 64 * chunk + 16 * (2 * call + mm // 2) + np.arange(16)
            assert a % 16 == 0 and (a - i * 1024) % stride // 1024 < 5 + parity
            np.testing.assert_array_equal(img[a:a + 16], want, err_msg=f"K {tid=} {call=}")
            units.setdefault(("K", w, call, mm), set()).add(a % 128 // 16)
        if chunk == 8:  # (V^T: the latent's 8 chunks)
            continue
        for half in range(2):
            a = i * 1024 + mg._vt_pair_lane_offset(tid, parity, stride) + 2 * half * stride
            want = (32 * half + 8 * mm + rr) * 1000 + 64 * chunk + 16 * w + np.arange(16)
            assert a % 16 == 0 and (a - i * 1024) % stride // 1024 < 5 + parity
            np.testing.assert_array_equal(img[a:a + 16], want, err_msg=f"V^T {tid=} {half=}")
            units.setdefault(("V", w, half, mm), set()).add(a % 128 // 16)
    assert len(units) == (32 if chunk == 8 else 64) and all(len(u) == 8 for u in units.values())


def test_vt_lane_offsets_address_the_chunk_rows():
    """pv_registers's V^T ldmatrix addresses (_vt_lane_offset, the kernel's own arithmetic on Python ints) over an
    image of the default ring's slot laid out as the TMA writes it (8-key tiles 9 x 512 bytes apart, rows of 64 bytes,
    Mosaic GPU's 64-byte swizzle: a 16-byte unit at byte offset o moves to o ^ (((o // 128) % 4) * 16)): for every
    thread and key half, the 16 bytes a lane's address points at are key 32 half + 8 m + rr's (lane 8 m + rr), columns
    [16 w, 16 w + 16) of the chunk (w: its warp)."""
    from mla_jax import pallas_mosaic_gpu as mg

    tile_stride = 9 * 512  # (the default ring's [.., 8, 9, 8, 64])
    keys, cols = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    o = (keys // 8) * tile_stride + (keys % 8) * 64 + cols
    o = o ^ (((o // 128) % 4) * 16)
    img = np.full(o.max() + 1, -1, np.int64)
    img[o] = keys * 1000 + cols  # (each byte names its key and column)
    for tid in range(128):
        lane, w = tid % 32, tid // 32 % 4
        m, rr = lane // 8, lane % 8
        base = mg._vt_lane_offset(tid, tile_stride)
        for half in range(2):
            a = base + 4 * half * tile_stride
            assert a % 16 == 0
            key = 32 * half + 8 * m + rr
            np.testing.assert_array_equal(img[a:a + 16], key * 1000 + 16 * w + np.arange(16), err_msg=f"{tid=} {half=}")


def test_pair_ring_lowers_where_pv_registers_runs():
    """pair_ring (an abstract H200) lowers on parity.h200's problems: where pv_registers runs (the 16- and
    32-row fp8 kernels) the module with it differs from the one without; elsewhere (B8: pv_registers off; H = 128; a
    16-bit cache) both are the default's. The kernel builder refuses it without pv_registers or at pages of 8 rows
    (where the wrapper runs the default ring), and the config a non-bool."""
    import dataclasses

    from mla_jax import pallas_mosaic_gpu as mg
    from parity import h200 as kernel_hash

    changed = 0
    # the three fp8 problems where pv_registers runs, one where it does not (B8) and a 16-bit cache (each lowering
    # takes seconds: the other problems add no path)
    for problem in [kernel_hash.PROBLEMS[i] for i in (0, 1, 2, 3, 6)]:
        base = kernel_hash.problem_tuning(problem)
        [plain] = kernel_hash.module_texts(problem, tuning=dataclasses.replace(base, ring_pairs=False))
        [text] = kernel_hash.module_texts(problem, tuning=dataclasses.replace(base, ring_pairs=True))
        runs = base.v_from_ring
        assert (text != plain) == runs, problem
        changed += runs
    assert changed >= 3
    kw = dict(FP8_BUILD_KW, score_rows=16, transposed_pv=True, kv_halves=True)
    with pytest.raises(ValueError, match="pair_ring .* pv_registers=False"):
        mg._build_kernel(pair_ring=True, **kw)
    with pytest.raises(ValueError, match="ring_pairs must be a bool"):
        mg.MosaicConfig(ring_pairs=1)
    # (a page of 8 rows: 4 pair rows, half a tile: the builder refuses it, the wrapper runs the default ring there)
    with pytest.raises(ValueError, match="pair_ring .* page_size=8"):
        mg._build_kernel(**dict(kw, page_size=8, pv_registers=True, pair_ring=True))
    problem = kernel_hash.PROBLEMS[0]
    base = kernel_hash.problem_tuning(problem, page=8)
    assert base.v_from_ring
    texts = lambda t: [text for text, _ in kernel_hash.lowered_modules(problem, tuning=t, page=8)]
    assert texts(dataclasses.replace(base, ring_pairs=True)) == texts(dataclasses.replace(base, ring_pairs=False))


def _q_tile_offsets(rows: int) -> np.ndarray:
    """[rows, 1152]: where each byte of q's tile [rows, 576] (16-bit values) sits in its shared-memory image, tiled
    (8, 64) with a 128-byte swizzle, by Mosaic GPU's own formula (fragmented_array.py's transfer_tiled, the TMA's
    layout): a byte at offset o before the swizzle moves to o ^ (((o // 128) % 8) * 16). Written here apart from
    _q_unit_offsets."""
    r, b = np.meshgrid(np.arange(rows), np.arange(576 * 2), indexing="ij")
    c = b // 2
    o = ((r // 8) * 9 + c // 64) * 1024 + (r % 8) * 128 + (c % 64) * 2 + b % 2
    return o ^ (((o // 128) % 8) * 16)


def _q_tile_image(q_bits: np.ndarray) -> np.ndarray:
    """q's tile [rows, 576] of 16-bit words (uint16) -> its shared-memory image (uint8)."""
    img = np.zeros(q_bits.size * 2, np.uint8)
    img[_q_tile_offsets(q_bits.shape[0])] = q_bits.view(np.uint8).reshape(q_bits.shape[0], -1)
    return img


def _q_tile_from_image(img: np.ndarray, rows: int) -> np.ndarray:
    """_q_tile_image's inverse: the image -> [rows, 576] uint16."""
    return np.ascontiguousarray(img[_q_tile_offsets(rows)]).view(np.uint16).reshape(rows, 576)


def _bf16x2_to_f16x2(words: np.ndarray) -> np.ndarray:
    """_BF16X2_TO_F16X2_PTX in numpy: each half of a uint32 word (a bf16) widened to float32 exactly and rounded to
    float16 (nearest even, inf beyond 65504, as cvt.rn.f16x2.f32), the low half's value in the low half."""
    with np.errstate(over="ignore"):  # (inf beyond 65504, as the hardware)
        lo = (words << 16).view(np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
        hi = (words & 0xFFFF0000).view(np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    return (hi << 16) | lo


@pytest.mark.parametrize("rows,wgs", [(16, 2), (32, 2), (16, 1), (64, 1)])
@pytest.mark.parametrize("permute", [False, True])
def test_q_in_kernel_addresses_convert_q_in_place(rows, wgs, permute):
    """The kernel's in-place conversion of q (q_in_kernel), modelled on its own addresses (_q_unit_offsets, the same
    function the kernel's arith ops run) over a shared-memory image laid out by Mosaic GPU's swizzle formula: the
    warpgroups' items (kv_halves: each half the rows; else warpgroup 0 all) touch every 16-byte unit of the tile once,
    and the image then holds q.astype(float16) (the wrapper's conversion, XLA's), in QK_PERM's column order with
    permute; values past f16's range become inf, f16's subnormals round as XLA rounds them. And each 8 consecutive
    items (a quarter warp's 16-byte accesses) fall on 8 different bank groups (no conflict)."""
    from mla_jax import pallas_mosaic_gpu as mg

    rng = np.random.default_rng(rows + wgs)
    q = rng.standard_normal((rows, 576)).astype(np.float32) * np.exp2(rng.integers(-30, 20, (rows, 576)))
    q[0, :4] = [1e5, -7e4, 3e-8, -0.0]  # (inf, -inf, a subnormal, -0)
    q_bf16 = np.asarray(jnp.asarray(q, jnp.bfloat16))
    img = _q_tile_image(q_bf16.view(np.uint16))
    strides = (9 * 512, 512, 64, 1)  # the tiled memref [rows / 8, 9, 8, 64]'s, in elements
    touched = np.zeros(img.size // 16, np.int32)
    per_wg = rows * mg.Q_GROUPS // wgs
    for w in range(wgs):  # (a thread's items in any order: each reads and writes only its own two units)
        for i in range(w * per_wg, (w + 1) * per_wg):
            offs = mg._q_unit_offsets(i, rows, strides)
            words = np.concatenate([img[o:o + 16].view(np.uint32) for o in offs])
            new = _bf16x2_to_f16x2(words)[list(mg.Q_WORD_PERM if permute else range(8))]
            for h, o in enumerate(offs):
                assert o % 16 == 0
                touched[o // 16] += 1
                img[o:o + 16] = new[4 * h:4 * h + 4].view(np.uint8)
    np.testing.assert_array_equal(touched, 1)
    for i0 in range(0, rows * mg.Q_GROUPS, 8):
        units = {(o % 128) // 16 for i in range(i0, i0 + 8) for o in mg._q_unit_offsets(i, rows, strides)[:1]}
        assert len(units) == 8, (i0, units)
    want = np.asarray(jnp.asarray(q_bf16).astype(jnp.float16))
    assert np.isinf(want[0, :2]).all() and want[0, 2] != 0 and abs(want[0, 2]) < 2.0 ** -14  # (inf; a subnormal)
    if permute:
        want = want[:, mg.QK_PERM]
    np.testing.assert_array_equal(_q_tile_from_image(img, rows), want.view(np.uint16))


def test_q_in_kernel_lowers_and_skips_the_wrappers_conversion():
    """q_in_kernel (an abstract H200, no GPU) lowers on 4 fp8 problems of parity.h200, each with 8
    cvt.rn.f16x2.f32 a thread and item (kv_halves: each warpgroup half the tile's rows; else warpgroup 0 all), and
    the jitted call then has no f16 conversion of q before the kernel (the default has one); where it does not run
    (a 16-bit cache, interpret mode) nothing changes; the kernel builder refuses it where it cannot run."""
    import dataclasses
    import re

    from mla_jax import pallas_mosaic_gpu as mg
    from parity import h200 as kernel_hash

    # the fp8 problems of 16 rows with and without v_from_ring, 32 rows, B1's one chain and 64 rows, and a 16-bit
    # cache (problems 1 and 3 add no path here)
    for problem in [kernel_hash.PROBLEMS[i] for i in (0, 2, 4, 5, 6)]:
        heads, batch, seq_len, q_len, fp8 = problem
        base = kernel_hash.problem_tuning(problem)
        on = dataclasses.replace(base, q_in_kernel=True)
        [text] = kernel_hash.module_texts(problem, tuning=on)
        if not fp8:
            assert [text] == kernel_hash.module_texts(problem, tuning=base), problem
            continue
        _, score_rows = mg._kv_halves_runs(base, True, heads, q_len, False)
        rows = score_rows if score_rows < 64 else 64
        wgs = 2 if base.warpgroup_halves else 1
        items = rows * mg.Q_GROUPS // wgs
        assert text.count("cvt.rn.f16x2.f32") == 8 * -(-items // 128) * wgs, problem

    problem = (16, 64, 4096, 2, True)  # (the whole jitted call: q's conversion is an XLA op before the kernel)
    base = kernel_hash.problem_tuning(problem)

    def lowered(tuning):
        fn, args = kernel_hash.abstract_call(problem, tuning=tuning)
        return lower_for_h200(fn, *args).as_text()

    q_f16 = re.compile(r"stablehlo\.convert.*-> tensor<128x16x576xf16>")
    assert q_f16.search(lowered(base))
    assert not q_f16.search(lowered(dataclasses.replace(base, q_in_kernel=True)))
    assert mg._q_in_kernel_runs(dataclasses.replace(base, q_in_kernel=True), True, jnp.bfloat16, False)
    assert not mg._q_in_kernel_runs(dataclasses.replace(base, q_in_kernel=True), True, jnp.float16, False)
    assert not mg._q_in_kernel_runs(dataclasses.replace(base, q_in_kernel=True), True, jnp.bfloat16, True)
    assert not mg._q_in_kernel_runs(dataclasses.replace(base, q_in_kernel=True), False, jnp.bfloat16, False)
    assert not mg._q_in_kernel_runs(base, True, jnp.bfloat16, False)
    with pytest.raises(ValueError, match="q_bits .* interpret=True"):
        mg._build_kernel(q_bits=True, interpret=True, **FP8_BUILD_KW)
    with pytest.raises(ValueError, match="q_bits .* fp8=False"):
        mg._build_kernel(q_bits=True, **dict(FP8_BUILD_KW, fp8=False))
    with pytest.raises(ValueError, match="q_in_kernel must be a bool"):
        mg.MosaicConfig(q_in_kernel=1)


def test_pv_perm_is_ldmatrix_trans_seen_as_wgmma():
    """pv_registers's V^T registers: lane (g, t) of an ldmatrix.trans of 16-bit values gets value g of lines 2 t and
    2 t + 1 of each 8 x 8 matrix (PTX ISA, ldmatrix), here fp8 columns 2 g, 2 g + 1 of keys 2 t, 2 t + 1; its prmt
    and two cvts make the pairs (column 2 g + h; keys 2 t, 2 t + 1) for h = 0, 1, put at the WGMMA layout's register
    [0, j, 0, 0, h, ...] (matrix j's keys): for every thread that register holds V^T's row PV_PERM_16[r] at the
    layout's row r and keys at its columns, and PV_UNPERM undoes the permutation of the output's columns."""
    from mla_jax import pallas_mosaic_gpu as mg

    dst = _layout_columns(mfa.WGMMA_LAYOUT)
    for t in range(128):
        warp, lane = t // 32, t % 32
        g, q = lane // 4, lane % 4
        for j in range(8):
            for h in range(2):
                # the ldmatrix value: keys 8 j + 2 q, + 1 (lines 2 q, 2 q + 1 of matrix j), V column 16 warp + 2 g + h
                want = [(16 * warp + 2 * g + h, 8 * j + 2 * q + e) for e in range(2)]
                got = [(16 * (r // 16) + mg.PV_PERM_16[r % 16], c) for r, c in dst[t, (0, j, 0, 0, h, 0, 0, 0, 0)]]
                assert got == want, (t, j, h)
    assert sorted(mg.PV_PERM) == list(range(512))
    x = np.arange(512)
    np.testing.assert_array_equal(x[mg.PV_PERM][mg.PV_UNPERM], x)


def test_triton_unsupported_reason_for_fp8_devices():
    import types

    cfg = MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3")
    assert pallas_triton.unsupported_reason(cfg) is None
    assert pallas_triton.unsupported_reason(cfg, types.SimpleNamespace(platform="gpu", compute_capability="9.0")) is None
    ampere = types.SimpleNamespace(platform="gpu", compute_capability="8.0")
    assert "8.9" in pallas_triton.unsupported_reason(cfg, ampere)
    assert pallas_triton.unsupported_reason(cfg.replace(kv_cache_dtype="auto"), ampere) is None


# ----------------------------------------------------------------------------- validation


def _entries(batch, k_scale_cast=lambda x: x):
    """name -> fn(k_scale, config, kv_dtype) calling each entry point on the batch."""

    def numpy_entry(k_scale, cfg, kv_dtype):
        return reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, cfg, k_scale=k_scale)

    def torch_entry(k_scale, cfg, kv_dtype):
        kv = torch.from_numpy(batch.kv_cache).to(getattr(torch, kv_dtype))
        return mla_torch.mla_decode(torch.from_numpy(batch.q).bfloat16(), kv, batch.metadata, cfg, k_scale=k_scale)

    def jax_entry(k_scale, cfg, kv_dtype, impl="xla"):
        kv = jnp.asarray(batch.kv_cache, getattr(jnp, kv_dtype))
        return mla_jax.mla_decode(jnp.asarray(batch.q, jnp.bfloat16), kv, batch.metadata, cfg, impl=impl,
                                  interpret=True, k_scale=k_scale)

    return {
        "numpy": numpy_entry,
        "torch": torch_entry,
        "jax_xla": jax_entry,
        "jax_triton": functools.partial(jax_entry, impl="pallas_triton"),
    }


BAD_K_SCALES = [
    (0.0, "k_scale=0.0"),
    (-1.5, "k_scale=-1.5"),
    (float("nan"), "k_scale=nan"),
    (float("inf"), "k_scale=inf"),
    (True, "k_scale=True"),
    ("0.5", "k_scale='0.5'"),
    (np.array([0.5, 0.5], np.float32), r"k_scale.shape=\(2,\)"),
    (np.array(2, np.int32), "k_scale.dtype=int32"),
]


@pytest.mark.parametrize("entry", ["numpy", "torch", "jax_xla", "jax_triton"])
@pytest.mark.parametrize("k_scale, match", BAD_K_SCALES, ids=[m for _, m in BAD_K_SCALES])
def test_bad_k_scale_is_a_value_error_naming_it(entry, k_scale, match):
    batch, _, _, _ = fp8_batch_and_reference("single_token")
    with pytest.raises(ValueError, match=match):
        _entries(batch)[entry](k_scale, batch.config, "float8_e4m3fn")


@pytest.mark.parametrize("entry", ["numpy", "torch", "jax_xla"])
def test_k_scale_needs_an_fp8_cache(entry):
    batch, _, _, _ = fp8_batch_and_reference("single_token")
    auto = batch.config.replace(kv_cache_dtype="auto")
    kv_dtype = "bfloat16"
    with pytest.raises(ValueError, match=r"k_scale applies to an fp8 KV cache only.*k_scale=0.5"):
        _entries(batch)[entry](0.5, auto, kv_dtype)
    _entries(batch)[entry](1.0, auto, kv_dtype)  # the default is fine


def test_traced_k_scale_needs_an_fp8_cache():
    batch, _, _, _ = fp8_batch_and_reference("single_token")
    auto = batch.config.replace(kv_cache_dtype="auto")
    fn = jax.jit(lambda q, kv, s: mla_jax.mla_decode(q, kv, batch.metadata, auto, k_scale=s))
    with pytest.raises(ValueError, match="k_scale=a traced value"):
        fn(jnp.asarray(batch.q, jnp.bfloat16), jnp.asarray(batch.kv_cache, jnp.bfloat16), jnp.float32(1.0))


@pytest.mark.parametrize("entry", ["torch", "jax_xla", "jax_triton"])
def test_cache_dtype_must_match_kv_cache_dtype(entry):
    batch, k_scale, _, _ = fp8_batch_and_reference("single_token")
    run = _entries(batch)[entry]
    with pytest.raises(ValueError, match=r"kv_cache dtype must be float8_e4m3fn with kv_cache_dtype='fp8_e4m3', "
                                         r"got kv_cache.dtype=bfloat16"):
        run(k_scale, batch.config, "bfloat16")
    auto = batch.config.replace(kv_cache_dtype="auto")
    with pytest.raises(ValueError, match=r"got kv_cache.dtype=float8_e4m3fn \(an fp8 cache needs kv_cache_dtype"):
        run(1.0, auto, "float8_e4m3fn")


def test_validate_inputs_accepts_fp8_cache_names_of_both_stacks():
    from mla_spec import build_decode_metadata, dtype_name

    c = MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3")
    md = build_decode_metadata(seq_lens=[4], query_lens=[1], block_table=[[0]], config=c)
    for dt in (torch.float8_e4m3fn, jnp.float8_e4m3fn, np.dtype(ml_dtypes.float8_e4m3fn)):
        validate_inputs(c, md, q_shapes=((1, 16, 576),), q_dtypes=("bfloat16",), kv_cache_shape=(1, 64, 576),
                        kv_cache_dtype=dtype_name(dt))
    with pytest.raises(ValueError, match="got kv_cache.dtype=float8_e5m2"):
        validate_inputs(c, md, q_shapes=((1, 16, 576),), q_dtypes=("bfloat16",), kv_cache_shape=(1, 64, 576),
                        kv_cache_dtype=dtype_name(torch.float8_e5m2))


def test_fp8_gpu_guard_names_the_tile():
    """Compiled fp8 runs the tiles that fit Triton's shared memory on the H200 (parity.fp8_tiles):
    64 rows x 64-row KV steps are refused, naming the tile; 64 x 32 and 32 x 64 run."""
    assert pallas_triton.fp8_gpu_reason(TritonConfig(block_h=16, block_q=2, num_warps=4)) is None
    assert pallas_triton.fp8_gpu_reason(TritonConfig(block_h=32, block_q=1, num_warps=8)) is None
    assert pallas_triton.fp8_gpu_reason(TritonConfig(block_h=64, block_kv=32, num_warps=8)) is None
    reason = pallas_triton.fp8_gpu_reason(TritonConfig(block_h=64, num_warps=8))
    assert "block_h * block_q = 64 rows x block_kv=64" in reason and "head blocks of at most 32 rows" in reason
    assert "interpret mode only" not in reason  # the heuristic runs every head count compiled
    assert "64 rows x block_kv=64" in pallas_triton.fp8_gpu_reason(TritonConfig(block_h=16, block_q=4, num_warps=4))
    batch, k_scale, _, _ = fp8_batch_and_reference("heads_128_spec")
    q, kv, md = jax_inputs(batch, "bfloat16")
    q_nope, q_pe = mla_jax.split_q(q, batch.config)
    with pytest.raises(NotImplementedError, match="64 rows"):
        pallas_triton.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning=TritonConfig(block_h=64, num_warps=8),
                                 interpret=False, k_scale=k_scale)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("batch_invariant", [False, True])
@pytest.mark.parametrize("num_heads", [16, 32, 64, 128])
def test_fp8_heuristic_tiles_run_compiled(num_heads, batch_invariant, dtype):
    """Every tile the heuristic picks for an fp8 cache passes fp8_gpu_reason: head blocks of at most
    32 rows (H = 128: 4 of 32), 8 warps, at any q_len and batch."""
    cfg = MLAConfig(num_heads=num_heads, dtype=dtype, kv_cache_dtype="fp8_e4m3", batch_invariant=batch_invariant)
    for q_len in range(1, 9):
        for num_reqs, max_blocks in ((1, 16), (4, 16), (128, 256)):
            t = pallas_triton.heuristic_config(cfg, q_len * num_reqs, max_blocks, max_query_len=q_len,
                                               num_reqs=num_reqs)
            assert pallas_triton.fp8_gpu_reason(t) is None, (q_len, num_reqs, t)
            assert t.block_h == min(max(num_heads, 16), 32) and t.num_warps == 8
            assert t.block_q == (1 if batch_invariant else min(pallas_triton._next_pow2(q_len), 32 // t.block_h))
    # bf16 keeps its head blocks of 64 (8 warps) at H >= 64
    bf16 = pallas_triton.heuristic_config(cfg.replace(kv_cache_dtype="auto"), 4, 16)
    assert bf16.block_h == min(max(num_heads, 16), 64)


def test_lowered_fp8_kernel_follows_the_tuning():
    """parity.h200's module text (lowered for an abstract H200, no GPU): the same twice in one process, the
    same for the heuristic's tuning passed in, another with another tuning (pv_in_flight=1); the fp8 kernel's wgmmas in
    f16 (its scores M = 64 keys, N = 16 rows), none on e4m3 operands."""
    import dataclasses
    import re

    from parity import h200 as kernel_hash

    problem = (16, 128, 16384, 1, True)
    heuristic = kernel_hash.module_texts(problem)
    assert len(heuristic) == 1 and heuristic == kernel_hash.module_texts(problem)
    base = kernel_hash.problem_tuning(problem)
    assert base.v_from_ring and base.pv_in_flight != 1
    assert kernel_hash.module_texts(problem, tuning=base) == heuristic
    assert kernel_hash.module_texts(problem, tuning=dataclasses.replace(base, pv_in_flight=1)) != heuristic
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n16k16\.f32\.f16\.f16", heuristic[0])
    assert not re.search(r"wgmma\.mma_async[.\w]*\.e4m3", heuristic[0])

