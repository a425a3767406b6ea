"""The GPU parity suite across stacks: FA3 (torch) against each Pallas kernel (JAX), and
against FlashMLA where it imports, on every parity scenario in bf16 and fp16.

    python -m pytest -m gpu tests/test_gpu_suite.py -q

One run, shared by the tests below, through `parity.runner.run_parity` (the code behind
`python -m parity`): the torch reference, FA3, FlashMLA and both Pallas kernels on every
scenario x dtype. The Pallas kernels get the strict batch (NaN in every slot no request
may read); FA3 and FlashMLA get large finite garbage in the tails of last pages (they
multiply masked zeros by those rows, so NaN there turns out into NaN, as measured on the
H200) and also the strict batch, recorded as `known` when out turns NaN and lse stays
right. On top of that run:
  - every impl against the torch reference, and each Pallas kernel and FlashMLA against
    FA3 (the cross-stack check), with the expected rows present and none failed;
  - each Pallas kernel called eagerly and under an outer `jax.jit`: bitwise the same;
  - FA3 eagerly and replayed from a CUDA graph (vLLM's full-graph mode): bitwise the same,
    and right, on every scenario and dtype;
  - determinism: the same batch twice, another batch of the same shapes in between,
    bitwise the same (FA3, FlashMLA, Pallas Triton, Pallas Mosaic GPU, on split-KV shapes).
Cheap on purpose: compile time dominates the Pallas side, so the jit and determinism checks
reuse shapes the parity run has compiled already; FA3 has nothing to compile.

Skips, with the reason: every test without a GPU (conftest's `gpu` marker); the FA3 tests
without FA3; a kernel's tests where it cannot run (not Hopper, a page size it does not take).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from mla_spec import MLAConfig
from parity import runner
from parity.compare import compare_out_lse
from parity.scenarios import SCENARIOS, make_batch

pytestmark = pytest.mark.gpu

FA3, FLASHMLA = "torch.fa3", "torch.flashmla"
TRITON, MOSAIC = "jax.pallas_triton", "jax.pallas_mosaic_gpu"
PALLAS = (TRITON, MOSAIC)
DTYPES = ("bfloat16", "float16")
CASES = [(name, dtype) for name in SCENARIOS for dtype in DTYPES]
CASE_IDS = [f"{n}-{d}" for n, d in CASES]
# Shapes the parity run compiles anyway: reused by the jit and determinism checks.
JIT_CASES = [("spec_decode", "bfloat16"), ("heads_128_spec", "float16")]  # q_len 1..8; page 64 and 16
DETERMINISM_CASES = [("decode_mixed_lengths", "bfloat16"), ("heads_128", "float16")]  # both kernels split the KV


# ----------------------------------------------------------------------------- why a part cannot run


def _torch_gpu_reason() -> str | None:
    return None if torch.cuda.is_available() else "torch sees no CUDA GPU"


def _jax_gpu_reason() -> str | None:
    import jax

    return None if jax.default_backend() == "gpu" else f"JAX has no GPU (default backend {jax.default_backend()!r})"


def expected_reason(impl: str, config: MLAConfig, query_lens) -> str | None:
    """Why `impl` cannot run this problem here, worked out independently of the runner (None: it must run)."""
    if impl == FA3:
        import mla_torch

        return _torch_gpu_reason() or mla_torch.unsupported_reason("fa3", config, torch.device("cuda"))
    if impl == FLASHMLA:
        return runner.flashmla_unsupported_reason(config, query_lens)
    import jax

    import mla_jax

    return _jax_gpu_reason() or mla_jax.unsupported_reason(impl.split(".", 1)[1], config, jax.devices()[0])


# ----------------------------------------------------------------------------- the shared parity run


@pytest.fixture(scope="module")
def parity_rows():
    reason = _torch_gpu_reason()
    if reason:
        pytest.skip(reason)
    impls = [runner.BASELINE, FA3, FLASHMLA]
    if _jax_gpu_reason() is None:  # no interpret-mode kernels here: minutes on a CPU, and not the point
        impls += list(PALLAS)
    return runner.run_parity(list(SCENARIOS.values()), list(DTYPES), impls)


def _rows(rows, scenario, dtype, impl, against):
    return [r for r in rows if (r.scenario, r.dtype, r.impl, r.against) == (scenario, dtype, impl, against)]


def _describe(rows) -> str:
    out = []
    for r in rows:
        detail = r.note or ""
        if r.out is not None and r.status == "FAIL":
            detail = f"{r.out.message}; {r.lse.message}" + (f" ({r.note})" if r.note else "")
        out.append(f"{r.scenario} {r.dtype} {r.impl} vs {r.against}: {r.status} {detail}".rstrip())
    return "\n".join(out) or "(no rows)"


def _require_runs(impl, scenario, dtype):
    sc = SCENARIOS[scenario]
    reason = expected_reason(impl, sc.config(dtype), sc.query_lens)
    if reason is not None:
        pytest.skip(f"{impl}: {reason}")


def test_no_row_failed(parity_rows):
    """The whole run at a glance: no FAIL or ERROR anywhere (skips carry their reason)."""
    bad = [r for r in parity_rows if r.status in ("FAIL", "ERROR")]
    assert not bad, f"{len(bad)} of {len(parity_rows)} rows failed:\n{_describe(bad)}"


@pytest.mark.parametrize("impl", [FA3, FLASHMLA, TRITON, MOSAIC])
@pytest.mark.parametrize("scenario, dtype", CASES, ids=CASE_IDS)
def test_matches_reference(parity_rows, scenario, dtype, impl):
    sc = SCENARIOS[scenario]
    reason = expected_reason(impl, sc.config(dtype), sc.query_lens)
    rows = _rows(parity_rows, scenario, dtype, impl, runner.BASELINE)
    if reason is not None:
        if impl in PALLAS and _jax_gpu_reason() is not None:
            pytest.skip(f"{impl}: {reason}")  # left out of the run (no JAX GPU)
        assert [r.status for r in rows] == ["skip"] and rows[0].note == reason, _describe(rows)
        pytest.skip(f"{impl}: {reason}")
    if impl in (FA3, FLASHMLA):
        # finite page tails, then the strict batch (NaN tails): the latter may be a known limitation
        assert len(rows) == 2, _describe(rows)
        assert rows[0].status == "pass" and rows[0].note == "finite page tails", _describe(rows)
        assert rows[1].status in ("pass", "known"), _describe(rows)
        if rows[1].status == "known":
            assert rows[1].lse.ok, f"NaN page tails: lse must stay right\n{_describe(rows)}"
    else:
        assert [r.status for r in rows] == ["pass"], _describe(rows)


@pytest.mark.parametrize("impl", [TRITON, MOSAIC, FLASHMLA])
@pytest.mark.parametrize("scenario, dtype", CASES, ids=CASE_IDS)
def test_agrees_with_fa3(parity_rows, scenario, dtype, impl):
    """The cross-stack check: the impl's out and lse against FA3's, with the harness tolerances."""
    _require_runs(FA3, scenario, dtype)
    _require_runs(impl, scenario, dtype)
    rows = _rows(parity_rows, scenario, dtype, impl, FA3)
    assert [r.status for r in rows] == ["pass"], _describe(rows)
    assert rows[0].out.ok and rows[0].lse.ok


# ----------------------------------------------------------------------------- jit, graphs, determinism


def _bitwise_equal(a, b) -> bool:
    def raw(x):
        if isinstance(x, torch.Tensor):
            return x.detach().contiguous().cpu().view(torch.uint8).numpy(), tuple(x.shape)
        x = np.asarray(x)
        return np.ascontiguousarray(x).view(np.uint8), x.shape

    (ra, sa), (rb, sb) = raw(a), raw(b)
    return sa == sb and np.array_equal(ra, rb)


def _diff(a, b) -> str:
    fa, fb = runner._to_np(a), runner._to_np(b)
    if fa.shape != fb.shape:
        return f"shapes {fa.shape} != {fb.shape}"
    ne = ~((fa == fb) | (np.isnan(fa) & np.isnan(fb)))
    d = np.abs(np.nan_to_num(fa) - np.nan_to_num(fb))
    return f"{int(ne.sum())} of {fa.size} elements differ, max abs diff {float(d.max()):.3g}"


def _assert_bitwise(got, want, what):
    for name, a, b in (("out", got[0], want[0]), ("lse", got[1], want[1])):
        assert _bitwise_equal(a, b), f"{what}: {name} not bitwise equal ({_diff(a, b)})"


def _inputs(impl, scenario, dtype, seed=0):
    tail = runner.all_impls()[impl].page_tail
    return runner.Inputs.make(make_batch(SCENARIOS[scenario], dtype, seed=seed, page_tail=tail))


@pytest.mark.parametrize("kernel", PALLAS)
@pytest.mark.parametrize("scenario, dtype", JIT_CASES, ids=[f"{n}-{d}" for n, d in JIT_CASES])
def test_pallas_eager_and_jit_are_bitwise_equal(kernel, scenario, dtype):
    """mla_jax.mla_decode called eagerly (NumPy metadata) and inside an outer jax.jit
    (traced metadata pytree, packed q sliced in the jitted function): the same bits."""
    import jax

    import mla_jax

    _require_runs(kernel, scenario, dtype)
    x = _inputs(kernel, scenario, dtype)
    q, kv = x.jax_arrays()
    b = x.batch
    impl = kernel.split(".", 1)[1]
    eager = jax.block_until_ready(mla_jax.mla_decode(q, kv, b.metadata, b.config, impl=impl))
    fn = jax.jit(functools.partial(mla_jax.mla_decode, config=b.config, impl=impl))
    jitted = jax.block_until_ready(fn(q, kv, mla_jax.to_jax_metadata(b.metadata)))
    _assert_bitwise(jitted, eager, f"{kernel} {scenario} {dtype}: jit vs eager")
    out, lse = (runner._to_np(t) for t in eager)
    ref_out, ref_lse = (runner._to_np(t) for t in runner.all_impls()[runner.BASELINE].run(x))
    c_out, c_lse = compare_out_lse(out, lse, ref_out, ref_lse, dtype)
    assert c_out.ok and c_lse.ok, f"{c_out.message}; {c_lse.message}"


@pytest.mark.parametrize("scenario, dtype", CASES, ids=CASE_IDS)
def test_fa3_cuda_graph_replay_is_bitwise_eager(scenario, dtype):
    """vLLM's full-CUDA-graph mode (persistent buffers and schedule, bounded splits): the
    graph's replay gives the eager run's bits on the same buffers, twice, and both are right."""
    from mla_torch.fa3.graph import FA3DecodeGraph

    _require_runs(FA3, scenario, dtype)
    sc = SCENARIOS[scenario]
    batch = make_batch(sc, dtype, page_tail="finite", max_num_seqs=8, max_capture_size=64)
    x = runner.Inputs.make(batch)
    md = batch.metadata
    g = FA3DecodeGraph(batch.config, x.kv_cache, max_num_reqs=len(sc.seq_lens), max_num_tokens=sc.num_tokens,
                       max_blocks_per_req=int(md.block_table.shape[1]), max_query_len=max(sc.query_lens))
    eager = g.run_eager(x.q, md)
    replay = tuple(t.clone() for t in g.capture(x.q, md))
    torch.cuda.synchronize()
    _assert_bitwise(replay, eager, f"FA3 {scenario} {dtype}: graph replay vs eager")
    again = tuple(t.clone() for t in g.replay(x.q, md))
    torch.cuda.synchronize()
    _assert_bitwise(again, replay, f"FA3 {scenario} {dtype}: second replay vs first")
    ref = runner.all_impls()[runner.BASELINE].run(x)
    c_out, c_lse = compare_out_lse(*(runner._to_np(t) for t in replay), *(runner._to_np(t) for t in ref), dtype)
    assert c_out.ok and c_lse.ok, f"FA3 graph {scenario} {dtype}: {c_out.message}; {c_lse.message}"


@pytest.mark.parametrize("impl", [FA3, FLASHMLA, TRITON, MOSAIC])
@pytest.mark.parametrize("scenario, dtype", DETERMINISM_CASES, ids=[f"{n}-{d}" for n, d in DETERMINISM_CASES])
def test_deterministic(impl, scenario, dtype):
    """Batch A, then batch B (same shapes, other values and block tables), then A again:
    A's two results are bitwise equal (split-KV combine and schedules included)."""
    import jax

    _require_runs(impl, scenario, dtype)
    run = runner.all_impls()[impl].run
    a, b = _inputs(impl, scenario, dtype, seed=0), _inputs(impl, scenario, dtype, seed=1)

    def call(x):
        res = run(x)
        if impl.startswith("jax."):
            return jax.block_until_ready(res)
        torch.cuda.synchronize()
        return tuple(t.clone() for t in res)

    first = call(a)
    other = call(b)
    second = call(a)
    _assert_bitwise(second, first, f"{impl} {scenario} {dtype}: two calls on one batch")
    assert not _bitwise_equal(other[0], first[0]), f"{impl}: batches A and B gave the same out (inputs not used?)"
