"""The Pallas Mosaic GPU (Hopper) paged-MLA kernel against the float64 reference.

`TestInterpret` runs the kernel on the CPU in Mosaic GPU interpret mode (which
simulates the two warpgroups, the TMA copies, SMEM and the barriers), on small
shapes. `TestGPU` (marked `gpu`) runs every supported parity scenario compiled for
the GPU. Cache slots that no request may read hold NaN (make_batch poisons them):
any leak shows up as a NaN-position mismatch in the comparator.
"""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mla_jax
from mla_jax import pallas_mosaic_gpu as mgpu_mla
from mla_jax.pallas_mosaic_gpu import MosaicConfig, heuristic_config, unsupported_reason
from mla_spec import MLAConfig
from parity.h200 import lower_for_h200
from parity.scenarios import SCENARIOS, Scenario
from kernel_checks import assert_matches, batch_and_reference, device_inputs

pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")


# Small interpret-mode cases: (scenario, dtype, tuning). They cover pages smaller than,
# equal to and larger than the 64-token KV step (16, 64, 128; 8 and 32 too), several
# query tokens packed into one 64-row tile (H=16: 4 tokens per tile) with bottom-right
# causal masking, a request whose q_len spans two tiles (q_len 6 > 4), H=128 (two head
# tiles per token), padded heads (H=20 -> 32), one and several KV splits (with empty
# splits), a multi-step pipeline (more steps than stages) and fp16.
CASES = [
    (Scenario("p16_spec_split2", seq_lens=(8, 100, 200), query_lens=(3, 6, 2), page_size=16), "bfloat16",
     MosaicConfig(num_splits=2)),
    (Scenario("p64_split3", seq_lens=(1, 65, 200), query_lens=(1, 2, 1), page_size=64), "bfloat16",
     MosaicConfig(num_splits=3)),
    (Scenario("heads128_p16", seq_lens=(33, 97), query_lens=(1, 2), num_heads=128, page_size=16), "bfloat16",
     MosaicConfig(num_splits=2)),
    (Scenario("p128_fp16", seq_lens=(65, 200), query_lens=(2, 1), page_size=128), "float16",
     MosaicConfig(num_splits=2)),
    (Scenario("p8_heads8_fp16", seq_lens=(30, 110), query_lens=(1, 3), num_heads=8, page_size=8), "float16",
     MosaicConfig(num_splits=2)),
    (Scenario("unmasked_steps_split2", seq_lens=(300, 9, 64, 129), query_lens=(2, 1, 1, 3), page_size=16),
     "bfloat16", MosaicConfig(num_splits=2)),
    (Scenario("heads64_decode", seq_lens=(70, 130, 1), query_lens=(1, 1, 1), num_heads=64, page_size=64), "float16",
     MosaicConfig(num_splits=2)),
    # padded heads (20 -> 32) with 4 splits, two of them empty for the short request
    (Scenario("heads20_p32_split4", seq_lens=(70, 5), query_lens=(5, 1), num_heads=20, page_size=32), "bfloat16",
     MosaicConfig(num_splits=4)),
    # block tables longer than the staged chunk (BT_CHUNK = 224 pages of 8): splits that begin past
    # chunk 0 reload it at their first step, and steps that cross into the next chunk
    (Scenario("bt_chunks_p8", seq_lens=(2000, 70), query_lens=(1, 2), page_size=8), "bfloat16",
     MosaicConfig(num_splits=3)),
    # transposed scores (S^T = K Q^T over the tile's rows in use): H=16 q_len 1 (16 rows) with splits, q_len
    # up to 3 (48 rows) with several pages a step, H=8 (8 rows) at page 8, H=32 q_len 2 (64 rows: the plain
    # path), fp16
    (Scenario("tscores_decode_split3", seq_lens=(1, 65, 200, 70), query_lens=(1, 1, 1, 1), page_size=64), "bfloat16",
     MosaicConfig(num_splits=3, transpose="scores")),
    (Scenario("tscores_spec_p16", seq_lens=(8, 100, 200), query_lens=(3, 1, 2), page_size=16), "float16",
     MosaicConfig(num_splits=2, transpose="scores")),
    (Scenario("tscores_h8_p8", seq_lens=(30, 110), query_lens=(1, 1), num_heads=8, page_size=8), "bfloat16",
     MosaicConfig(num_splits=1, transpose="scores")),
    (Scenario("tscores_h32_q2_full_tile", seq_lens=(40, 130), query_lens=(2, 1), num_heads=32, page_size=32),
     "bfloat16", MosaicConfig(num_splits=2, transpose="scores")),
    # P @ V transposed too (transpose="scores_and_pv": O^T = V^T P^T, transposed back once per tile): H=16 q_len 1 (16 rows)
    # with splits (fp32 partials), q_len 2 (32 rows) at page 16 in fp16, padded heads; q_len 3 (48
    # rows: no effect, the untransposed P @ V)
    (Scenario("tpv_decode_split3", seq_lens=(1, 65, 200, 70), query_lens=(1, 1, 1, 1), page_size=64), "bfloat16",
     MosaicConfig(num_splits=3, transpose="scores_and_pv")),
    (Scenario("tpv_q2_p16", seq_lens=(8, 100, 200), query_lens=(2, 1, 2), page_size=16), "float16",
     MosaicConfig(num_splits=1, transpose="scores_and_pv")),
    (Scenario("tpv_heads20", seq_lens=(150, 9), query_lens=(1, 1), num_heads=20, page_size=32),
     "bfloat16", MosaicConfig(transpose="scores_and_pv")),
    (Scenario("tpv_q3_no_effect", seq_lens=(8, 100), query_lens=(3, 1), page_size=16), "bfloat16",
     MosaicConfig(num_splits=2, transpose="scores_and_pv")),
    # H=8 (8 tokens a tile), where the heuristic picks both transposed too: q_len 2 (16 rows) at page 8 with
    # splits, q_len 4 (32 rows) with a shorter request
    (Scenario("tpv_h8_q2_p8", seq_lens=(30, 110), query_lens=(2, 2), num_heads=8, page_size=8), "bfloat16",
     MosaicConfig(num_splits=2, transpose="scores_and_pv")),
    (Scenario("tpv_h8_q4_p32", seq_lens=(70, 140), query_lens=(4, 3), num_heads=8, page_size=32), "float16",
     MosaicConfig(num_splits=1, transpose="scores_and_pv")),
]


