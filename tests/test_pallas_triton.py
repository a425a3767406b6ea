"""The Pallas Triton paged-MLA kernel: what the shared cases (tests/cases.py, run by
tests/test_implementations.py with the heuristic's tuning) do not reach.

Against the float64 reference: explicit tunings, page sizes that are not powers of two,
random batches, garbage block-table padding, the kernel under jax.jit and with bad traced
metadata, packed q. `TestInterpret` runs them on the CPU in interpret mode; `TestGPU`
(marked `gpu`) compiled through the Triton lowering on a GPU. Cache slots that no request
may read hold NaN (make_batch poisons them): any leak shows up as a NaN-position mismatch
in the comparator. Then the Triton lowering for an abstract H200, the config, the
heuristic and the support checks.
"""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mla_jax
from mla_jax import combine, pallas_triton, schedule
from mla_jax.pallas_triton import TritonConfig, heuristic_config, unsupported_reason
from mla_spec import MLAConfig, build_decode_metadata, reference
from parity.h200 import lower_for_h200
from parity.scenarios import SCENARIOS, Scenario, make_batch, random_scenario
from kernel_checks import assert_matches, batch_and_reference, device_inputs


# Page sizes that are not powers of two: rows are gathered one by one through the block table.
ODD_PAGE_SCENARIOS = {
    s.name: s
    for s in [
        Scenario("page_size_3", seq_lens=(1, 7, 40, 130), query_lens=(1, 3, 8, 2), page_size=3),
        Scenario("page_size_48", seq_lens=(47, 48, 49, 200), query_lens=(1, 2, 1, 5), page_size=48, num_heads=8),
    ]
}

# (scenario, tuning): block_kv below and above the page size, one part (one program walks every request) and
# several, chunk mode, grouped query tokens (block_q), padded head blocks, empty parts (seq_len 1 over 2 parts).
# Every variant keeps M = block_q * block_h <= 64 so that it also fits a GPU.
TUNING_VARIANTS = [
    ("spec_decode", TritonConfig(block_h=16, block_kv=16, num_parts=1, block_q=1)),  # block_kv < page 64
    ("spec_decode_page_16", TritonConfig(block_h=16, block_kv=64, num_parts=3, block_q=2)),  # block_kv > page 16
    ("decode_mixed_lengths", TritonConfig(block_h=32, block_kv=32, num_parts=8)),  # 16 heads in a 32 block
    ("heads_128_spec", TritonConfig(block_h=16, block_kv=32, num_parts=2, chunk_steps=2, block_q=2)),  # 8 head blocks
    ("page_size_1", TritonConfig(block_h=16, block_kv=32, num_parts=4, block_q=2)),
    ("heads_128", TritonConfig(block_h=64, block_kv=32, num_parts=3, chunk_steps=3, num_warps=8)),
    ("single_token", TritonConfig(block_h=16, block_kv=16, num_parts=2)),  # the second part is empty
]


# Ragged batches: one long request among short ones, lengths at multiples of 64 and one off either side (block_kv
# 64: step boundaries), q_len 1-3 mixed. Tunings: the heuristic's (132 parts), balanced cuts over a few parts, chunk
# mode, and one part (a single program walks every request).
RAGGED_SCENARIOS = [
    Scenario("one_long_among_short", seq_lens=(5, 1, 700, 12, 64, 63, 65, 128), query_lens=(1, 1, 2, 3, 1, 1, 3, 1),
             page_size=16),
    Scenario("multiples_of_64", seq_lens=(127, 128, 129, 191, 192, 193, 2), query_lens=(3, 1, 2, 1, 3, 2, 2),
             page_size=16),
]
RAGGED_TUNINGS = [
    None,
    TritonConfig(block_kv=64, num_parts=5, block_q=4),
    TritonConfig(block_kv=16, num_parts=7, chunk_steps=3),
    TritonConfig(block_kv=64, num_parts=1, block_q=2),
]


def _ragged_random(seed: int) -> Scenario:
    """Short random requests and one long one at a random place, q_len 1-3."""
    rng = np.random.default_rng(500 + seed)
    seq = [int(x) for x in rng.integers(1, 90, size=6)]
    seq.insert(int(rng.integers(0, 7)), int(rng.integers(400, 900)))
    q = [int(min(x, s)) for x, s in zip(rng.integers(1, 4, size=7), seq)]
    return Scenario(f"ragged_random_{seed}", tuple(seq), tuple(q), page_size=int(rng.choice([1, 16, 48])))


