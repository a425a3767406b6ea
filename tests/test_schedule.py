"""The split-KV work schedule (mla_jax.schedule), on the CPU: the jnp schedule against its NumPy loops, the
properties it holds by construction, batch invariance of the chunked mode, one compile for new lengths, and the
decode that walks it against the float64 reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_jax import schedule as S
from mla_spec import reference
from parity.scenarios import Scenario, make_batch

R = 12  # every random batch is padded to R requests, so the jitted schedule compiles once per static arguments
B = 16  # block_kv of the random batches: seq_len up to 40 blocks stays cheap for the loop oracle

ADVERSARIAL = {
    "all_padding": ([0, 0, 0], [1, 0, 1]),
    "one_request": ([1000], [1]),
    "one_step": ([1], [1]),
    "huge_among_tiny": ([1] * 7 + [5000] + [3] * 4, [1] * 12),
    "step_boundaries": ([B - 1, B, B + 1, 2 * B - 1, 2 * B, 2 * B + 1], [1, 2, 1, 3, 1, 1]),
    "q_len_0_rows": ([100, 200, 300, 400], [0, 1, 0, 2]),
    "padding_between": ([0, 50, 0, 0, 70, 0], [1, 1, 1, 0, 3, 1]),
}


MAX_STEPS = 320  # the bucket's ceil(max_seq_len / B): >= every batch's longest request here


def _schedules(seq, qlen, num_parts, overhead=S.DEFAULT_FIXED_OVERHEAD, chunk=None, block=B, max_steps=MAX_STEPS):
    """(jnp schedule, NumPy schedule) of a batch."""
    kw = dict(num_parts=num_parts, block_kv=block, fixed_overhead=overhead, chunk_steps=chunk, max_steps=max_steps)
    return (S.mla_schedule_jit(np.asarray(seq, np.int32), np.asarray(qlen, np.int32), **kw),
            S.reference_schedule(seq, qlen, **kw))


def _assert_same(got, want):
    np.testing.assert_array_equal(np.asarray(got.table), want.table)
    np.testing.assert_array_equal(np.asarray(got.split_offsets), want.split_offsets)
    assert got.num_slots == want.num_slots


def _steps(seq, qlen, block):
    return [(-(-s // block) if s > 0 and q > 0 else 0) for s, q in zip(seq, qlen)]


def check_properties(sched, seq, qlen):
    """What the schedule guarantees by construction (see mla_jax.schedule's docstring for the bounds)."""
    n, o, c = _steps(seq, qlen, sched.block_kv), sched.fixed_overhead, sched.chunk_steps
    table, offsets = np.asarray(sched.table), np.asarray(sched.split_offsets)
    walked = S.pieces(sched, seq, qlen)
    covered = [np.zeros(k, int) for k in n]
    slots_of = [[] for _ in n]
    for part, items in zip(table, walked):
        assert part[S.NUM_PIECES] == len(items) and part[S.NUM_STEPS] == sum(hi - lo for _, lo, hi, _ in items)
        assert part[S.COST] == part[S.NUM_STEPS] + o * part[S.NUM_PIECES]
        for (r0, _, hi0, s0), (r1, lo1, _, s1) in zip(items, items[1:]):  # in order, contiguous, slots counted up
            assert s1 == s0 + 1 and ((r1 == r0 and lo1 == hi0) or (r1 > r0 and hi0 == n[r0] and lo1 == 0))
        for r, lo, hi, slot in items:
            assert 0 <= lo < hi <= n[r] and (not c or (lo // c == (hi - 1) // c and (lo % c == 0 or hi == n[r])))
            covered[r][lo:hi] += 1
            slots_of[r].append(slot)
    assert all((cov == 1).all() for cov in covered), "a step covered twice or never"
    for r, slots in enumerate(slots_of):  # a request's slots: consecutive, its own range, in step order
        assert slots == list(range(offsets[r], offsets[r + 1]))
    assert offsets[-1] <= sched.num_slots
    assert sched.num_slots == (len(n) + sched.num_parts - 1 if not c else len(n) * -(-MAX_STEPS // c))
    # slot_pieces (a row a slot, what the Mosaic GPU kernel's CTAs read): the walked pieces by slot, zeros after
    rows = np.asarray(_slot_pieces(sched, np.asarray(seq, np.int32), np.asarray(qlen, np.int32)))
    by_slot = sorted((slot, r, lo, hi) for items in walked for r, lo, hi, slot in items)
    assert [slot for slot, *_ in by_slot] == list(range(len(by_slot)))
    np.testing.assert_array_equal(rows[:len(by_slot)], np.asarray([x[1:] for x in by_slot]).reshape(-1, 3))
    assert (rows[len(by_slot):] == 0).all()
    if sched.pieces is not None:  # (fixed_overhead 0, balanced: mla_schedule's own pieces, from its one merge)
        np.testing.assert_array_equal(np.asarray(sched.pieces), rows)
    moved = 0
    if o == 0 and not c:
        _check_snapped(walked, n, sched.num_parts)
        moved = 2 * (-(-sum(n) // sched.num_parts) // 2)  # (each end of a part moved by at most half a short request)
    _check_balance(table[:, S.COST], n, o, c, sched.num_parts, moved)


def _check_snapped(walked, n, num_parts):
    """Balanced at fixed_overhead 0 (its cuts moved off the requests that fit one piece): no piece is longer than
    ceil(N / P) steps, and a request of at most that many steps is one piece."""
    longest = -(-sum(n) // num_parts)
    count = [0] * len(n)
    for items in walked:
        for r, lo, hi, _ in items:
            assert hi - lo <= longest, (r, lo, hi, longest)
            count[r] += 1
    for r, steps in enumerate(n):
        assert steps > longest or count[r] == (steps > 0), (r, steps, count[r], longest)


_slot_pieces = jax.jit(S.slot_pieces)


def _check_balance(cost, n, o, c, num_parts, moved=0):
    """Part p's cost is within O (balanced) or C + O (batch-invariant) of its cost interval's length, floor or ceil
    of W / P: two parts differ by at most 2 O + 1, resp. 2 (C + O) + 1; no part costs more than ceil(W/P) + O.
    `moved`: more slack, where the cuts were moved off the requests that fit one piece."""
    pieces = sum((-(-k // c) if c else 1) for k in n if k)
    total = sum(n) + o * pieces
    slack = (o if not c else c + o - 1) + moved
    lo, hi = total // num_parts, -(-total // num_parts)
    assert (cost >= lo - slack).all() and (cost <= hi + slack).all(), (cost, lo, hi, slack)
    assert cost.max() - cost.min() <= 2 * slack + 1


def _padded(seq, qlen):
    """The batch padded with zero-work rows to R requests (one compile for all), a lone request left alone."""
    if len(seq) == 1:
        return list(seq), list(qlen)
    return list(seq) + [0] * (R - len(seq)), list(qlen) + [1] * (R - len(qlen))


@pytest.mark.parametrize("name", list(ADVERSARIAL))
@pytest.mark.parametrize("num_parts", [1, 5, 64])
@pytest.mark.parametrize("chunk,overhead", [(None, S.DEFAULT_FIXED_OVERHEAD), (None, 0), (3, S.DEFAULT_FIXED_OVERHEAD)])
def test_adversarial_batches(name, num_parts, chunk, overhead):
    seq, qlen = _padded(*ADVERSARIAL[name])
    got, want = _schedules(seq, qlen, num_parts, overhead, chunk=chunk)
    _assert_same(got, want)
    check_properties(got, seq, qlen)


@st.composite
def batches(draw):
    """A batch of R requests: lengths from tiny to long-tailed, a share of padding rows (seq 0 or q_len 0)."""
    long = draw(st.integers(0, 40 * B))
    seq = draw(st.lists(st.one_of(st.integers(0, 3 * B), st.integers(0, long), st.sampled_from([B - 1, B, B + 1])),
                        min_size=R, max_size=R))
    qlen = draw(st.lists(st.sampled_from([0, 1, 1, 1, 2, 3]), min_size=R, max_size=R))
    return seq, qlen


@settings(max_examples=60, deadline=None)
@given(batch=batches(), num_parts=st.sampled_from([1, 3, 8, 132]), overhead=st.sampled_from([0, 5]),
       chunk=st.sampled_from([None, None, 2, 5]))
def test_random_batches(batch, num_parts, overhead, chunk):
    seq, qlen = batch
    got, want = _schedules(seq, qlen, num_parts, overhead, chunk)
    _assert_same(got, want)
    check_properties(got, seq, qlen)


@settings(max_examples=25, deadline=None)
@given(request=st.tuples(st.integers(1, 40 * B), st.integers(1, 3)), first=batches(), second=batches(),
       where=st.tuples(st.integers(0, R - 1), st.integers(0, R - 1)), num_parts=st.sampled_from([3, 132]),
       chunk=st.sampled_from([1, 4]))
def test_invariant_pieces_ignore_the_batch(request, first, second, where, num_parts, chunk):
    """A request's pieces (step ranges, in slot order) are the same whatever else is in the batch and wherever it
    sits in it."""

    def its_pieces(batch, at):
        seq, qlen = (list(x[: R - 1]) for x in batch)
        seq.insert(at, request[0])
        qlen.insert(at, request[1])
        sched = S.mla_schedule_jit(np.asarray(seq, np.int32), np.asarray(qlen, np.int32), num_parts=num_parts,
                                   block_kv=B, chunk_steps=chunk, max_steps=MAX_STEPS)
        items = sorted((slot, lo, hi) for part in S.pieces(sched, seq, qlen) for r, lo, hi, slot in part if r == at)
        offsets = np.asarray(sched.split_offsets)
        assert [slot for slot, _, _ in items] == list(range(offsets[at], offsets[at + 1]))
        return [(lo, hi) for _, lo, hi in items]

    assert its_pieces(first, where[0]) == its_pieces(second, where[1])


def test_new_lengths_compile_once():
    traces = []

    def schedule(seq, qlen):
        traces.append(1)  # runs only while tracing
        return S.mla_schedule(seq, qlen, num_parts=8, block_kv=B)

    jitted = jax.jit(schedule)
    for seq, qlen in (([5000, 1, 3, 0], [1, 1, 2, 0]), ([16, 17, 900, 31], [1, 3, 1, 1])):
        got = jitted(np.asarray(seq, np.int32), np.asarray(qlen, np.int32))
        _assert_same(got, S.reference_schedule(seq, qlen, num_parts=8, block_kv=B))
    assert len(traces) == 1 and jitted._cache_size() == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_parts=0), "num_parts"), (dict(num_parts=2.0), "num_parts"), (dict(block_kv=48), "block_kv"),
    (dict(block_kv=0), "block_kv"), (dict(fixed_overhead=-1), "fixed_overhead"),
    (dict(chunk_steps=0, max_steps=4), "chunk_steps"), (dict(chunk_steps=2), "max_steps"),
])
def test_bad_static_arguments(kwargs, message):
    kwargs = dict(dict(num_parts=4), **kwargs)
    for fn in (S.mla_schedule, S.reference_schedule):
        with pytest.raises(ValueError, match=message):
            fn(np.array([10], np.int32), np.array([1], np.int32), **kwargs)


DECODE_SCENARIOS = [
    Scenario("one_long_among_short", seq_lens=(5, 3000, 17, 64, 65, 1), query_lens=(1, 1, 2, 3, 1, 1), page_size=16),
    Scenario("spec_decode", seq_lens=(40, 97, 300, 1030), query_lens=(2, 4, 8, 3)),
    Scenario("heads_128_spec", seq_lens=(97, 300), query_lens=(4, 2), num_heads=128, page_size=16),
]


def _assert_matches_reference(out, lse, batch, rows=slice(None)):
    want_out, want_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    out, lse = np.asarray(out, np.float64)[rows], np.asarray(lse, np.float64)[rows]
    assert np.abs(out - want_out).max() <= 1e-5 * np.abs(want_out).max()
    assert np.abs(lse - want_lse).max() <= 1e-5 * np.abs(want_lse).max()


@pytest.mark.parametrize("scenario", DECODE_SCENARIOS, ids=lambda s: s.name)
@pytest.mark.parametrize("num_parts, chunk, block", [(1, None, 64), (5, None, 16), (16, 4, 16), (7, 1, 64)])
def test_decode_by_schedule_matches_reference(scenario, num_parts, chunk, block):
    batch = make_batch(scenario, "float32", seed=3)
    assert np.isnan(batch.kv_cache).any(), "make_batch leaves every unreadable slot NaN"
    sched = S.schedule_for_metadata(batch.metadata, num_parts=num_parts, block_kv=block, chunk_steps=chunk)
    assert np.asarray(sched.split_offsets)[-1] > len(scenario.seq_lens) or num_parts == 1  # some request is split
    out, lse = S.decode_by_schedule(batch.q, batch.kv_cache, batch.metadata, batch.config, sched)
    _assert_matches_reference(out, lse, batch)


def test_decode_skips_padding_requests():
    """A request with q_len 0 and seq_len 0 (a bucket's padding row) gets no piece, no slot and no token."""
    batch = make_batch(DECODE_SCENARIOS[0], "float32", seed=5)
    md = batch.metadata
    qsl, seq, bt = (np.asarray(x) for x in (md.query_start_loc, md.seq_lens, md.block_table))
    padded = md.replace(query_start_loc=np.insert(qsl, 2, qsl[2]), seq_lens=np.insert(seq, 2, 0),
                        block_table=np.insert(bt, 2, 0, axis=0))
    sched = S.schedule_for_metadata(padded, num_parts=9, block_kv=16)
    offsets = np.asarray(sched.split_offsets)
    assert offsets[2] == offsets[3]
    out, lse = S.decode_by_schedule(batch.q, batch.kv_cache, padded, batch.config, sched)
    _assert_matches_reference(out, lse, batch)


def test_cuts_do_not_overflow_int32():
    """A 16M-step batch over 132 parts: p * total would pass 2**31; the cuts stay exact."""
    seq, qlen = [2**27 - 3, 5 * B, 2**27], [1, 2, 1]
    got = S.mla_schedule_jit(np.asarray(seq, np.int32), np.asarray(qlen, np.int32), num_parts=132, block_kv=B)
    table = np.asarray(got.table)
    assert table[:, S.NUM_STEPS].sum() == sum(_steps(seq, qlen, B))
    cost = table[:, S.COST]
    assert cost.max() - cost.min() <= 2 * S.DEFAULT_FIXED_OVERHEAD + 1


def test_reference_refuses_a_request_past_max_steps():
    with pytest.raises(ValueError, match="max_steps"):
        S.reference_schedule([10 * B], [1], num_parts=2, block_kv=B, chunk_steps=2, max_steps=9)


def test_decode_by_schedule_fp8_cache():
    """An fp8 cache (values times k_scale) through the same walk, balanced and batch-invariant."""
    from parity.scenarios import make_fp8_batch

    batch, k_scale = make_fp8_batch(DECODE_SCENARIOS[0], "float32", seed=7)
    want_out, want_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config, k_scale=k_scale)
    kv = batch.kv_cache.astype(jax.numpy.float8_e4m3fn)
    for num_parts, chunk in ((6, None), (6, 4)):
        sched = S.schedule_for_metadata(batch.metadata, num_parts=num_parts, block_kv=16, chunk_steps=chunk)
        out, lse = S.decode_by_schedule(batch.q, kv, batch.metadata, batch.config, sched, k_scale=k_scale)
        assert np.abs(np.asarray(out, np.float64) - want_out).max() <= 1e-5 * np.abs(want_out).max()
        assert np.abs(np.asarray(lse, np.float64) - want_lse).max() <= 1e-5 * np.abs(want_lse).max()


def test_prebuilt_or_build_takes_a_fitting_schedule_and_refuses_another():
    """A kernel's call walks the Schedule in metadata.scheduler_metadata when it fits its tuning (parts, steps, and
    chunks where given) and, with concrete lengths, is the one they give; builds one when there is none; and refuses
    one for other values, other lengths or another batch size. Traced (under jit), nothing is built beside it."""
    from mla_spec import DecodeMetadata

    seq, qsl = np.asarray([40, 100, 7], np.int32), np.asarray([0, 1, 3, 4], np.int32)
    md = DecodeMetadata(qsl, seq, np.zeros((3, 8), np.int32), max_query_len=2, max_seq_len=100, num_decode_tokens=4)
    build = lambda seq: S.reference_schedule(seq, np.diff(qsl), num_parts=4, block_kv=B, chunk_steps=2, max_steps=7)
    built = build(seq)

    def other():
        return build(seq)  # (the same values in another object: the concrete comparison)

    def fail():
        pytest.fail("built a schedule beside the prebuilt one")

    assert S.prebuilt_or_build(md, lambda: built, num_parts=4, block_kv=B) is built
    ahead = md.replace(scheduler_metadata=built)
    assert S.prebuilt_or_build(ahead, other, num_parts=4, block_kv=B) is built  # chunk_steps not compared
    assert S.prebuilt_or_build(ahead, other, num_parts=4, block_kv=B, chunk_steps=2) is built
    stale = ahead.replace(seq_lens=np.asarray([40, 60, 7], np.int32))
    with pytest.raises(ValueError, match="work schedule built for other lengths"):
        S.prebuilt_or_build(stale, lambda: build(stale.seq_lens), num_parts=4, block_kv=B)

    @jax.jit
    def traced(seq_lens, schedule):
        md = ahead.replace(seq_lens=seq_lens, scheduler_metadata=schedule)
        return S.prebuilt_or_build(md, fail, num_parts=4, block_kv=B).table

    assert np.array_equal(np.asarray(traced(seq, jax.tree.map(jnp.asarray, built))), np.asarray(built.table))
    for kw, match in ((dict(num_parts=5), "num_parts=4, block_kv=16; the tuning runs num_parts=5"),
                      (dict(block_kv=2 * B), "block_kv=16; the tuning runs num_parts=4, block_kv=32"),
                      (dict(chunk_steps=0), "chunk_steps=2; the tuning runs .*chunk_steps=0")):
        with pytest.raises(ValueError, match=match):
            S.prebuilt_or_build(ahead, other, **{**dict(num_parts=4, block_kv=B), **kw})
    fewer = ahead.replace(query_start_loc=qsl[:-1], seq_lens=seq[:-1], block_table=np.zeros((2, 8), np.int32))
    with pytest.raises(ValueError, match="3 requests, the batch has num_reqs=2"):
        S.prebuilt_or_build(fewer, other, num_parts=4, block_kv=B)


@pytest.mark.parametrize("what", ["balanced", "chunked", "slot_ranges", "token_positions"])
def test_per_call_index_math_has_no_while_loop(what):
    """The schedule build, the combine's slot ranges and the reference's token positions run inside every jitted
    decode call. A `while` there (jnp.searchsorted's default method) is driven from the host on the GPU, one
    device-host round trip an iteration, so none may be left."""
    from mla_jax import reference as jnp_reference
    from mla_spec import DecodeMetadata

    seq, qlen = jnp.asarray([5, 70, 0, 300], jnp.int32), jnp.asarray([1, 2, 1, 3], jnp.int32)
    qsl = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(qlen)]).astype(jnp.int32)

    def positions(seq, qsl):
        md = DecodeMetadata(seq_lens=seq, query_start_loc=qsl, block_table=None, max_query_len=3, max_seq_len=300,
                            num_decode_tokens=8)
        return jnp_reference.token_positions(md, 8)

    fn, args = {
        "balanced": (lambda s, q: S.mla_schedule(s, q, num_parts=8, block_kv=B), (seq, qlen)),
        "chunked": (lambda s, q: S.mla_schedule(s, q, num_parts=8, block_kv=B, chunk_steps=4, max_steps=32),
                    (seq, qlen)),
        "slot_ranges": (lambda off, qsl: S.slot_ranges(off, qsl, 8), (qsl, qsl)),
        "token_positions": (positions, (seq, qsl)),
    }[what]
    text = jax.jit(fn).lower(*args).as_text()
    assert "stablehlo.while" not in text


@pytest.mark.parametrize("impl", ["pallas_triton", "pallas_mosaic_gpu"])
@pytest.mark.parametrize("problem", [(16, 32, 1024, 1, False), (128, 8, 4096, 2, True)], ids=["H16_bf16", "H128_fp8"])
def test_decode_call_lowered_for_the_gpu_has_no_while_loop(impl, problem):
    """One decode call (its schedule built inside, as under a serving engine's jit), lowered for an abstract H200: the
    kernels are custom calls, and nothing around them may be a `while` (a host round trip an iteration on the GPU;
    the Triton call had 4 before searchsorted was unrolled)."""
    import importlib

    from parity import h200

    fn, args = h200.abstract_call(problem, module=importlib.import_module(f"mla_jax.{impl}"))
    text = h200.lower_for_h200(fn, *args).as_text()
    assert text.count("stablehlo.custom_call") >= 2  # the decode kernel and the combine
    assert "stablehlo.while" not in text