def _run(batch, dtype, tuning, interpret):
    q_nope, q_pe, kv, md = device_inputs(batch, dtype)
    return mgpu_mla.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning=tuning, interpret=interpret)


# A NaN in one head's q, at 16 rows (H = 16, q_len 1) and 32 (q_len 2 beside q_len 1), with P @ V transposed (its
# transpose back multiplies by an identity, where 0 x NaN would spread the NaN to every row) and without
NAN_HEAD_CASES = [(Scenario("nan_head_q1", seq_lens=(40, 130), query_lens=(1, 1), page_size=16), tpv)
                  for tpv in (True, False)] + [
                 (Scenario("nan_head_q2", seq_lens=(40, 130), query_lens=(2, 1), page_size=16), True)]


# H = 128 with q_len 2 beside q_len 1: 2 head tiles x 2 query tiles a request, and splits between them
HEADS_FASTEST = Scenario("heads_fastest_h128", seq_lens=(33, 97, 520), query_lens=(1, 2, 1), num_heads=128,
                         page_size=64)


# the grid variant: launch_order="heads_first" reorders the grid only (a request's head tiles launched together)
GRID_VARIANTS = [dict(launch_order="heads_first")]
GRID_VARIANT_IDS = ["heads_first"]


def _check_variant_is_the_default_bitwise(variant, interpret, page_size=64, base=None, scenario=HEADS_FASTEST):
    """Every CTA computes what it did with the default config (or `base`), from the same KV, in the same order: out
    and lse are bitwise the default's (with splits; by default H = 128 with q_len 2 beside q_len 1)."""
    base = base or {}
    batch, ref_out, ref_lse = batch_and_reference(dataclasses.replace(scenario, page_size=page_size), "bfloat16")
    runs = [_run(batch, "bfloat16", MosaicConfig(num_splits=2, **base, **v), interpret=interpret)
            for v in ({}, variant)]
    (o1, l1), (o2, l2) = [(np.asarray(o.astype(jnp.float32)), np.asarray(l)) for o, l in runs]
    assert np.array_equal(o1, o2), f"out differs from {base or 'the default'}'s with {variant}"
    assert np.array_equal(l1, l2), f"lse differs from {base or 'the default'}'s with {variant}"
    assert_matches(*runs[1], ref_out, ref_lse, "bfloat16", f"{base} {variant}")