def _slots_per_request(md, tuning: TritonConfig) -> np.ndarray:
    """How many pieces (partials) the kernel's schedule gives each request of `md` under `tuning`."""
    qsl = np.asarray(md.query_start_loc)
    chunk = tuning.chunk_steps or None
    sched = schedule.mla_schedule(np.asarray(md.seq_lens), np.diff(qsl), num_parts=tuning.num_parts,
                                  block_kv=tuning.block_kv, chunk_steps=chunk,
                                  max_steps=-(-md.max_seq_len // tuning.block_kv) if chunk else None)
    return np.diff(np.asarray(sched.split_offsets))


def _poison_past(kv_cache: np.ndarray, md, seq_lens) -> np.ndarray:
    """A copy of the cache with NaN in every slot of md's pages at or past seq_lens[r]."""
    kv = kv_cache.copy()
    P = kv.shape[1]
    for r, seq_len in enumerate(seq_lens):
        row = np.asarray(md.block_table)[r]
        pos = np.arange(seq_len, -(-int(np.asarray(md.seq_lens)[r]) // P) * P)
        kv[row[pos // P], pos % P] = np.nan
    return kv


class _KernelCases:
    """Cases shared by interpret mode (CPU) and the compiled kernel (GPU)."""

    interpret: bool

    def run(self, scenario: Scenario, dtype: str, tuning: TritonConfig | None = None, seed: int = 0):
        batch, ref_out, ref_lse = batch_and_reference(scenario, dtype, seed)
        assert np.isnan(batch.kv_cache).any()  # the poison is there to be leaked
        q_nope, q_pe, kv_cache, md = device_inputs(batch, dtype)
        out, lse = pallas_triton.mla_decode(
            q_nope, q_pe, kv_cache, md, batch.config, tuning=tuning, interpret=self.interpret
        )
        assert_matches(out, lse, ref_out, ref_lse, dtype, f"{scenario.name} {dtype} {tuning}")

    @pytest.mark.parametrize(
        "name, tuning", TUNING_VARIANTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(TUNING_VARIANTS)]
    )
    def test_tuning_variant(self, name, tuning):
        self.run(SCENARIOS[name], "bfloat16", tuning)

    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    @pytest.mark.parametrize("name", list(ODD_PAGE_SCENARIOS))
    def test_page_size_not_power_of_two(self, name, dtype):
        self.run(ODD_PAGE_SCENARIOS[name], dtype)

    def test_page_size_3_with_parts_and_small_block_kv(self):
        self.run(ODD_PAGE_SCENARIOS["page_size_3"], "bfloat16", TritonConfig(block_h=16, block_kv=16, num_parts=3))

    @pytest.mark.parametrize("seed", range(3))
    def test_random_batches(self, seed):
        rng = np.random.default_rng(100 + seed)
        sc = random_scenario(
            rng, num_heads=int(rng.choice([4, 16, 32])), page_size=int(rng.choice([1, 3, 16, 48])), max_seq=260
        )
        self.run(sc, "bfloat16", seed=seed)

    @pytest.mark.parametrize("tuning", RAGGED_TUNINGS, ids=["heuristic", "parts5", "chunks", "one_part"])
    @pytest.mark.parametrize("scenario", RAGGED_SCENARIOS, ids=lambda s: s.name)
    def test_ragged_batches(self, scenario, tuning):
        batch, _, _ = batch_and_reference(scenario, "bfloat16")
        effective = tuning or heuristic_config(batch.config, batch.q.shape[0], batch.metadata.max_blocks,
                                               max_query_len=batch.metadata.max_query_len)
        slots = _slots_per_request(batch.metadata, effective)
        assert slots.min() == 1 and (slots.max() > 1 or effective.num_parts == 1)  # the long requests are split
        self.run(scenario, "bfloat16", tuning)

    @pytest.mark.parametrize("seed", range(2))
    def test_ragged_random_batches(self, seed):
        sc = _ragged_random(seed)
        tuning = TritonConfig(block_kv=32, num_parts=6, chunk_steps=4 if seed else 0, block_q=4)
        assert _slots_per_request(batch_and_reference(sc, "bfloat16")[0].metadata, tuning).max() > 1
        self.run(sc, "bfloat16", tuning, seed=seed)

    def test_new_lengths_reuse_the_compiled_call(self):
        """Two batches of the same shapes (requests, tokens, block-table width, static ints) and other lengths: one
        trace, one compile; each against the float64 reference, with NaN in every slot past its lengths."""
        batch, ref_out, ref_lse = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
        cfg, md = batch.config, batch.metadata
        short = np.asarray([5, 1, 12, 12, 64, 17, 65, 100], np.int32)  # the long request is short here
        assert (short <= np.asarray(md.seq_lens)).all()  # in the same pages
        md2 = md.replace(seq_lens=short)
        kv2 = _poison_past(batch.kv_cache, md, short)
        ref2_out, ref2_lse = reference.mla_decode(batch.q, kv2, md2, cfg)
        traces = []

        def decode(q, kv, md):
            traces.append(1)  # runs only while tracing
            return pallas_triton.mla_decode(q, None, kv, md, cfg, interpret=self.interpret)

        fn = jax.jit(decode)
        q = jnp.asarray(batch.q, jnp.bfloat16)
        for kv, m, want_out, want_lse in ((batch.kv_cache, md, ref_out, ref_lse), (kv2, md2, ref2_out, ref2_lse)):
            out, lse = fn(q, jnp.asarray(kv, jnp.bfloat16), mla_jax.to_jax_metadata(m))
            assert_matches(out, lse, want_out, want_lse, "bfloat16", f"seq_lens={np.asarray(m.seq_lens)}")
        assert len(traces) == 1 and fn._cache_size() == 1

    @pytest.mark.parametrize("chunk_steps", [0, 2], ids=["balanced", "chunks"])
    def test_prebuilt_schedule_gives_the_inline_bits(self, chunk_steps, monkeypatch):
        """with_schedule's schedule (built once a batch) walked by the call, through mla_jax.mla_decode (NumPy
        metadata: to_jax_metadata keeps the schedule): the same out and lse bits as the call that builds it inline;
        the call builds none itself (its builder raises once the schedule is ahead), nor the combine's rows per
        token (built with the schedule)."""
        batch, ref_out, ref_lse = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
        cfg = batch.config
        q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
        tuning = TritonConfig(block_kv=32, num_parts=5, chunk_steps=chunk_steps, block_q=4)
        assert _slots_per_request(batch.metadata, tuning).max() > 1  # the long request is split
        inline = pallas_triton.mla_decode(q_nope, q_pe, kv, md, cfg, tuning=tuning, interpret=self.interpret)
        ahead = pallas_triton.with_schedule(batch.metadata, cfg, tuning=tuning)
        assert isinstance(ahead.scheduler_metadata, schedule.Schedule)

        def no_inline_schedule(*args, **kwargs):
            raise AssertionError("the call built a schedule of its own")

        monkeypatch.setattr(pallas_triton, "_schedule", no_inline_schedule)
        monkeypatch.setattr(combine, "slot_ranges", no_inline_schedule)
        out, lse = mla_jax.mla_decode((q_nope, q_pe), kv, ahead, cfg, impl="pallas_triton", tuning=tuning,
                                      interpret=self.interpret)
        assert_matches(*inline, ref_out, ref_lse, "bfloat16", f"inline {tuning}")
        assert np.array_equal(np.asarray(out, np.float32), np.asarray(inline[0], np.float32))
        assert np.array_equal(np.asarray(lse), np.asarray(inline[1]))

    def test_prebuilt_schedule_new_lengths_reuse_the_compiled_call(self):
        """Schedules built ahead for two batches of the same shapes and other lengths: the jitted call traces and
        compiles once (the schedule's static fields follow the shapes, not the lengths), and so does the builder;
        each result matches the float64 reference, with NaN in every slot past its lengths."""
        batch, ref_out, ref_lse = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
        cfg, md = batch.config, batch.metadata
        short = np.asarray([5, 1, 12, 12, 64, 17, 65, 100], np.int32)
        assert (short <= np.asarray(md.seq_lens)).all()  # in the same pages
        md2 = md.replace(seq_lens=short)
        kv2 = _poison_past(batch.kv_cache, md, short)
        ref2_out, ref2_lse = reference.mla_decode(batch.q, kv2, md2, cfg)
        tuning = TritonConfig(block_kv=64, num_parts=3, block_q=4)
        traces = []

        def decode(q, kv, md):
            traces.append(1)  # runs only while tracing
            return pallas_triton.mla_decode(q, None, kv, md, cfg, tuning=tuning, interpret=self.interpret)

        fn = jax.jit(decode)
        q = jnp.asarray(batch.q, jnp.bfloat16)
        builds = []
        for kv, m, want_out, want_lse in ((batch.kv_cache, md, ref_out, ref_lse), (kv2, md2, ref2_out, ref2_lse)):
            ahead = pallas_triton.with_schedule(mla_jax.to_jax_metadata(m), cfg, tuning=tuning)
            builds.append(pallas_triton._schedule_jit._cache_size())
            out, lse = fn(q, jnp.asarray(kv, jnp.bfloat16), ahead)
            assert_matches(out, lse, want_out, want_lse, "bfloat16", f"seq_lens={np.asarray(m.seq_lens)}")
        assert len(traces) == 1 and fn._cache_size() == 1
        assert builds[0] == builds[1]  # the second batch's schedule reuses the builder's compiled program

    @pytest.mark.parametrize("chunk_steps", [0, 2], ids=["balanced", "chunks"])
    def test_padding_requests_give_zero_and_minus_inf(self, chunk_steps):
        """A bucket's padding rows: seq_len 0 with a token (its out 0, lse -inf) and q_len 0 (no token); the other
        requests are unchanged."""
        batch, ref_out, ref_lse = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
        md = batch.metadata
        qsl, seq, bt = (np.asarray(x) for x in (md.query_start_loc, md.seq_lens, md.block_table))
        # request 3 becomes padding (seq_len 0, its tokens stay), and a q_len-0 row goes in before request 1
        seq = seq.copy()
        seq[3] = 0
        padded = md.replace(query_start_loc=np.insert(qsl, 1, qsl[1]), seq_lens=np.insert(seq, 1, 700),
                            block_table=np.insert(bt, 1, bt[2], axis=0))
        q_nope, q_pe, kv, _ = device_inputs(batch, "bfloat16")
        tuning = TritonConfig(block_kv=64, num_parts=5, chunk_steps=chunk_steps, block_q=4)
        assert _slots_per_request(padded, tuning)[[1, 4]].tolist() == [0, 0]
        out, lse = pallas_triton.mla_decode(q_nope, q_pe, kv, mla_jax.to_jax_metadata(padded), batch.config,
                                            tuning=tuning, interpret=self.interpret)
        out, lse = np.asarray(out.astype(jnp.float32)), np.asarray(lse)
        pad = slice(int(qsl[3]), int(qsl[4]))
        assert (out[pad] == 0).all() and (lse[pad] == -np.inf).all()
        keep = np.ones(out.shape[0], bool)
        keep[pad] = False
        assert_matches(jnp.asarray(out[keep], jnp.bfloat16), jnp.asarray(lse[keep]), ref_out[keep], ref_lse[keep],
                       "bfloat16", "padding rows")

    @pytest.mark.parametrize("chunk_steps", [0, 2], ids=["balanced", "chunks"])
    def test_a_read_nan_in_a_split_request_shows(self, chunk_steps):
        """NaN at a position every token of the long request reads, in the first of its pieces: its tokens' out
        and lse come out NaN (not a plausible value from its other pieces); the other requests stay finite."""
        batch, _, _ = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
        md = batch.metadata
        tuning = TritonConfig(block_kv=64, num_parts=5, chunk_steps=chunk_steps, block_q=4)
        assert _slots_per_request(md, tuning)[2] > 1
        kv = batch.kv_cache.copy()
        kv[int(md.block_table[2, 0]), 5] = np.nan
        q_nope, q_pe, _, jmd = device_inputs(batch, "bfloat16")
        out, lse = pallas_triton.mla_decode(q_nope, q_pe, jnp.asarray(kv, jnp.bfloat16), jmd, batch.config,
                                            tuning=tuning, interpret=self.interpret)
        out, lse = np.asarray(out.astype(jnp.float32)), np.asarray(lse)
        qsl = np.asarray(md.query_start_loc)
        mine = np.zeros(out.shape[0], bool)
        mine[qsl[2]:qsl[3]] = True
        assert np.isnan(out[mine]).all() and np.isnan(lse[mine]).all()
        assert np.isfinite(out[~mine]).all() and np.isfinite(lse[~mine]).all()

    def test_max_num_splits_bounds_the_pieces_of_a_request(self):
        """metadata.max_num_splits = 2: the heuristic's chunk mode cuts each request into at most 2 pieces."""
        batch, ref_out, ref_lse = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
        md = batch.metadata.replace(max_num_splits=2)
        tuning = heuristic_config(batch.config, batch.q.shape[0], md.max_blocks, max_query_len=md.max_query_len,
                                  max_num_splits=2)
        assert 1 < _slots_per_request(md, tuning).max() <= 2
        q_nope, q_pe, kv, _ = device_inputs(batch, "bfloat16")
        out, lse = pallas_triton.mla_decode(q_nope, q_pe, kv, mla_jax.to_jax_metadata(md), batch.config,
                                            interpret=self.interpret)
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", "max_num_splits=2")

    def test_block_table_padding_is_never_read(self):
        """Entries past each request's last page hold garbage ids (out of range, negative):
        the result must not change."""
        batch, ref_out, ref_lse = batch_and_reference(SCENARIOS["spec_decode_page_16"], "bfloat16")
        P = batch.config.page_size
        bt = np.asarray(batch.metadata.block_table)
        garbage = np.full((bt.shape[0], bt.shape[1] + 3), 10**9, np.int32)
        garbage[:, 1::2] = -12345
        for r, seq_len in enumerate(batch.scenario.seq_lens):
            used = -(-seq_len // P)
            assert used < garbage.shape[1]  # every row has padding to misread
            garbage[r, :used] = bt[r, :used]
        md = batch.metadata.replace(block_table=garbage)
        md.validate(batch.config, num_blocks=batch.kv_cache.shape[0])  # padding is legal
        q_nope, q_pe, kv_cache, _ = device_inputs(batch, "bfloat16")
        out, lse = pallas_triton.mla_decode(
            q_nope, q_pe, kv_cache, mla_jax.to_jax_metadata(md), batch.config,
            tuning=TritonConfig(block_h=16, block_kv=32, num_parts=2, block_q=4), interpret=self.interpret,
        )
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", "garbage block-table padding")

    def test_jit_through_api(self):
        """mla_jax.mla_decode(impl="pallas_triton") under jax.jit, packed q, traced metadata."""
        batch, ref_out, ref_lse = batch_and_reference(SCENARIOS["spec_decode"], "bfloat16")
        cfg = batch.config
        q = jnp.asarray(batch.q, jnp.bfloat16)
        kv_cache = jnp.asarray(batch.kv_cache, jnp.bfloat16)
        md = mla_jax.to_jax_metadata(batch.metadata)
        fn = jax.jit(
            functools.partial(mla_jax.mla_decode, config=cfg, impl="pallas_triton", interpret=self.interpret)
        )
        out, lse = fn(q, kv_cache, md)
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", "jit api")
        # A second call with new values (same shapes) reuses the compiled function.
        out2, _ = fn(q * 2, kv_cache, md)
        assert not np.array_equal(np.asarray(out2, np.float32), np.asarray(out, np.float32))
        assert fn._cache_size() == 1

    def test_jit_with_bad_traced_metadata_reads_in_bounds(self):
        """Under jax.jit the metadata is traced, so mla_jax cannot validate its values: a block id out of
        [0, num_blocks) (here 10**6 and -7) or a seq_len past the block table must give a wrong answer, never a
        fault. The kernel clamps page ids to the cache and seq_len to the table: on a GPU this guards against an
        out-of-bounds global read (an illegal memory access that kills the process's CUDA context); in interpret
        mode the result is checked to be that of the clamped metadata (finite, no exception)."""
        batch, _, _ = batch_and_reference(SCENARIOS["decode_mixed_lengths"], "bfloat16")
        cfg = batch.config
        kv_np = np.nan_to_num(batch.kv_cache)  # no poison: a clamped page's unused slots are read here
        q = jnp.asarray(batch.q, jnp.bfloat16)
        kv_cache = jnp.asarray(kv_np, jnp.bfloat16)
        num_blocks = kv_np.shape[0]
        fn = jax.jit(functools.partial(mla_jax.mla_decode, config=cfg, impl="pallas_triton", interpret=self.interpret))
        bt = np.asarray(batch.metadata.block_table).copy()
        bt[0, 0], bt[-1, 0] = 10**6, -7
        md = batch.metadata.replace(block_table=bt)
        out, lse = fn(q, kv_cache, mla_jax.to_jax_metadata(md))
        assert np.isfinite(np.asarray(out, np.float32)).all() and np.isfinite(np.asarray(lse)).all()
        ref_out, ref_lse = reference.mla_decode(batch.q, kv_np, md.replace(block_table=np.clip(bt, 0, num_blocks - 1)),
                                                cfg)
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", "out-of-range block ids, clamped")
        # seq_len past what the block table holds: read as the table's length
        seq = np.asarray(md.seq_lens).copy()
        seq[-1] = 10**6
        out, lse = fn(q, kv_cache, mla_jax.to_jax_metadata(batch.metadata.replace(seq_lens=seq)))
        assert np.isfinite(np.asarray(out, np.float32)).all() and np.isfinite(np.asarray(lse)).all()

    def test_packed_q_is_the_pair_bitwise(self):
        """q [T, H, 576] read in place (q_pe=None) gives the same bits as the (q_nope, q_pe) pair."""
        batch, ref_out, ref_lse = batch_and_reference(SCENARIOS["heads_128_spec"], "bfloat16")
        q_nope, q_pe, kv_cache, md = device_inputs(batch, "bfloat16")
        q = jnp.concatenate([q_nope, q_pe], axis=-1)
        tuning = TritonConfig(block_h=32, block_kv=32, num_parts=2)
        out, lse = pallas_triton.mla_decode(q, None, kv_cache, md, batch.config, tuning=tuning, interpret=self.interpret)
        out2, lse2 = pallas_triton.mla_decode(q_nope, q_pe, kv_cache, md, batch.config, tuning=tuning,
                                              interpret=self.interpret)
        assert_matches(out, lse, ref_out, ref_lse, "bfloat16", "packed q")
        assert np.array_equal(np.asarray(out, np.float32), np.asarray(out2, np.float32))
        assert np.array_equal(np.asarray(lse), np.asarray(lse2))

    def test_api_with_numpy_metadata_and_tuple_q(self):
        batch, ref_out, ref_lse = batch_and_reference(SCENARIOS["decode_mixed_lengths"], "float16")
        q_nope, q_pe, kv_cache, _ = device_inputs(batch, "float16")
        out, lse, impl = mla_jax.mla_decode(
            (q_nope, q_pe), kv_cache, batch.metadata, batch.config, impl="pallas_triton",
            interpret=self.interpret, tuning=TritonConfig(num_parts=2), return_impl=True,
        )
        assert impl == "pallas_triton"
        assert_matches(out, lse, ref_out, ref_lse, "float16", "api numpy metadata")


class TestInterpret(_KernelCases):
    interpret = True


@pytest.mark.gpu
class TestGPU(_KernelCases):
    interpret = False

    @pytest.fixture(autouse=True)
    def _needs_jax_gpu(self):
        if jax.default_backend() != "gpu":
            pytest.skip(f"JAX has no GPU (default backend {jax.default_backend()!r})")
        reason = unsupported_reason(MLAConfig(num_heads=16), jax.devices()[0])
        if reason is not None:
            pytest.skip(reason)

    @pytest.mark.parametrize(
        "scenario",
        [
            Scenario("long_h16", seq_lens=(4096, 2500, 17, 8192), query_lens=(1, 2, 1, 2), num_heads=16),
            Scenario("long_h128", seq_lens=(4096, 1030, 3000), query_lens=(1, 2, 1), num_heads=128),
        ],
        ids=lambda s: s.name,
    )
    def test_long_sequences_heuristic(self, scenario):
        self.run(scenario, "bfloat16")


# ----------------------------------------------------------------------------- Triton lowering on the CPU


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(
    "scenario, dtype, tuning",
    [
        (SCENARIOS["decode_mixed_lengths"], "bfloat16", None),
        (SCENARIOS["heads_128_spec"], "bfloat16", TritonConfig(block_h=64, block_kv=32, num_parts=2, num_warps=8)),
        (ODD_PAGE_SCENARIOS["page_size_3"], "float16", TritonConfig(block_h=16, block_kv=32, block_q=4)),
    ],
    ids=["h16", "h128", "page3"],
)
def test_lowers_to_triton_for_an_abstract_h200(scenario, dtype, tuning):
    """The kernel goes through the Pallas Triton lowering (every array a power of two,
    every primitive supported) for an abstract H200, without a GPU. It does not compile
    the Triton IR to PTX: resource limits (registers, shared memory) need the GPU suite."""
    batch = make_batch(scenario, dtype)
    args = device_inputs(batch, dtype)
    tc = tuning or heuristic_config(
        batch.config, batch.q.shape[0], batch.metadata.max_blocks,
        max_query_len=batch.metadata.max_query_len, num_reqs=batch.metadata.num_reqs,
    )
    def fn(q_nope, q_pe, kv, md):
        return pallas_triton.mla_decode(q_nope, q_pe, kv, md, batch.config, tuning=tc)

    text = lower_for_h200(fn, *args).as_text()
    assert "__gpu$xla.gpu.triton" in text
    assert f"num_warps = {tc.num_warps} : i32" in text and f"num_stages = {tc.num_stages} : i32" in text


# ----------------------------------------------------------------------------- config, heuristic, support


def test_default_triton_config_is_valid_and_frozen():
    cfg = TritonConfig()
    assert cfg.rows == cfg.block_q * cfg.block_h >= 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_parts = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block_h=24), "block_h=24"),
        (dict(block_h=16.0), "block_h=16.0"),
        (dict(block_kv=48), "block_kv=48"),
        (dict(block_kv=8), "block_kv=8"),
        (dict(block_q=0), "block_q=0"),
        (dict(block_h=4, block_q=2), "block_h=4, block_q=2"),
        (dict(num_parts=0), "num_parts=0"),
        (dict(num_parts=True), "num_parts=True"),
        (dict(num_parts=2.0), "num_parts=2.0"),
        (dict(chunk_steps=-1), "chunk_steps=-1"),
        (dict(num_warps=3), "num_warps=3"),
        (dict(num_stages=0), "num_stages=0"),
    ],
)
def test_triton_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TritonConfig(**kwargs)


def _check_heuristic(tc: TritonConfig, config: MLAConfig, max_query_len: int = 1):
    assert 16 <= tc.rows <= pallas_triton.MAX_ROWS
    assert tc.block_h <= max(16, 1 << (config.num_heads - 1).bit_length())
    tiles = -(-max_query_len // tc.block_q) * -(-config.num_heads // tc.block_h)
    assert tc.num_parts == max(1, pallas_triton.NUM_SMS_H200 // tiles)  # one program an SM
    assert tc.chunk_steps == 0  # balanced cuts


def test_heuristic_config_h16():
    cfg = MLAConfig(num_heads=16)
    big = heuristic_config(cfg, num_tokens=128, max_blocks=256)  # B=128, S=16384
    small = heuristic_config(cfg, num_tokens=1, max_blocks=16)  # B=1, S=1024
    assert big == small  # the schedule balances whatever batch runs: the pick follows the tiles alone
    assert (big.block_h, big.block_q, big.num_parts) == (16, 1, 132)
    # speculative decode: tokens of a request share KV loads, up to 64 rows
    spec2 = heuristic_config(cfg, num_tokens=64, max_blocks=64, max_query_len=2, num_reqs=32)
    assert (spec2.block_h, spec2.block_q, spec2.num_parts) == (16, 2, 132)
    spec8 = heuristic_config(cfg, num_tokens=64, max_blocks=64, max_query_len=8, num_reqs=8)
    assert spec8.rows == 64 and spec8.block_q == 4 and spec8.num_parts == 66  # two query tiles
    for tc, q in ((big, 1), (small, 1), (spec2, 2), (spec8, 8)):
        _check_heuristic(tc, cfg, q)


def test_heuristic_config_h128():
    cfg = MLAConfig(num_heads=128)
    tc = heuristic_config(cfg, num_tokens=64, max_blocks=256)
    assert (tc.block_h, tc.block_q, tc.num_parts) == (64, 1, 66)  # 2 head blocks x 66 parts: one program an SM
    spec = heuristic_config(cfg, num_tokens=8, max_blocks=64, max_query_len=2, num_reqs=4)
    assert spec.block_q == 1 and spec.num_parts == 33  # 64 heads already fill the rows: 2 query tiles
    fp8 = heuristic_config(cfg.replace(kv_cache_dtype="fp8_e4m3"), num_tokens=64, max_blocks=256)
    assert (fp8.block_h, fp8.num_parts) == (32, 33)
    for t, q in ((tc, 1), (spec, 2)):
        _check_heuristic(t, cfg, q)


def test_heuristic_config_bounds():
    few_heads = heuristic_config(MLAConfig(num_heads=2), num_tokens=4, max_blocks=4)
    assert few_heads.block_h == 16  # padded up to the 16 rows Triton's dot needs
    # max_num_splits bounds the pieces of a request: chunks of half the longest request's 128 steps
    bounded = heuristic_config(MLAConfig(num_heads=16), num_tokens=1, max_blocks=256, max_num_splits=2)
    assert (bounded.block_kv, bounded.chunk_steps) == (128, 64)
    assert heuristic_config(MLAConfig(num_heads=16), num_tokens=1, max_blocks=256, max_num_splits=1).chunk_steps == 128
    more_tiles_than_sms = heuristic_config(MLAConfig(num_heads=128), num_tokens=8, max_blocks=1, max_query_len=8,
                                           num_sms=8)
    assert more_tiles_than_sms.num_parts == 1
    invariant = heuristic_config(MLAConfig(num_heads=16, batch_invariant=True), 1, 4, max_num_splits=2)
    assert invariant.chunk_steps == pallas_triton.INVARIANT_CHUNK_STEPS  # the fixed chunk, not the batch's


def test_unsupported_reason():
    assert unsupported_reason(MLAConfig(num_heads=16)) is None
    assert unsupported_reason(MLAConfig(num_heads=128, dtype="float16", page_size=3)) is None
    assert unsupported_reason(MLAConfig(num_heads=16, dtype="float32")) is None
    assert "kv_lora_rank=384" in unsupported_reason(MLAConfig(num_heads=16, kv_lora_rank=384))
    assert "qk_rope_head_dim=48" in unsupported_reason(MLAConfig(num_heads=16, qk_rope_head_dim=48))
    assert unsupported_reason(MLAConfig(num_heads=16, kv_cache_dtype="fp8_e4m3")) is None  # tests/test_fp8.py
    assert "cpu" in unsupported_reason(MLAConfig(num_heads=16), jax.devices("cpu")[0])
    hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0")
    turing = types.SimpleNamespace(platform="gpu", compute_capability="7.5")
    assert unsupported_reason(MLAConfig(num_heads=16), hopper) is None
    assert "7.5" in unsupported_reason(MLAConfig(num_heads=16), turing)
    assert unsupported_reason(MLAConfig(num_heads=16, dtype="float16"), turing) is None
    # through the api
    assert mla_jax.unsupported_reason("pallas_triton", MLAConfig(num_heads=16)) is None
    assert "kv_lora_rank" in mla_jax.unsupported_reason("pallas_triton", MLAConfig(num_heads=16, kv_lora_rank=384))


def test_api_refuses_unsupported_config():
    cfg = MLAConfig(num_heads=16, kv_lora_rank=384)
    md = mla_jax.to_jax_metadata(build_decode_metadata(seq_lens=[5], query_lens=[1], block_table=[[0]], config=cfg))
    q = jnp.zeros((1, 16, cfg.head_dim), jnp.bfloat16)
    kv_cache = jnp.zeros((1, cfg.page_size, cfg.head_dim), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="kv_lora_rank=384"):
        mla_jax.mla_decode(q, kv_cache, md, cfg, impl="pallas_triton", interpret=True)


@pytest.mark.parametrize("field, other", [("num_parts", 4), ("block_kv", 32), ("chunk_steps", 2)])
def test_prebuilt_schedule_for_another_tuning_is_refused(field, other):
    """A schedule built ahead for other parts, steps or chunks than the call's tuning: ValueError naming both values
    (before any kernel runs), directly and through mla_jax.mla_decode."""
    batch, _, _ = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
    q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
    tuning = TritonConfig(block_kv=64, num_parts=5, block_q=4)
    ahead = pallas_triton.with_schedule(md, batch.config, tuning=dataclasses.replace(tuning, **{field: other}))
    match = rf"{field}={other}.*the tuning runs .*{field}={getattr(tuning, field)}"
    with pytest.raises(ValueError, match=match):
        pallas_triton.mla_decode(q_nope, q_pe, kv, ahead, batch.config, tuning=tuning, interpret=True)
    with pytest.raises(ValueError, match=match):
        mla_jax.mla_decode((q_nope, q_pe), kv, ahead, batch.config, impl="pallas_triton", tuning=tuning,
                           interpret=True)


def test_prebuilt_schedule_for_another_batch_size_is_refused():
    batch, _, _ = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
    q_nope, q_pe, kv, md = device_inputs(batch, "bfloat16")
    tuning = TritonConfig(block_kv=64, num_parts=5, block_q=4)
    fewer = md.replace(query_start_loc=md.query_start_loc[:-1], seq_lens=md.seq_lens[:-1],
                       block_table=md.block_table[:-1])
    ahead = md.replace(scheduler_metadata=pallas_triton.with_schedule(fewer, batch.config,
                                                                      tuning=tuning).scheduler_metadata)
    with pytest.raises(ValueError, match="7 requests.*num_reqs=8"):
        pallas_triton.mla_decode(q_nope, q_pe, kv, ahead, batch.config, tuning=tuning, interpret=True)


@pytest.mark.parametrize("max_num_splits, batch_invariant", [(0, False), (2, False), (2, True)],
                         ids=["heuristic", "max_num_splits", "batch_invariant"])
def test_with_schedule_builds_the_calls_schedule(max_num_splits, batch_invariant):
    """with_schedule's default tuning is the heuristic's for the metadata (chunks bounding a request's pieces by
    max_num_splits; INVARIANT_CHUNK_STEPS in batch-invariant mode), and its schedule is the one the call builds: the
    same table and split offsets, from the lengths clamped to the block table. Traced under jit it gives the same.
    A batch-dependent tuning is refused in batch-invariant mode, as the call refuses it."""
    batch, _, _ = batch_and_reference(RAGGED_SCENARIOS[0], "bfloat16")
    cfg = batch.config.replace(batch_invariant=batch_invariant)
    md = mla_jax.to_jax_metadata(batch.metadata.replace(max_num_splits=max_num_splits))
    tuning = heuristic_config(cfg, batch.q.shape[0], md.max_blocks, max_query_len=md.max_query_len,
                              num_reqs=md.num_reqs, max_num_splits=max_num_splits)
    max_steps = -(-md.max_blocks * cfg.page_size // tuning.block_kv)
    splits_chunk = -(-max_steps // max_num_splits) if max_num_splits else 0
    assert tuning.chunk_steps == (pallas_triton.INVARIANT_CHUNK_STEPS if batch_invariant else splits_chunk)
    got = pallas_triton.with_schedule(md, cfg).scheduler_metadata
    traced = jax.jit(lambda m: pallas_triton.with_schedule(m, cfg).scheduler_metadata)(md)
    inline = pallas_triton._schedule(md, cfg, tuning, batch.q.shape[0])
    qsl = np.asarray(md.query_start_loc)
    chunk = tuning.chunk_steps or None
    max_seq_len = min(md.max_seq_len, md.max_blocks * cfg.page_size)
    want = schedule.mla_schedule(np.minimum(np.asarray(md.seq_lens), max_seq_len), np.diff(qsl),
                                 num_parts=tuning.num_parts, block_kv=tuning.block_kv, chunk_steps=chunk,
                                 max_steps=-(-max_seq_len // tuning.block_kv) if chunk else None)
    for sched in (got, traced, inline):
        assert (sched.num_parts, sched.block_kv, sched.chunk_steps, sched.num_slots) == (
            want.num_parts, want.block_kv, want.chunk_steps, want.num_slots)
        assert np.array_equal(np.asarray(sched.table), np.asarray(want.table))
        assert np.array_equal(np.asarray(sched.split_offsets), np.asarray(want.split_offsets))
        # the combine's rows per token, built with the schedule (none computed in the call)
        want_slots = schedule.slot_ranges(want.split_offsets, qsl, batch.q.shape[0])
        assert np.array_equal(np.asarray(sched.token_slots), np.asarray(want_slots))
    if batch_invariant:
        with pytest.raises(ValueError, match="chunk_steps=0"):
            pallas_triton.with_schedule(md, cfg, tuning=TritonConfig(num_parts=5))
    with pytest.raises(ValueError, match="tuning must be a TritonConfig"):
        pallas_triton.with_schedule(md, cfg, tuning={"num_parts": 5})


def test_tuning_must_be_a_triton_config():
    batch, _, _ = batch_and_reference(SCENARIOS["single_token"], "bfloat16")
    with pytest.raises(ValueError, match="tuning"):
        pallas_triton.mla_decode(*device_inputs(batch, "bfloat16"), batch.config, tuning={"block_h": 16}, interpret=True)