def _check_nan_in_one_head(scenario, transposed_pv, interpret):
    """Token 0's head 3 gets a NaN in q: its output and lse are NaN, every other head and token stays right."""
    batch, ref_out, ref_lse = batch_and_reference(scenario, "bfloat16")
    q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
    q_nope = q_nope.at[0, 3, 0].set(jnp.nan)
    tuning = MosaicConfig(num_splits=2, transpose="scores_and_pv" if transposed_pv else "scores")
    out, lse = mgpu_mla.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning=tuning, interpret=interpret)
    out, lse = np.asarray(out.astype(jnp.float32)), np.asarray(lse)
    assert np.isnan(out[0, 3]).all() and np.isnan(lse[0, 3])
    keep = np.ones(out.shape[:2], bool)
    keep[0, 3] = False
    assert np.isfinite(out[keep]).all() and np.isfinite(lse[keep]).all()
    np.testing.assert_allclose(out[keep], ref_out[keep], rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(lse[keep], ref_lse[keep], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("scenario,transposed_pv", NAN_HEAD_CASES,
                         ids=[f"{c[0].name}-tpv={c[1]}" for c in NAN_HEAD_CASES])
def test_nan_in_one_head_stays_in_that_head(scenario, transposed_pv):
    _check_nan_in_one_head(scenario, transposed_pv, interpret=True)


class TestInterpret:
    @pytest.mark.parametrize("scenario,dtype,tuning", CASES, ids=[c[0].name for c in CASES])
    def test_matches_reference(self, scenario, dtype, tuning):
        batch, ref_out, ref_lse = batch_and_reference(scenario, dtype)
        out, lse = _run(batch, dtype, tuning, interpret=True)
        assert_matches(out, lse, ref_out, ref_lse, dtype, f"{scenario.name} {tuning}")

    @pytest.mark.parametrize("variant", GRID_VARIANTS, ids=GRID_VARIANT_IDS)
    def test_grid_variant_is_the_default_bitwise(self, variant):
        _check_variant_is_the_default_bitwise(variant, interpret=True)

    def test_prebuilt_schedule_gives_the_inline_bits(self, monkeypatch):
        """with_schedule's schedule (built once a batch: the pieces, the kernel's rows and the combine's rows per
        token with it) walked by the call, through mla_jax.mla_decode: the same out and lse bits as the call that
        builds it inline; the call builds none of it itself (the builders raise once the schedule is ahead)."""
        from mla_jax import combine, schedule

        scenario = Scenario("ahead", seq_lens=(700, 9, 64, 1, 130), query_lens=(1, 2, 1, 1, 3), page_size=16)
        batch, ref_out, ref_lse = batch_and_reference(scenario, "bfloat16")
        q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
        tuning = MosaicConfig(num_splits=2)
        inline = mgpu_mla.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning=tuning, interpret=True)
        ahead = mgpu_mla.with_schedule(batch.metadata, batch.config, tuning=tuning)
        sched = ahead.scheduler_metadata
        assert isinstance(sched, schedule.Schedule)
        assert all(x is not None for x in (sched.pieces, sched.token_slots, sched.kernel_rows))
        assert int(np.diff(np.asarray(sched.split_offsets)).max()) > 1  # the long request is cut into pieces

        def built_in_the_call(*args, **kwargs):
            raise AssertionError("the call built a schedule, its pieces or the combine's rows of its own")

        for module, name in ((mgpu_mla, "_schedule"), (mgpu_mla, "slot_pieces"), (mgpu_mla, "_kernel_rows"),
                             (combine, "slot_ranges")):
            monkeypatch.setattr(module, name, built_in_the_call)
        out, lse = mla_jax.mla_decode((q_nope, q_pe), kv, ahead, batch.config, impl="pallas_mosaic_gpu",
                                      tuning=tuning, interpret=True)
        assert_matches(*inline, ref_out, ref_lse, "bfloat16", f"inline {tuning}")
        assert np.array_equal(np.asarray(out, np.float32), np.asarray(inline[0], np.float32))
        assert np.array_equal(np.asarray(lse), np.asarray(inline[1]))

    def test_prebuilt_schedule_for_another_split_count_is_refused(self):
        """A schedule built ahead for another num_splits than the call's (another num_parts), or by another kernel
        (the Triton kernel's per-piece overhead): ValueError naming both, before any kernel runs."""
        from mla_jax import pallas_triton

        scenario = Scenario("ahead", seq_lens=(700, 9, 64), query_lens=(1, 2, 1), page_size=16)
        batch, _, _ = batch_and_reference(scenario, "bfloat16")
        q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
        ahead = mgpu_mla.with_schedule(md, batch.config, tuning=MosaicConfig(num_splits=3))
        with pytest.raises(ValueError, match=r"num_parts=9.*the tuning runs num_parts=6"):
            mgpu_mla.mla_decode(q_nope, q_pe, kv, ahead, batch.config, tuning=MosaicConfig(num_splits=2),
                                interpret=True)
        with pytest.raises(ValueError, match=r"tuning must be a MosaicConfig or None, got tuning=\{'num_splits': 2\}"):
            mgpu_mla.with_schedule(md, batch.config, tuning={"num_splits": 2})
        triton = pallas_triton.with_schedule(md, batch.config,
                                             tuning=pallas_triton.TritonConfig(num_parts=6, block_kv=64))
        with pytest.raises(ValueError, match=r"fixed_overhead=5.*the tuning runs .*fixed_overhead=0"):
            mgpu_mla.mla_decode(q_nope, q_pe, kv, triton, batch.config, tuning=MosaicConfig(num_splits=2),
                                interpret=True)

    def test_heads_first_says_when_the_pieces_overflow_the_z_axis(self, monkeypatch):
        monkeypatch.setattr(mgpu_mla, "MAX_GRID_YZ", 2)
        scenario = Scenario("z_axis", seq_lens=(5, 9, 17), query_lens=(1, 1, 1), page_size=16)
        batch, _, _ = batch_and_reference(scenario, "bfloat16")
        # 3 requests x 1 part: at most 3 + 3 - 1 = 5 pieces (slots), a CTA each
        with pytest.raises(NotImplementedError, match=r"CUDA's z axis \(at most 2\), got 5 x 1 = 5"):
            _run(batch, "bfloat16", MosaicConfig(launch_order="heads_first"), interpret=True)

    def test_deterministic_and_split_invariant(self):
        """Same inputs twice: bitwise-identical out and lse. Split counts agree to rounding."""
        scenario = Scenario("det", seq_lens=(100, 17), query_lens=(2, 1), page_size=16)
        batch, ref_out, ref_lse = batch_and_reference(scenario, "bfloat16")
        runs = [_run(batch, "bfloat16", MosaicConfig(num_splits=2), interpret=True) for _ in range(2)]
        (o1, l1), (o2, l2) = [(np.asarray(o.astype(jnp.float32)), np.asarray(l)) for o, l in runs]
        assert np.array_equal(o1, o2), "out differs between two identical calls"
        assert np.array_equal(l1, l2), "lse differs between two identical calls"
        o3, l3 = _run(batch, "bfloat16", MosaicConfig(num_splits=1), interpret=True)
        assert_matches(o3, l3, ref_out, ref_lse, "bfloat16", "num_splits=1")
        assert np.abs(np.asarray(l3) - l1).max() < 1e-4

    @pytest.mark.parametrize("variant", [{}, dict(transpose="scores"),
                                         dict(transpose="scores_and_pv")],
                             ids=["plain", "scores", "scores_and_pv"])
    def test_no_data_races(self, variant):
        """The interpreter's race detector: the producer (warpgroup 1), the KV ring, P and the hand-offs are
        ordered by their barriers."""
        scenario = Scenario("races", seq_lens=(150, 9), query_lens=(2, 1), page_size=16)
        batch, ref_out, ref_lse = batch_and_reference(scenario, "bfloat16")
        params = mgpu_mla.plgpu.InterpretGPUParams(detect_races=True)
        tuning = MosaicConfig(num_splits=2, **variant)
        out, lse = _run(batch, "bfloat16", tuning, interpret=params)
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", f"races {tuning}")
        from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as ipc  # no public accessor

        assert not ipc.get_races().races_found

    def test_transposed_pv_direct_write_is_the_combines_answer_bitwise(self, monkeypatch):
        """Transposed P @ V (H = 16, q_len 1): a request's only piece writes out and lse directly, except under the
        race detector, where it goes through its fp32 slot and the combine. The two paths give the same bits (the
        combine of one slot divides by 1 and adds log 1)."""
        scenario = Scenario("tpv_direct", seq_lens=(150, 9, 1), query_lens=(1, 1, 1), page_size=16)
        batch, ref_out, ref_lse = batch_and_reference(scenario, "bfloat16")
        tuning = MosaicConfig(num_splits=2, transpose="scores_and_pv")  # the 9- and 1-token requests: one piece
        built = []
        build = mgpu_mla._build_kernel
        mgpu_mla._mla_decode_jit.clear_cache()  # (so that both calls trace, whatever ran before in this process)
        monkeypatch.setattr(mgpu_mla, "_build_kernel",
                            lambda **kw: built.append((kw["transposed_pv"], kw["direct_single"])) or build(**kw))
        direct = _run(batch, "bfloat16", tuning, interpret=True)
        slot = _run(batch, "bfloat16", tuning, interpret=mgpu_mla.plgpu.InterpretGPUParams(detect_races=True))
        assert built == [(True, True), (True, False)]
        assert_matches(*direct, ref_out, ref_lse, "bfloat16", "tpv direct")
        for a, b in zip(direct, slot):
            assert np.array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))

    def test_through_api_jit_and_packed_q(self):
        """mla_jax.mla_decode(impl="pallas_mosaic_gpu") with a packed q, and under an outer jax.jit."""
        scenario = Scenario("api", seq_lens=(20, 66), query_lens=(1, 3), page_size=64)
        batch, ref_out, ref_lse = batch_and_reference(scenario, "bfloat16")
        q = jnp.asarray(batch.q, jnp.bfloat16)
        kv = jnp.asarray(batch.kv_cache, jnp.bfloat16)
        out, lse, impl = mla_jax.mla_decode(
            q, kv, batch.metadata, batch.config, impl="pallas_mosaic_gpu", interpret=True, return_impl=True
        )
        assert impl == "pallas_mosaic_gpu"
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", "api")

        @jax.jit
        def step(q, kv, md):
            return mla_jax.mla_decode(q, kv, md, batch.config, impl="pallas_mosaic_gpu", interpret=True)

        out2, lse2 = step(q, kv, mla_jax.to_jax_metadata(batch.metadata))
        assert_matches(out2, lse2, ref_out, ref_lse, "bfloat16", "api under jit")


class TestGPULowering:
    """Lowers the compiled (non-interpret) kernel for CUDA on the CPU: runs Mosaic GPU's
    own lowering (layout inference, wgmma/TMA operand checks, the SMEM budget) without a GPU."""

    @pytest.mark.parametrize(
        "num_heads,page_size,tuning",
        [
            (16, 16, MosaicConfig(num_splits=1)),
            (128, 64, MosaicConfig(num_splits=2)),
            (16, 128, MosaicConfig(num_splits=3)),
            (8, 8, MosaicConfig(num_splits=2)),
            (128, 64, MosaicConfig(num_splits=1)),
            (32, 64, MosaicConfig(num_splits=1)),
            (16, 16, MosaicConfig(num_splits=2)),
            (8, 128, MosaicConfig(num_splits=3)),
            (16, 16, MosaicConfig(num_splits=2, transpose="scores")),
            (8, 64, MosaicConfig(num_splits=1, transpose="scores")),
            (32, 128, MosaicConfig(num_splits=3, transpose="scores")),
            (16, 16, MosaicConfig(num_splits=2, transpose="scores_and_pv")),
            (16, 64, MosaicConfig(num_splits=1, transpose="scores_and_pv")),
            (8, 8, MosaicConfig(num_splits=2, transpose="scores_and_pv")),
            (128, 64, MosaicConfig(num_splits=2, launch_order="heads_first")),
            (16, 16, MosaicConfig(num_splits=1, transpose="scores_and_pv", launch_order="heads_first")),
        ],
    )
    def test_lowers_for_cuda(self, num_heads, page_size, tuning):
        scenario = Scenario("lower", seq_lens=(17, 300), query_lens=(1, 2), num_heads=num_heads, page_size=page_size)
        batch, _, _ = batch_and_reference(scenario, "bfloat16")
        args = device_inputs(batch, "bfloat16")

        def f(q_nope, q_pe, kv, md):
            return mgpu_mla.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning=tuning, interpret=False)

        # an abstract H200: the slots' combine is a Pallas Triton kernel, whose lowering asks for a GPU
        text = lower_for_h200(f, *args).as_text()
        assert "mosaic_gpu" in text
        assert "mla_combine_slots" in text  # the combine kernel, lowered to Triton


@pytest.mark.parametrize("shape", [(64, 576), (16, 576), (512, 64), (8, 256), (257,), (64, 600)])
def test_tma_windows_cover_the_shape_in_boxes(shape):
    windows = mgpu_mla.tma_windows(shape)
    covered = np.zeros(shape, np.int32)
    for window in windows:
        assert all(0 < n <= mgpu_mla.TMA_MAX_BOX for _, n in window), window
        covered[tuple(slice(s0, s0 + n) for s0, n in window)] += 1
    assert (covered == 1).all()  # each element in exactly one box
    assert len(windows) == np.prod([-(-n // mgpu_mla.TMA_MAX_BOX) for n in shape])


class TestConfig:
    @pytest.mark.parametrize(
        "kwargs,needle",
        [
            (dict(num_splits=0), "num_splits=0"),
            (dict(num_splits=2.0), "num_splits=2.0"),
            (dict(transpose=True), "transpose=True"),
            (dict(transpose="pv"), "transpose='pv'"),
            (dict(launch_order="heads"), "launch_order='heads'"),
            (dict(warpgroup_halves=1), "warpgroup_halves=1"),
            (dict(warpgroup_halves=True, transpose="scores"), "transpose='scores'"),
            (dict(v_from_ring=1), "v_from_ring=1"),
            (dict(pv_in_flight=0), "pv_in_flight=0"),
            (dict(pv_in_flight=9), "pv_in_flight=9"),
            (dict(pv_in_flight=True), "pv_in_flight=True"),
            (dict(ring_pairs="yes"), "ring_pairs='yes'"),
            (dict(q_in_kernel=1), "q_in_kernel=1"),
        ],
    )
    def test_invalid_config(self, kwargs, needle):
        with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
            MosaicConfig(**kwargs)

    @pytest.mark.parametrize("field", ["block_kv", "max_concurrent_steps", "memory_warpgroup", "schedule", "pdl",
                                       "transposed_scores", "transposed_pv", "heads_fastest", "kv_halves",
                                       "pv_registers", "pv_wait", "pair_ring", "lazy_max", "p_in_kv"])
    def test_removed_options_are_unknown_fields(self, field):
        """Options the heuristic never picks are not fields: passing one is a TypeError naming it."""
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{field}'"):
            MosaicConfig(**{field: 1})

    def test_heuristic(self):
        cfg = MLAConfig(num_heads=16, page_size=64)
        big = heuristic_config(cfg, num_tokens=128, max_blocks=256)  # B=128, S=16384: one wave already
        small = heuristic_config(cfg, num_tokens=2, max_blocks=256)  # B=2: split to fill the SMs
        assert isinstance(big, MosaicConfig) and isinstance(small, MosaicConfig)
        assert big.num_splits == 1
        assert 32 <= small.num_splits <= mgpu_mla.MAX_SPLITS  # 2 CTAs x splits fill the 132 SMs
        short = heuristic_config(cfg, num_tokens=1, max_blocks=1)  # one 64-token step: nothing to split
        assert short.num_splits == 1
        assert heuristic_config(cfg, num_tokens=1, max_blocks=16).num_splits == 16  # S=1024: a step per split
        h128 = heuristic_config(MLAConfig(num_heads=128), num_tokens=64, max_blocks=256)
        assert h128.num_splits == 1  # 128 CTAs of 256 steps: one wave
        # B=8, H=128, S=4096: 16 CTAs x 8 splits of 8 steps is one full wave; 7 splits would leave
        # 10-step splits, 9 a second wave
        assert heuristic_config(MLAConfig(num_heads=128), num_tokens=8, max_blocks=64).num_splits == 8
        # transposed scores where a tile uses at most 16 of its 64 rows (H = 16 at q_len 1), or 32 (q_len 2), with
        # P @ V transposed too at 16 and 32 rows
        assert big.transpose == "scores_and_pv" and h128.transpose == "none"
        h16 = MLAConfig(num_heads=16)
        for q_len in (1, 2):
            t = heuristic_config(h16, num_tokens=8 * q_len, max_blocks=4, num_reqs=8, max_query_len=q_len)
            assert t.transpose == "scores_and_pv", q_len
        for q_len in (3, 4, 8):
            t = heuristic_config(h16, num_tokens=8 * q_len, max_blocks=4, num_reqs=8, max_query_len=q_len)
            assert t.transpose == "none", q_len
        # H = 8: 8 rows at q_len 1 (transposed scores, P @ V not: 8 rows is not one of TRANSPOSED_PV_ROWS), 16 at
        # q_len 2 (both), 24 at q_len 3 (neither), 32 at q_len 4 (both)
        h8 = MLAConfig(num_heads=8)
        picks = [heuristic_config(h8, num_tokens=8 * q, max_blocks=4, num_reqs=8, max_query_len=q) for q in (1, 2, 3, 4)]
        assert [t.transpose for t in picks] == ["scores", "scores_and_pv", "none", "scores_and_pv"]
        # an fp8 cache: both transposed at 16 rows, at 32 only with kv_halves (below, long splits; the plain, fused
        # path was faster at 32 rows without it)
        fp8 = MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3")
        picks = [heuristic_config(fp8, num_tokens=8 * q, max_blocks=4, num_reqs=8, max_query_len=q) for q in (1, 2)]
        assert [t.transpose for t in picks] == ["scores_and_pv", "none"]
        # and each warpgroup its half of a split's steps at 16 rows (kv_halves: H = 16 at q_len 1, H = 8 at q_len 2)
        # where a split has two steps or more (B1 S1024: 16 splits of one step, the one-chain path)
        long = [heuristic_config(fp8, num_tokens=8 * q, max_blocks=64, num_reqs=8, max_query_len=q) for q in (1, 2)]
        assert [t.warpgroup_halves for t in long] == [True, False] and not any(t.warpgroup_halves for t in picks)  # (4 steps)
        fp8_h8 = MLAConfig(num_heads=8, kv_cache_dtype="fp8_e4m3")
        assert heuristic_config(fp8_h8, num_tokens=16, max_blocks=64, num_reqs=8, max_query_len=2).warpgroup_halves
        assert not any(heuristic_config(c, num_tokens=8, max_blocks=64, num_reqs=8, max_query_len=1).warpgroup_halves
                       for c in (h16, MLAConfig(num_heads=128, kv_cache_dtype="fp8_e4m3")))
        for b, s, halves in [(1, 1024, False), (8, 4096, True), (128, 16384, True)]:
            t = heuristic_config(fp8, num_tokens=b, max_blocks=s // 64, num_reqs=b, max_query_len=1)
            assert t.warpgroup_halves is halves and (-(-(s // 64) // t.num_splits) >= 2) is halves, (b, s, t)
            # (and P @ V's left operand from the fp8 slot where a split has 32 steps or more: B128 S16384, not B8
            # S4096's 4)
            assert t.v_from_ring is (halves and -(-(s // 64) // t.num_splits) >= 32), (b, s, t)
            assert t.pv_in_flight == 4
            assert t.ring_pairs is t.v_from_ring, (b, s, t)  # (and the cache two tokens a row in the ring, 16 rows)
        b32 = heuristic_config(fp8, num_tokens=32, max_blocks=256, num_reqs=32, max_query_len=1)
        assert b32.warpgroup_halves and b32.v_from_ring and -(-256 // b32.num_splits) >= 32, b32
        assert b32.ring_pairs
        # pair_ring needs pages of a multiple of 16 rows (two tokens a row, whole 8-row tiles): not at page size 8
        assert not heuristic_config(fp8.replace(page_size=8), num_tokens=32, max_blocks=2048, num_reqs=32,
                                    max_query_len=1).ring_pairs
        # kv_halves at 32 rows (H = 16 at q_len 2, H = 32 at q_len 1) where a split has 32 steps or more, always
        # with pv_registers (V's copies do not fit) and one P @ V chunk in flight: B64 S4096 and B128 S16384, not
        # B8 S4096 (4 steps a split); everything transposed there, nothing on the one-chain path
        fp8_c32 = MLAConfig(num_heads=32, kv_cache_dtype="fp8_e4m3")
        for c, q in [(fp8, 2), (fp8_c32, 1)]:
            for b, s, halves in [(8, 4096, False), (64, 4096, True), (128, 16384, True)]:
                t = heuristic_config(c, num_tokens=b * q, max_blocks=s // 64, num_reqs=b, max_query_len=q)
                assert t.warpgroup_halves is halves and (-(-(s // 64) // t.num_splits) >= 32) is halves, (c, b, s, t)
                assert (t.transpose == "scores_and_pv") is t.v_from_ring is halves, (b, s, t)
                assert t.pv_in_flight == (1 if halves else 4), (b, s, t)
                assert not t.ring_pairs, (b, s, t)  # (at 32 rows 0.93x: more spills)
        fp8_h32 = heuristic_config(MLAConfig(num_heads=32, kv_cache_dtype="fp8_e4m3"), num_tokens=4, max_blocks=4)
        assert fp8_h32.transpose == "none"
        # without max_query_len: one token a request (tokens <= requests) or not
        assert heuristic_config(h16, num_tokens=8, max_blocks=4, num_reqs=8).transpose != "none"
        assert heuristic_config(h16, num_tokens=16, max_blocks=4, num_reqs=8).transpose == "none"
        # H = 32 at q_len 1: 32 rows, both transposed (the tile of H = 16 at q_len 2); H = 64: the plain path
        h32 = heuristic_config(MLAConfig(num_heads=32), num_tokens=4, max_blocks=4)
        assert h32.transpose == "scores_and_pv"
        assert heuristic_config(MLAConfig(num_heads=64), num_tokens=4, max_blocks=4).transpose == "none"
        # a request's head tiles launched together wherever there are several, and the pieces x query tiles fit
        # CUDA's z axis (R requests of one part each: at most 2 R - 1 pieces)
        assert [t.launch_order for t in (h128, big, h32)] == ["heads_first", "requests_first", "requests_first"]
        h128_cfg = MLAConfig(num_heads=128)
        z = mgpu_mla.MAX_GRID_YZ
        order = lambda tokens, reqs, q_len: heuristic_config(h128_cfg, num_tokens=tokens, max_blocks=4, num_reqs=reqs,
                                                             max_query_len=q_len).launch_order
        r = (z + 1) // 2
        assert order(r, r, 1) == "heads_first"
        assert order(r + 1, r + 1, 1) == "requests_first"
        assert order(2 * (r // 2), r // 2, 2) == "heads_first"
        assert order(2 * (r // 2 + 1), r // 2 + 1, 2) == "requests_first"

    def test_metadata_caps_splits(self):
        scenario = Scenario("cap", seq_lens=(150,), query_lens=(1,), page_size=16)
        batch, ref_out, ref_lse = batch_and_reference(scenario, "bfloat16")
        q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
        md = md.replace(max_num_splits=1)
        out, lse = mgpu_mla.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning=MosaicConfig(num_splits=4),
                                       interpret=True)
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", "max_num_splits=1")


class TestUnsupported:
    @pytest.mark.parametrize("page_size", [8, 16, 32, 64, 128, 256])
    def test_supported_page_sizes(self, page_size):
        assert unsupported_reason(MLAConfig(num_heads=16, page_size=page_size)) is None

    @pytest.mark.parametrize("page_size", [1, 3, 24, 48, 96])
    def test_unsupported_page_sizes(self, page_size):
        reason = unsupported_reason(MLAConfig(num_heads=16, page_size=page_size))
        assert reason is not None and f"page_size={page_size}" in reason

    def test_config_reasons(self):
        assert "kv_lora_rank=256" in unsupported_reason(MLAConfig(num_heads=16, kv_lora_rank=256))
        assert "qk_rope_head_dim=32" in unsupported_reason(MLAConfig(num_heads=16, qk_rope_head_dim=32))
        assert "float32" in unsupported_reason(MLAConfig(num_heads=16, dtype="float32"))
        assert unsupported_reason(MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3")) is None
        hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0")
        assert unsupported_reason(MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3"), hopper) is None
        assert unsupported_reason(MLAConfig(num_heads=16, dtype="float16")) is None
        assert unsupported_reason(MLAConfig(num_heads=20)) is None  # heads are padded

    def test_device_reasons(self):
        cfg = MLAConfig(num_heads=16)
        cpu = types.SimpleNamespace(platform="cpu")
        ampere = types.SimpleNamespace(platform="gpu", compute_capability="8.0")
        hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0")
        assert "platform='cpu'" in unsupported_reason(cfg, cpu)
        assert "8.0" in unsupported_reason(cfg, ampere)
        assert unsupported_reason(cfg, hopper) is None
        assert unsupported_reason(cfg, None) is None

    def test_mla_decode_refuses_unsupported(self):
        scenario = SCENARIOS["page_size_1"]
        batch, _, _ = batch_and_reference(scenario, "bfloat16")
        q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
        with pytest.raises(NotImplementedError, match="page_size=1"):
            mgpu_mla.mla_decode(q_nope, q_pe, kv, md, batch.config, interpret=True)

    def test_bad_tuning_type(self):
        scenario = Scenario("t", seq_lens=(5,), query_lens=(1,), page_size=16)
        batch, _, _ = batch_and_reference(scenario, "bfloat16")
        q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
        with pytest.raises(ValueError, match="tuning"):
            mgpu_mla.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning={"num_splits": 2}, interpret=True)


def _hopper_reason() -> str | None:
    try:
        dev = jax.devices()[0]
    except RuntimeError as e:  # pragma: no cover
        return str(e)
    if dev.platform != "gpu":
        return f"JAX has no GPU (platform={dev.platform!r})"
    return unsupported_reason(MLAConfig(num_heads=16), dev)


@pytest.mark.gpu
class TestGPU:
    """Every parity scenario the kernel supports, compiled for a Hopper GPU."""

    @pytest.fixture(autouse=True)
    def _needs_hopper(self):
        reason = _hopper_reason()
        if reason is not None:
            pytest.skip(reason)

    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    @pytest.mark.parametrize("name", sorted(SCENARIOS))
    @pytest.mark.parametrize("splits", [None, 3], ids=["heuristic", "splits3"])
    def test_scenario(self, name, dtype, splits):
        scenario = SCENARIOS[name]
        reason = unsupported_reason(scenario.config(dtype))
        if reason is not None:
            pytest.skip(reason)
        batch, ref_out, ref_lse = batch_and_reference(scenario, dtype)
        tuning = None if splits is None else MosaicConfig(num_splits=splits)
        out, lse = _run(batch, dtype, tuning, interpret=False)
        assert_matches(out, lse, ref_out, ref_lse, dtype, f"{name} splits={splits}")

    @pytest.mark.parametrize("scenario,dtype,tuning", CASES, ids=[c[0].name for c in CASES])
    def test_interpret_cases_on_gpu(self, scenario, dtype, tuning):
        batch, ref_out, ref_lse = batch_and_reference(scenario, dtype)
        out, lse = _run(batch, dtype, tuning, interpret=False)
        assert_matches(out, lse, ref_out, ref_lse, dtype, f"{scenario.name} {tuning}")

    @pytest.mark.parametrize("variant", [dict(transpose="scores"),
                                         dict(transpose="scores_and_pv")],
                             ids=["scores", "scores_and_pv"])
    @pytest.mark.parametrize("name", sorted(SCENARIOS))
    def test_scenario_other_layouts(self, name, variant):
        scenario = SCENARIOS[name]
        reason = unsupported_reason(scenario.config("bfloat16"))
        if reason is not None:
            pytest.skip(reason)
        batch, ref_out, ref_lse = batch_and_reference(scenario, "bfloat16")
        out, lse = _run(batch, "bfloat16", MosaicConfig(num_splits=3, **variant), interpret=False)
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", f"{name} {variant}")

    @pytest.mark.parametrize("scenario,transposed_pv", NAN_HEAD_CASES,
                             ids=[f"{c[0].name}-tpv={c[1]}" for c in NAN_HEAD_CASES])
    def test_nan_in_one_head_stays_in_that_head(self, scenario, transposed_pv):
        _check_nan_in_one_head(scenario, transposed_pv, interpret=False)

    @pytest.mark.parametrize("variant", GRID_VARIANTS, ids=GRID_VARIANT_IDS)
    @pytest.mark.parametrize("page_size", [16, 64, 128])
    def test_grid_variant_is_the_default_bitwise(self, variant, page_size):
        _check_variant_is_the_default_bitwise(variant, interpret=False, page_size=page_size)

    @pytest.mark.parametrize("variant", [{}, dict(transpose="scores")], ids=["plain", "scores"])
    def test_deterministic(self, variant):
        batch, _, _ = batch_and_reference(SCENARIOS["spec_decode"], "bfloat16")
        tuning = MosaicConfig(num_splits=3, **variant)
        (o1, l1), (o2, l2) = [_run(batch, "bfloat16", tuning, False) for _ in range(2)]
        assert np.array_equal(np.asarray(o1.astype(jnp.float32)), np.asarray(o2.astype(jnp.float32)))
        assert np.array_equal(np.asarray(l1), np.asarray(l2))


@pytest.mark.parametrize(
    "config, expected, why",
    [
        (MLAConfig(num_heads=128, page_size=64), "pallas_mosaic_gpu", None),
        (MLAConfig(num_heads=16, page_size=1), "pallas_triton", "page_size=1"),
        (MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3"), "pallas_mosaic_gpu", None),
        (MLAConfig(num_heads=16, batch_invariant=True), "pallas_triton", "batch_invariant"),
        (MLAConfig(num_heads=16, dtype="float32"), "pallas_triton", "float32"),
    ],
)
def test_jax_auto_on_hopper_prefers_mosaic_then_triton_and_says_why(config, expected, why):
    hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0")
    impl, skipped = mla_jax.select_impl(config, hopper)
    assert impl == expected
    if why is not None:
        assert why in skipped["pallas_mosaic_gpu"]
    ampere = types.SimpleNamespace(platform="gpu", compute_capability="8.0")
    impl, skipped = mla_jax.select_impl(MLAConfig(num_heads=16), ampere)
    assert impl == "pallas_triton" and "9.x" in skipped["pallas_mosaic_gpu"]


def test_direct_call_rejects_a_q_that_is_not_576_wide():
    batch, _, _ = batch_and_reference(SCENARIOS["single_token"], "bfloat16")
    q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
    with pytest.raises(ValueError, match=r"q must be \[T, H, 576\].*q.shape=\(1, 16, 512\)"):
        mgpu_mla.mla_decode(q_nope, None, kv, md, batch.config, interpret=True)
