"""parity.bench, parity.timing and parity.shapes on the CPU: the fp8 row (quantize_fp8, 1-byte KV bytes, the grid,
the runner in interpret mode), --check recording the fp8 gap without judging it, the summary's fp8_speedup_vs_bf16,
the launch's calibration and trace, where --save writes, the ragged shapes (their KV lengths, names, bytes and FLOPs,
uniform twins, the ragged grid and its metadata) and their time against their twins' in the rows, the summary, merge
and the plot. The timing itself needs a GPU (`python -m parity bench`)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time

import numpy as np
import pytest
import torch

from mla_jax import pallas_triton
from mla_spec import MLAConfig, build_decode_metadata, reference
from parity import bench, timing
from parity.shapes import GRIDS, Shape, parse_shape
from parity.timing import RUNNERS
from parity.compare import TOLERANCES, compare
from parity.scenarios import FP8_E4M3_MAX

FP8 = "jax.pallas_triton.fp8"


# ----------------------------------------------------------------------------- quantize_fp8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_fp8_scale_dtype_and_round_trip(dtype):
    g = torch.Generator().manual_seed(0)
    kv = (torch.randn(3, 16, 576, generator=g) * 3).to(dtype)
    before = kv.clone()
    kv_fp8, k_scale = timing.quantize_fp8(kv)
    assert kv_fp8.dtype == torch.float8_e4m3fn and kv_fp8.shape == kv.shape
    assert torch.equal(kv, before)  # the input is not touched
    amax = float(kv.abs().max().float())
    assert isinstance(k_scale, float) and k_scale == float(np.float32(amax / FP8_E4M3_MAX))
    assert float(kv_fp8.float().abs().max()) == FP8_E4M3_MAX  # amax lands on 448
    # e4m3: 3 mantissa bits, a relative rounding error <= 2^-4; subnormals (< 2^-6) at most half their step 2^-9
    back = kv_fp8.float() * k_scale
    err = (back - kv.float()).abs()
    bound = torch.maximum(kv.float().abs() * 2.0**-4, torch.full_like(err, 2.0**-10 * k_scale)) * (1 + 1e-6)
    assert bool((err <= bound).all()), float((err / bound).max())
    assert float(err.max()) > 0  # it is a quantization


def test_quantize_fp8_of_zeros_has_scale_one():
    kv_fp8, k_scale = timing.quantize_fp8(torch.zeros(2, 4, 576, dtype=torch.bfloat16))
    assert k_scale == 1.0 and not kv_fp8.float().any()


# ----------------------------------------------------------------------------- bytes, grid, runners


def test_shape_bytes_with_a_one_byte_kv_cache():
    s = Shape(16, 128, 16384)
    kv2 = 128 * 16384 * 576 * 2
    q_out = 128 * 16 * (576 + 512) * 2
    assert s.bytes() == kv2 + q_out
    assert s.bytes(kv_itemsize=1) == kv2 // 2 + q_out
    assert bench.row_bytes(s, FP8) == s.bytes(kv_itemsize=1)
    assert bench.row_bytes(s, "jax.pallas_triton") == bench.row_bytes(s, "torch.fa3") == s.bytes()


def test_fp8_grid_and_runner_are_opt_in():
    assert GRIDS["fp8"] == [Shape(16, 128, 16384), Shape(16, 64, 4096, 2), Shape(16, 32, 16384),
                            Shape(128, 64, 16384), Shape(128, 32, 4096), Shape(16, 1, 1024), Shape(128, 1, 1024)]
    # (fp8_tails: the same kinds of rows with every request's last KV step masked, sequence lengths 64 k - 1)
    assert all(s.seq_len % 64 == 63 for s in GRIDS["fp8_tails"]) and len(GRIDS["fp8_tails"]) == 7
    assert FP8 in RUNNERS and bench.FP8_IMPLS <= set(RUNNERS)
    assert FP8 not in bench.DEFAULT_IMPLS
    # the method in words, as a result records it: the launches, not the trace's or the ceilings' paragraphs
    assert timing.METHOD.startswith("(the same for both stacks") and "CUDA graph" in timing.METHOD
    assert "device trace" not in timing.METHOD and "Ceilings" not in timing.METHOD


def _tiny_inputs(seed=0) -> timing.BenchInputs:
    """A BenchInputs on the CPU (make_inputs draws on the GPU): H=16, 2 requests, q_len 2, page 16."""
    shape = Shape(16, 2, 70, q_len=2, page_size=16)
    config = MLAConfig(num_heads=16, page_size=16, dtype="bfloat16")
    g = torch.Generator().manual_seed(seed)
    pages = -(-shape.seq_len // shape.page_size)
    num_blocks = shape.batch * pages + 1
    block_table = (torch.randperm(num_blocks - 1, generator=g) + 1).view(shape.batch, pages).numpy()
    md = build_decode_metadata(seq_lens=[shape.seq_len] * shape.batch, query_lens=[shape.q_len] * shape.batch,
                               block_table=block_table, config=config, num_blocks=num_blocks)
    kv = torch.randn(num_blocks, 16, 576, generator=g).bfloat16()
    q = torch.randn(4, shape.num_tokens, 16, 576, generator=g).bfloat16()
    return timing.BenchInputs(shape, config, md, q, kv)


def _assert_reference_on_dequantized_cache(inp, out, lse):
    """out / lse of an fp8 runner against the float64 reference on the bench's fp8 cache x k_scale,
    within twice bf16's tolerances."""
    kv_fp8, k_scale = timing.quantize_fp8(inp.kv_cache)
    deq = kv_fp8.float().numpy().astype(np.float64) * k_scale
    ref_out, ref_lse = reference.mla_decode(inp.q[0].float().numpy(), deq, inp.metadata, inp.config)
    tol = TOLERANCES["bfloat16"]
    c_out = compare(np.asarray(out, np.float64), ref_out, rel_tol=2 * tol["out_rel"])
    c_lse = compare(np.asarray(lse), ref_lse, name="lse", abs_tol=2 * tol["lse_abs"])
    assert c_out.ok and c_lse.ok, (c_out.message, c_lse.message)


def test_fp8_runner_in_interpret_mode_is_the_reference_on_the_dequantized_cache(monkeypatch):
    """The fp8 runner's one code path (quantize, the cache through DLPack, k_scale traced, the timed
    fori_loop), in interpret mode: right against the float64 reference on fp8 x k_scale, with the kernel's
    own heuristic tuning."""
    inp = _tiny_inputs()
    tunings = []
    kernel = pallas_triton.mla_decode

    def spy(*args, tuning=None, **kwargs):
        tunings.append(tuning)
        return kernel(*args, tuning=tuning, **kwargs)

    monkeypatch.setattr(pallas_triton, "mla_decode", spy)
    once, time_n = timing.jax_kernel("pallas_triton", fp8=True, interpret=True)(inp)
    out, lse = once()
    assert tunings == [None]  # mla_decode picks the heuristic itself
    assert str(out.dtype) == "bfloat16" and out.shape == (4, 16, 512)
    _assert_reference_on_dequantized_cache(inp, out, lse)
    time_n(4)()  # the timed loop runs too (4 calls per iteration)
    # the bf16 runner on the same inputs: a measurable gap, not zero
    out16, _ = timing.jax_kernel("pallas_triton", interpret=True)(inp)[0]()
    gap = compare(np.asarray(out, np.float64), np.asarray(out16, np.float64)).rel_err
    assert 0 < gap < 0.1


def test_mosaic_fp8_runner_in_interpret_mode_is_the_reference_on_the_dequantized_cache():
    """jax.pallas_mosaic_gpu.fp8's runner (quantize, the cache through DLPack, k_scale into the kernel's schedule
    array), in interpret mode: right against the float64 reference on fp8 x k_scale."""
    pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")
    inp = _tiny_inputs()
    once, _ = timing.jax_kernel("pallas_mosaic_gpu", fp8=True, interpret=True)(inp)
    out, lse = once()
    _assert_reference_on_dequantized_cache(inp, out, lse)


# ----------------------------------------------------------------------------- run_bench --check and summary


def _fake_runner(out, lse):
    def time_n(n):  # a launch of n calls: 10 us each (a busy wait), so the bench's slope is positive
        def run():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < n * 1e-5:
                pass

        return run

    def make(inp):
        return (lambda: (out, lse)), time_n

    return make


@pytest.mark.parametrize("launch_seconds,n", [(25e-3, 2500), (3e-3, 300), (1e-4, 20), (1.0, timing.MAX_CALLS)])
def test_calibrate_sizes_the_launch(monkeypatch, launch_seconds, n):
    # 10 us a call: n = launch / 10 us, a multiple of 4, within [20, MAX_CALLS]
    monkeypatch.setattr(timing, "_median_seconds", lambda run, reps: 20 * 1e-5)
    made = []

    def time_n(k):
        made.append(k)
        return lambda: None

    timer, result = timing.calibrate(lambda inp: ((lambda: "once"), time_n), None, launch_seconds=launch_seconds)
    assert result == "once" and timer.n == n and timer.n % 4 == 0 and made == ([20] if n == 20 else [20, n])


def test_launch_ms_must_be_a_finite_positive_number():
    """Infinite values (inf, 1e400, which float() reads as inf) are refused with the rest: calibration rounds
    launch_ms / a call's time up to a count of calls."""
    assert bench.parse_launch_ms("25") == 25.0 and bench.parse_launch_ms("0.5") == 0.5
    for bad in ("0", "-3", "nan", "fast", "inf", "-inf", "1e400", "infinity"):
        with pytest.raises(ValueError, match=f"launch_ms={bad!r}"):
            bench.parse_launch_ms(bad)


def test_calibrate_rejects_a_launch_of_no_length():
    with pytest.raises(ValueError, match="launch_seconds must be > 0, got launch_seconds=0"):
        timing.calibrate(lambda inp: (None, None), None, launch_seconds=0)


def _fake_bench(monkeypatch, *impls):
    """No inputs built, and fake runners for `impls` that all return one random (out, lse), which it returns."""
    rng = np.random.default_rng(0)
    out = rng.standard_normal((4, 16, 512)).astype(np.float32)
    lse = rng.standard_normal((4, 16)).astype(np.float32)
    monkeypatch.setattr(timing, "make_inputs", lambda shape: None)
    for impl in impls:
        monkeypatch.setitem(RUNNERS, impl, _fake_runner(out, lse))
    return out, lse


def test_check_records_the_fp8_gap_without_judging_it(monkeypatch):
    out, lse = _fake_bench(monkeypatch, "torch.fa3", "jax.pallas_triton")
    monkeypatch.setitem(RUNNERS, FP8, _fake_runner(out * 1.05, lse + 0.02))  # far outside bf16's tolerance
    logged = []
    shape = Shape(16, 4, 1024)
    rows = bench.run_bench([shape], ["torch.fa3", "jax.pallas_triton", FP8], reps=1, check=True, log=logged.append)
    fa3, tri, fp8 = rows
    assert "check_ok" not in fa3 and tri["check_ok"] is True and tri["out_rel_vs_first"] == 0
    assert "check_ok" not in fp8 and fp8["fp8_gap"] is True and fp8["kv_cache_dtype"] == "fp8_e4m3"
    assert fp8["out_rel_vs_first"] == pytest.approx(0.05, rel=1e-3)
    assert fp8["lse_abs_vs_first"] == pytest.approx(0.02, rel=1e-3)
    assert fp8["bytes"] == shape.bytes(kv_itemsize=1) < tri["bytes"] == shape.bytes()
    assert fp8["TBps"] == pytest.approx(fp8["bytes"] / fp8["seconds"] / 1e12)
    assert "fp8 gap vs first (out rel 5.0e-02, lse abs 2.0e-02)" in logged[2]
    assert "speedup_vs_torch.fa3" in fp8


def test_summary_has_fp8_speedup_vs_bf16():
    def row(name, impl, seconds, fa3_seconds, **extra):
        return {"name": name, "impl": impl, "seconds": seconds, "speedup_vs_torch.fa3": fa3_seconds / seconds,
                **extra}

    rows = [
        row("a", "torch.fa3", 10.0, 10.0), row("a", "jax.pallas_triton", 8.0, 10.0),
        row("a", FP8, 4.0, 10.0, fp8_gap=True, out_rel_vs_first=0.03, lse_abs_vs_first=0.01),
        row("b", "torch.fa3", 10.0, 10.0), row("b", "jax.pallas_triton", 10.0, 10.0),
        row("b", FP8, 8.0, 10.0, fp8_gap=True, out_rel_vs_first=0.02, lse_abs_vs_first=0.04),
        row("c", "torch.fa3", 10.0, 10.0), {"name": "c", "impl": FP8, "error": "NotImplementedError: x"},
    ]
    text, out = bench.summary(rows, ["torch.fa3", "jax.pallas_triton", FP8])
    assert out[FP8]["geomean_speedup"] == pytest.approx(math.sqrt(2.5 * 1.25))  # vs FA3, like the others
    s = out["fp8_speedup_vs_bf16"]
    assert s["shapes"] == 2 and s["geomean_speedup"] == pytest.approx(math.sqrt(2.0 * 1.25))
    assert (s["min"], s["max"]) == (1.25, 2.0)
    assert out["fp8_gap_vs_first"] == {"shapes": 2, "max_out_rel": 0.03, "max_lse_abs": 0.04}
    assert "fp8 vs bf16 Triton" in text and "fp8 gap" in text
    # without the bf16 Triton row there is no fp8 speedup entry
    _, out = bench.summary([r for r in rows if r["impl"] != "jax.pallas_triton"], ["torch.fa3", FP8])
    assert "fp8_speedup_vs_bf16" not in out
    # the Mosaic kernel's fp8 row against its bf16 row
    mo = [row("a", "torch.fa3", 10.0, 10.0), row("a", "jax.pallas_mosaic_gpu", 8.0, 10.0),
          row("a", "jax.pallas_mosaic_gpu.fp8", 5.0, 10.0, fp8_gap=True, out_rel_vs_first=0.03, lse_abs_vs_first=0.01)]
    text, out = bench.summary(mo, ["torch.fa3", "jax.pallas_mosaic_gpu", "jax.pallas_mosaic_gpu.fp8"])
    assert out["mosaic_fp8_speedup_vs_bf16"]["geomean_speedup"] == pytest.approx(1.6)
    assert "fp8 vs bf16 Mosaic" in text and "fp8_speedup_vs_bf16" not in out


def test_roofline_draws_fp8_rows_at_their_own_bytes():
    plots = pytest.importorskip("parity.plots")
    pytest.importorskip("matplotlib")
    s = Shape(16, 128, 16384)
    rows = []
    for impl, seconds in (("jax.pallas_triton", 1e-3), (FP8, 6e-4)):
        nbytes = bench.row_bytes(s, impl)
        rows.append({"shape": {"num_heads": 16, "q_len": 1}, "name": s.name, "impl": impl, "bytes": nbytes,
                     "flops": s.flops(), "seconds": seconds, "TBps": nbytes / seconds / 1e12,
                     "TFLOPps": s.flops() / seconds / 1e12})
    fig = plots.roofline_figure({"rows": rows, "impls": ["jax.pallas_triton", FP8]})
    ax_f, ax_b = fig.axes[:2]
    xs = sorted(float(c.get_offsets()[0][0]) for c in ax_b.collections if len(c.get_offsets()))
    assert xs == pytest.approx(sorted(s.flops() / r["bytes"] for r in rows))  # fp8: twice the intensity, nearly


def test_timed_loop_runs_every_call():
    """The JAX timing loop keeps all 4 calls of an iteration alive (none dead, none hoisted):
    the compiled loop body holds 4 dots, and the loop returns every call's result."""
    import functools

    import jax
    import jax.numpy as jnp

    def call(q, w):
        return q @ w, q.sum(-1)

    qs = tuple(jnp.full((8, 16), float(k + 1)) for k in range(4))
    w = jnp.ones((16, 16))
    loop = jax.jit(functools.partial(timing.timed_loop, call, 8))
    hlo = loop.lower(qs, w).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    assert len(dots) == 4 and all("while/body" in line for line in dots), hlo
    results = loop(qs, w)
    assert len(results) == 8
    for k in range(4):
        assert float(results[2 * k][0, 0]) == 16.0 * (k + 1)
    with pytest.raises(ValueError, match="multiple of 4"):
        timing.timed_loop(call, 6, qs, w)


def test_shape_names():
    assert parse_shape("H128_B64_S16384_q1") == Shape(128, 64, 16384, 1)
    assert parse_shape("H16_B1_S1024_P16") == Shape(16, 1, 1024, 1, page_size=16)
    with pytest.raises(ValueError, match="H128_B64_S16384_q1.*got 'B64'"):
        parse_shape("B64")


def test_bench_shapes_picks_named_shapes_of_the_grid():
    """`bench --shapes`: only the named shapes of the grid, in grid order (with --shard, of the shard); a name
    not in the grid fails before anything runs, naming it."""
    names = ["H16_B128_S4096_q2", "H16_B64_S1024_q2"]
    assert [s.name for s in bench.grid_shapes("mosaic_h16_q2", names=names)] == names[::-1]
    assert [s.name for s in bench.grid_shapes("mosaic_h16_q2", (1, 3), names)] == ["H16_B128_S4096_q2"]
    assert len(bench.grid_shapes("mosaic_h16_q2")) == 15
    with pytest.raises(ValueError, match="H16_B64_S1024_q1"):
        bench.grid_shapes("mosaic_h16_q2", names=["H16_B64_S1024_q1"])
    with pytest.raises(ValueError, match="none in shard 0/3"):
        bench.grid_shapes("mosaic_h16_q2", (0, 3), ["H16_B128_S4096_q2"])
    with pytest.raises(ValueError, match="none in grid 'smoke'"):
        bench.grid_shapes("smoke", names=[])


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--shapes", "H16_B1_S1_q1"], "--shapes H16_B1_S1_q1 not in grid 'smoke' (H16_B4_S1024_q1, "),
        (["--shapes", "H16_B4_S1024_q1", "--shard", "1/2"], "--shapes 'H16_B4_S1024_q1': none in shard 1/2"),
    ],
    ids=["not in grid", "not in shard"],
)
def test_bench_shapes_not_in_the_grid_exit_2_naming_them(argv, said, capsys):
    """`bench --shapes` with a name not in the grid (or none in the shard) is refused after parsing, before
    anything runs, as argparse refuses `--grid bogus`: exit 2, the names and the grid on stderr, no traceback."""
    from parity.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--grid", "smoke", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"error: {said}" in err, err


def test_shard_parse_and_merge_rejoin_a_grid(tmp_path):
    """`bench --shard I/N` takes every N-th shape; `python -m parity merge` joins the shards in grid order
    and recomputes the summary over all rows."""
    assert bench.parse_shard("1/2") == (1, 2)
    for bad in ("2/2", "-1/2", "a/b", "1"):
        with pytest.raises(ValueError, match="shard"):
            bench.parse_shard(bad)
    shapes = GRIDS["headline"]
    impls = ["torch.fa3", "jax.pallas_mosaic_gpu"]
    key = "speedup_vs_torch.fa3"

    def shard_result(i, n, ratio):
        rows = []
        for s in shapes[i::n]:
            rows.append({"name": s.name, "impl": "torch.fa3", "seconds": 1.0})
            rows.append({"name": s.name, "impl": "jax.pallas_mosaic_gpu", "seconds": 1.0 / ratio, key: ratio})
        return {"grid": "headline", "impls": impls, "rows": rows, "complete": True, "shard": f"{i}/{n}",
                "unavailable": {}}

    a, b = shard_result(0, 2, 2.0), shard_result(1, 2, 0.5)
    merged = bench.merge([b, a])
    assert [r["name"] for r in merged["rows"]][::2] == [s.name for s in shapes]
    assert merged["complete"] and merged["shards"] == ["1/2", "0/2"]
    n0, n1 = len(shapes[0::2]), len(shapes[1::2])
    expected = math.exp((n0 * math.log(2.0) + n1 * math.log(0.5)) / len(shapes))
    assert merged["summary"]["jax.pallas_mosaic_gpu"]["geomean_speedup"] == pytest.approx(expected)
    assert not bench.merge([a])["complete"]  # half the grid
    with pytest.raises(ValueError, match="impls"):
        bench.merge([a, {**b, "impls": ["torch.fa3"]}])
    with pytest.raises(ValueError, match="xla_flags"):  # shards timed under different XLA flags
        bench.merge([{**a, "xla_flags": ""}, {**b, "xla_flags": "--xla_gpu_enable_pdl=true"}])
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    from parity.__main__ import main

    assert main(["merge", str(pa), str(pb), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["complete"]


def test_cooldown_is_seconds_at_least_zero():
    assert bench.parse_cooldown("0") == 0.0 and bench.parse_cooldown("2.5") == 2.5
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(ValueError, match=f"cooldown={bad!r}"):
            bench.parse_cooldown(bad)


def test_cooldown_idles_before_each_rows_timed_launches(monkeypatch):
    """--cooldown S: every row's timed launches come S seconds of idle after whatever ran before (right after
    FA3's timing the fp8 Mosaic kernel runs 1.16x slower than after 3 s idle); off, nothing sleeps."""
    _fake_bench(monkeypatch, "torch.fa3", "jax.pallas_mosaic_gpu")
    events = []
    monkeypatch.setattr(bench.time, "sleep", lambda s: events.append(("sleep", s)))
    measure = timing.LaunchTimer.measure
    monkeypatch.setattr(timing.LaunchTimer, "measure", lambda self, reps: events.append("measure") or measure(self, reps))
    shapes, impls = [Shape(16, 4, 1024), Shape(16, 8, 1024)], ["torch.fa3", "jax.pallas_mosaic_gpu"]
    rows = bench.run_bench(shapes, impls, reps=1, log=lambda line: None, cooldown_s=2.5)
    assert all("seconds" in r for r in rows) and events == [("sleep", 2.5), "measure"] * 4
    assert all(r["timed_from"] <= r["timed_to"] for r in rows)  # wall-clock bounds, to line up with a clock log
    assert [r["timed_from"] for r in rows] == sorted(r["timed_from"] for r in rows)
    events.clear()
    bench.run_bench(shapes, impls, reps=1, log=lambda line: None)
    assert events == ["measure"] * 4


def test_merge_refuses_results_timed_with_different_cooldowns():
    rows = [{"name": "H16_B1_S1024_q1", "impl": "torch.fa3", "seconds": 1.0}]
    a = {"grid": "mosaic", "impls": ["torch.fa3"], "rows": rows, "complete": True, "unavailable": {}}
    assert len(bench.merge([a, {**a, "cooldown_s": None}])["rows"]) == 2  # 0 s is written as no key
    with pytest.raises(ValueError, match="cooldown_s: None vs 3.0"):
        bench.merge([a, {**a, "cooldown_s": 3.0}])


@pytest.mark.parametrize(
    "content, said",
    [
        (b"[1, 2]", "is not a bench result (a JSON object with a 'rows' list), got a JSON list"),
        (b'"rows"', "is not a bench result (a JSON object with a 'rows' list), got a JSON string"),
        (b'{"grid": "smoke"}', "is not a bench result (a JSON object with a 'rows' list), got an object without a "
                               "'rows' list"),
        (b"\xff\xfe{}", "not UTF-8 text (byte 0xff at offset 0)"),
        (b"{", "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        (b'{"grid": "smoke", "impls": ["torch.fa3"], "rows": [1, 2]}',
         "shard.json: rows[0] must be an object, got rows[0]=1 (a JSON number)"),
        (b'{"grid": "smoke", "impls": "abc", "rows": []}',
         "shard.json: impls must be a non-empty list of names, got impls='abc' (a JSON string)"),
        (b'{"grid": "smoke", "impls": [], "rows": []}',
         "shard.json: impls must be a non-empty list of names, got impls=[] (a JSON list)"),
    ],
    ids=["list", "string", "no rows", "not utf-8", "not json", "rows of numbers", "impls a string", "no impls"],
)
def test_merge_refuses_what_is_not_a_bench_result_in_one_line(content, said, tmp_path, capsys):
    """Each is refused in one line naming the file, before anything is merged or written: rows that are not
    objects and impls that are not a list of names (a string would read as one impl per letter) with the check
    that `plot` makes, plots.check_rows."""
    from parity.__main__ import main

    path, out = tmp_path / "shard.json", tmp_path / "merged.json"
    path.write_bytes(content)
    assert main(["merge", str(path), "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cannot merge: ") and str(path) in err and said in err, err
    assert not out.exists()
    with pytest.raises(ValueError, match=r"^results\[0\] is not a bench result \(a JSON object with a 'rows' list\), got a JSON list$"):
        bench.merge([[1, 2]])


def test_merge_checks_rows_and_impls_as_plot_does():
    """bench.merge refuses rows that are not objects and impls that are not a non-empty list of names, naming the
    result, with plots.check_rows (the check `plot` makes through plots.report_kind)."""
    a = {"grid": "smoke", "impls": ["torch.fa3"], "rows": [{"name": "H16_B4_S1024_q1", "impl": "torch.fa3"}]}
    with pytest.raises(ValueError, match=r"^results\[1\]: rows\[0\] must be an object, got rows\[0\]='a' \(a JSON string\)$"):
        bench.merge([a, {**a, "rows": ["a"]}])
    with pytest.raises(ValueError, match=r"^results\[0\]: impls must be a non-empty list of names, got impls='abc'"):
        bench.merge([{**a, "impls": "abc"}])
    for grid in ("bogus", ["smoke"], None):  # (a list was a TypeError, a name not a grid "no 'bogus' entry")
        with pytest.raises(ValueError, match=r"^grid must be one of the bench's grids \(.*smoke.*\), got grid="):
            bench.merge([{**a, "grid": grid}])
    from parity import plots

    with pytest.raises(ValueError, match=r"^rows\[1\] must be an object, got rows\[1\]=\[1, 2\] \(a JSON list\)$"):
        plots.report_kind({"rows": [{"shape": {}, "impl": "x"}, [1, 2]]})


def test_timeline_summarizes_device_stream_events():
    """parity.timing's trace: only the device planes' stream lines count; busy, span and per-call means in us."""
    from types import SimpleNamespace as NS

    from parity.timing import device_events, summarize

    ev = lambda name, s, d: NS(name=name, start_ns=s, duration_ns=d)  # noqa: E731
    profile = NS(planes=[
        NS(name="/host:CPU", lines=[NS(name="python", events=[ev("host", 0, 1e9)])]),
        NS(name="/device:GPU:0", lines=[
            NS(name="Stream #13(Compute)", events=[ev("mla", 0, 4000), ev("combine", 6000, 2000),
                                                   ev("mla", 10000, 4000), ev("combine", 16000, 2000)]),
            NS(name="XLA Ops", events=[ev("summary", 0, 18000)]),
        ]),
    ])
    events = device_events(profile)
    assert sorted(e[0] for e in events) == ["combine", "combine", "mla", "mla"]
    s = summarize(events, n_calls=2)
    assert s["kernels"] == 4 and s["busy_us"] == pytest.approx(6.0) and s["span_us"] == pytest.approx(9.0)
    assert s["busy_share"] == pytest.approx(12 / 18)
    assert s["top"][0] == dict(name="mla", per_call=1.0, us_per_call=pytest.approx(4.0))
    assert summarize([], 4) == dict(kernels=0)
    w = summarize(events, n_calls=2, window=(-1000.0, 20000.0))  # the launch's host window, ns
    assert w["lead_us"] == pytest.approx(1.0) and w["tail_us"] == pytest.approx(2.0)


def test_timeline_traces_a_launch_with_its_host_window():
    """trace_launch on the CPU: no device events, but the LAUNCH annotation's window around run()."""
    calls = []
    events, window = timing.trace_launch(lambda: calls.append(1))
    assert calls == [1] and events == []
    assert window is not None and window[1] >= window[0]


def test_launch_timer_takes_the_slope_between_launch_lengths(monkeypatch):
    """The bench's time per call t(n) / n keeps what a launch costs once; the slope (t(2n) - t(n)) / n drops it."""
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def launch(n):  # 0.5 ms per launch + 10 us per call
        def run():
            clock[0] += 5e-4 + n * 1e-5

        return run

    per_call, slope = timing.LaunchTimer(launch(20), launch(40), 20).measure(3)
    assert per_call == pytest.approx(1e-5 + 5e-4 / 20) and slope == pytest.approx(1e-5)
    per_call, slope = timing.LaunchTimer(launch(20), launch(20), 20).measure(3)  # noise: no slope
    assert per_call == pytest.approx(1e-5 + 5e-4 / 20) and math.isnan(slope)


def test_trace_adds_the_device_span_and_its_geomean(monkeypatch):
    """--trace: each row gets span / busy seconds per call from the traced launch (parity.timing), each impl
    its span ratio to the baseline, and the summary their geomean beside the host-timed one."""
    _fake_bench(monkeypatch, "torch.fa3", "jax.pallas_mosaic_gpu")
    spans = iter([12e3, 8e3])  # ns per launch of the traced events: FA3, then Mosaic

    def fake_trace(run):
        run()
        return [("k", 100.0, next(spans))], (0.0, 20e3)  # the launch's host window: 0.1 us lead

    monkeypatch.setattr(timing, "trace_launch", fake_trace)
    rows = bench.run_bench([Shape(16, 4, 1024)], ["torch.fa3", "jax.pallas_mosaic_gpu"], reps=1, trace=True,
                           log=lambda line: None)
    fa3, mo = rows
    assert fa3["span_seconds"] == pytest.approx(12e-6 / fa3["n_calls"])
    assert mo["busy_seconds"] == mo["span_seconds"] == pytest.approx(8e-6 / mo["n_calls"])
    assert mo["span_speedup_vs_torch.fa3"] == pytest.approx(fa3["span_seconds"] / mo["span_seconds"])
    assert mo["launch_lead_seconds"] == pytest.approx(0.1e-6) and mo["launch_tail_seconds"] == pytest.approx(11.9e-6)
    text, summ = bench.summary(rows, ["torch.fa3", "jax.pallas_mosaic_gpu"])
    assert summ["jax.pallas_mosaic_gpu"]["span_geomean_speedup"] == pytest.approx(mo["span_speedup_vs_torch.fa3"])
    assert "(device span, --trace)" in text


def test_graph_timer_keeps_what_the_graph_reads_alive(monkeypatch):
    """The replay closure of a torch runner holds fn and q: the captured graph reads their tensors (FA3's
    metadata) at fixed addresses, and once freed a later torch allocation could overwrite them (seen on the
    H200: FA3's replay faulted after quantize_fp8). CUDA streams and graphs are faked: this checks lifetimes."""
    import contextlib
    import gc
    import weakref

    class FakeGraph:
        def replay(self):
            pass

    class FakeStream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, **kw: contextlib.nullcontext())

    class Metadata:  # stands for the tensors fn's closure holds
        pass

    md = Metadata()
    calls = []

    def fn(q, md=md):
        calls.append(q)

    alive = weakref.ref(md)
    time_n = timing._torch_graph_timer(fn, [1, 2, 3, 4])
    run = time_n(8)
    del fn, time_n, md
    gc.collect()
    assert alive() is not None, "the replay closure let go of fn's tensors"
    run()
    assert len(calls) == 3 + 8  # the warm-up and the capture
    del run
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--reps", "0"], ["argument --reps", "'0'"]),
        (["--reps", "-3"], ["argument --reps", "'-3'"]),
        (["--reps", "many"], ["argument --reps", "'many'"]),
        (["--impls", ","], ["argument --impls", "','"]),
        (["--shapes", ","], ["argument --shapes", "','"]),
        (["--launch-ms", "0"], ["argument --launch-ms", "launch_ms='0'"]),
        (["--launch-ms", "inf"], ["argument --launch-ms", "finite", "launch_ms='inf'"]),
        (["--launch-ms", "1e400"], ["argument --launch-ms", "finite", "launch_ms='1e400'"]),
        (["--cooldown", "-1"], ["argument --cooldown", "cooldown='-1'"]),
        (["--shard", "2/2"], ["argument --shard", "shard='2/2'"]),
    ],
)
def test_bench_bad_arguments_fail_at_parse_time_naming_the_option(argv, names, capsys):
    """`bench --reps 0` had reached statistics.median([]) after the warm-up; `--impls ,` had timed the defaults;
    the parse_* errors had printed as "invalid parse_cooldown value". Each now exits 2 at parse time naming the
    option and the value."""
    from parity.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--grid", "smoke", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert all(n in err for n in names), err


def test_median_seconds_refuses_no_reps():
    calls = []
    with pytest.raises(ValueError, match="reps=0"):
        timing._median_seconds(lambda: calls.append(1), 0)
    assert not calls  # refused before the warm-up run


def test_save_writes_the_baseline_of_its_grid_on_the_gpu_kind():
    """--save: benchmarks/<gpu kind>/<grid>.json and .png, the kind from the device's name."""
    assert bench.gpu_kind("NVIDIA H100 80GB HBM3") == "h100"
    assert bench.gpu_kind("NVIDIA H200") == "h200"
    assert bench.gpu_kind("NVIDIA GH200 480GB") == "gh200"
    assert bench.gpu_kind("NVIDIA A100-SXM4-80GB") == "a100"
    assert bench.gpu_kind("Some GPU") == "some-gpu"
    assert bench.baseline_paths("benchmarks", "NVIDIA H200", "mosaic") == ("benchmarks/h200/mosaic.json",
                                                                          "benchmarks/h200/mosaic.png")


def test_save_takes_the_whole_grid_only(tmp_path, capsys):
    """--save with --shard or --shapes is refused before anything runs (a part of a grid is no baseline)."""
    from parity.__main__ import build_parser, main

    args = build_parser().parse_args(["bench", "--grid", "smoke", "--save"])
    assert args.save == bench.BASELINE_DIR == "benchmarks"
    args = build_parser().parse_args(["bench", "--grid", "smoke", "--save", str(tmp_path)])
    assert args.save == str(tmp_path)
    assert main(["bench", "--grid", "smoke", "--save", str(tmp_path), "--shard", "0/2"]) == 2
    assert "the whole grid" in capsys.readouterr().err
    assert main(["bench", "--grid", "smoke", "--save", str(tmp_path / "a" / "b")]) == 2
    assert "missing or not writable" in capsys.readouterr().err


def test_write_json_replaces_the_file_whole(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    bench.write_json({"rows": [1]}, str(path))
    assert json.loads(path.read_text()) == {"rows": [1]} and not (tmp_path / "r.json.tmp").exists()


# ----------------------------------------------------------------------------- ragged shapes and the ragged grid

RAGGED = ("random", "tail", "fewlong")


@pytest.mark.parametrize("dist", RAGGED)
@pytest.mark.parametrize("h,b,s,q", [(16, 64, 4096, 1), (128, 32, 8192, 2), (16, 128, 1024, 3), (64, 7, 3000, 1)])
def test_ragged_seq_lens_are_deterministic_with_the_mean_and_bounds_of_their_distribution(dist, h, b, s, q):
    shape = Shape(h, b, s, q, dist=dist)
    lens = np.array(shape.seq_lens)
    assert shape.seq_lens == Shape(h, b, s, q, dist=dist).seq_lens  # a function of the fields
    assert Shape(h, b, s, q, dist=dist, seed=1).seq_lens != shape.seq_lens
    assert len(lens) == b and lens.dtype.kind == "i" and shape.query_lens == (q,) * b
    assert lens.sum() == shape.kv_tokens == b * s  # seq_len is the exact mean
    assert len(set(lens.tolist())) > 1 and lens.min() >= q
    if dist == "random":
        assert lens.max() <= 2 * s - q
    elif dist == "tail":
        assert lens.max() <= 32 * s and np.median(lens) < s  # skewed: most requests below the mean
    else:
        long, short = np.sort(lens)[-2:], np.sort(lens)[:-2]
        assert 128 <= short.min() and short.max() <= 512 < long.min() and long.max() - long.min() <= 1
        assert long.sum() > lens.sum() / 2  # the 2 long requests hold most of the KV
    assert shape.max_seq_len == lens.max()
    assert shape.num_pages == sum(-(-n // 64) for n in lens.tolist())


def test_ragged_distributions_have_their_spread():
    """On a large batch the draws show their distribution: random's spread is the uniform's (mean / sqrt 3), tail's
    is a lognormal's of sigma 1.1 (CV 1.53, long requests over 5x the mean)."""
    s = 4096
    rand = np.array(Shape(16, 4096, s, dist="random").seq_lens)
    assert rand.std() == pytest.approx(s / math.sqrt(3), rel=0.05)
    tail = np.array(Shape(16, 4096, s, dist="tail").seq_lens)
    assert tail.std() / tail.mean() == pytest.approx(math.sqrt(math.exp(1.1**2) - 1), rel=0.2)
    assert tail.max() > 5 * s and np.median(tail) == pytest.approx(s * math.exp(-1.1**2 / 2), rel=0.1)


def test_uniform_shapes_are_as_before():
    s = Shape(16, 64, 4096, 2)
    assert s.seq_lens == (4096,) * 64 and s.dist == "uniform" and not s.ragged and s.uniform_twin() == s
    assert s.name == "H16_B64_S4096_q2" and s.kv_tokens == 64 * 4096 and s.num_pages == 64 * 64
    assert dataclasses.asdict(s) == dict(num_heads=16, batch=64, seq_len=4096, q_len=2, page_size=64,
                                         dtype="bfloat16", dist="uniform", seed=0)
    assert Shape(16, 64, 4096, seed=5) == Shape(16, 64, 4096)  # a uniform shape draws nothing: seed 0
    assert s.flops() == 2 * 16 * s.num_tokens * 4096 * (512 + 64 + 512)


def test_fit_total_keeps_bounds_and_total():
    from parity.shapes import fit_total

    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.lognormal(0, 2, size=int(rng.integers(1, 50)))
        lo, hi = int(rng.integers(1, 10)), int(rng.integers(10, 1000))
        total = int(rng.integers(len(x) * lo, len(x) * hi + 1))
        out = fit_total(x, total, lo, hi)
        assert out.sum() == total and out.min() >= lo and out.max() <= hi
    assert fit_total([1, 1, 2], 8, 1, 100).tolist() == [2, 2, 4]
    with pytest.raises(ValueError, match="cannot fit 3 lengths in \\[1, 5\\] to a total of 16"):
        fit_total([1, 1, 1], 16, 1, 5)


def test_shapes_refuse_unknown_distributions_and_impossible_fewlong():
    with pytest.raises(ValueError, match="dist must be one of"):
        Shape(16, 4, 1024, dist="zipf")
    with pytest.raises(ValueError, match="fewlong needs long requests longer than 512"):
        Shape(16, 64, 256, dist="fewlong")  # 62 short ones of 128-512 leave too little
    with pytest.raises(ValueError, match="fewlong needs batch > 2"):
        Shape(16, 2, 4096, dist="fewlong")
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        Shape(16, 4, 1024, dist="tail", seed=-1)


def test_every_grid_shape_name_round_trips():
    for grid, shapes in GRIDS.items():
        for s in shapes:
            assert parse_shape(s.name) == s, (grid, s.name)
            assert parse_shape(s.name + "_P32") == dataclasses.replace(s, page_size=32)
    assert Shape(16, 64, 4096, 1, dist="tail").name == "H16_B64_S4096_q1_tail"
    s = parse_shape("H16_B64_S4096_q1_random_s3_P16")
    assert (s.dist, s.seed, s.page_size) == ("random", 3, 16) and s.name == "H16_B64_S4096_q1_random_s3"
    assert parse_shape("H16_B64_S4096_fewlong") == Shape(16, 64, 4096, 1, dist="fewlong")
    for bad in ("H16_B64_S4096_q1_zipf", "H16_B64_S4096_q1_P16_tail", "H16_B64_S4096_q1_s3"):
        with pytest.raises(ValueError, match="shape must look like"):
            parse_shape(bad)


def test_ragged_bytes_and_flops_count_each_requests_length():
    """bytes() and flops() read the requests' own lengths: given other lengths (set here), they follow them."""
    s = Shape(16, 4, 1000, 2, dist="random")
    s.__dict__["seq_lens"] = (10, 20, 30, 5000)  # (seq_lens is a cached property)
    q_out = s.num_tokens * 16 * (576 + 512) * 2
    assert s.kv_tokens == 5060
    assert s.bytes() == 5060 * 576 * 2 + q_out and s.bytes(kv_itemsize=1) == 5060 * 576 + q_out
    assert s.flops() == 2 * 16 * 2 * 5060 * (512 + 64 + 512)
    twin = s.uniform_twin()
    assert twin == Shape(16, 4, 1265, 2) and twin.kv_tokens == s.kv_tokens  # 5060 / 4
    assert twin.bytes() == s.bytes() and twin.flops() == s.flops()
    s.__dict__["seq_lens"] = (10, 20, 30, 4998)
    assert s.uniform_twin().seq_len == 1265  # 1264.5 rounds half up


@pytest.mark.parametrize("dist", RAGGED)
def test_uniform_twin_holds_the_same_kv_tokens(dist):
    s = Shape(128, 32, 8192, 2, page_size=32, dtype="float16", dist=dist, seed=4)
    twin = s.uniform_twin()
    assert twin == Shape(128, 32, 8192, 2, page_size=32, dtype="float16") and twin.kv_tokens == s.kv_tokens
    assert twin.bytes() == s.bytes() and twin.flops() == s.flops() and twin.name == "H128_B32_S8192_q2"


def test_ragged_grid_pairs_every_ragged_shape_with_its_twin():
    grid = GRIDS["ragged"]
    names = [s.name for s in grid]
    assert len(set(names)) == len(names)
    ragged = [s for s in grid if s.ragged]
    assert all(s.uniform_twin() in grid for s in ragged)
    assert all(any(r.uniform_twin() == s for r in ragged) for s in grid if not s.ragged)  # no twin left alone
    assert {s.dist for s in ragged} == set(RAGGED) and len(ragged) >= 15
    assert {s.num_heads for s in grid} == {16, 64, 128} and {s.q_len for s in grid} == {1, 2, 3}
    assert all(32 <= s.batch <= 128 and 1024 <= s.seq_len <= 8192 for s in grid)
    assert all(s.kv_tokens <= 2 << 20 for s in grid)
    assert len(grid) <= 24  # about 20 s a shape with 3 impls on the H100: well under 10 minutes


@pytest.mark.parametrize("name", [s.name for s in GRIDS["ragged"]])
def test_ragged_grid_metadata_builds_on_the_cpu(name):
    """shape_metadata (make_inputs' metadata, without the GPU): per-request lengths, each request's pages once, the
    table as wide as the longest request's pages and padded with block 0."""
    shape = parse_shape(name)
    config = timing.shape_config(shape)
    ids = np.random.default_rng(0).permutation(shape.num_pages).astype(np.int32) + 1
    md = timing.shape_metadata(shape, config, ids)
    assert tuple(md.seq_lens.tolist()) == shape.seq_lens and md.max_seq_len == shape.max_seq_len
    assert np.diff(md.query_start_loc).tolist() == list(shape.query_lens)
    pages = [-(-n // shape.page_size) for n in shape.seq_lens]
    assert md.block_table.shape == (shape.batch, max(pages)) and md.block_table.dtype == np.int32
    used = np.concatenate([md.block_table[r, :n] for r, n in enumerate(pages)])
    assert np.array_equal(used, ids)  # every page once, in order
    assert all(not md.block_table[r, n:].any() for r, n in enumerate(pages))


def test_paged_block_table_of_a_uniform_batch_is_the_reshaped_ids():
    ids = np.arange(1, 13, dtype=np.int32)
    assert np.array_equal(timing.paged_block_table([256] * 3, 64, ids), ids.reshape(3, 4))
    assert timing.paged_block_table([1, 130, 64], 64, ids).tolist() == [[1, 0, 0], [2, 3, 4], [5, 0, 0]]
    with pytest.raises(ValueError, match="holds 2 ids, the requests need 3 pages"):
        timing.paged_block_table([64, 65], 64, ids[:2])


def test_ragged_inputs_run_the_kernel_as_the_reference():
    """A ragged batch through the Triton runner in interpret mode (the bench's code path, metadata from
    shape_metadata): the float64 reference's answer."""
    shape = Shape(16, 5, 40, q_len=2, page_size=16, dist="tail")
    assert len(set(shape.seq_lens)) > 2
    config = MLAConfig(num_heads=16, page_size=16, dtype="bfloat16")
    g = torch.Generator().manual_seed(0)
    ids = (torch.randperm(shape.num_pages, generator=g) + 1).numpy()
    md = timing.shape_metadata(shape, config, ids)
    kv = torch.randn(shape.num_pages + 1, 16, 576, generator=g).bfloat16()
    q = torch.randn(4, shape.num_tokens, 16, 576, generator=g).bfloat16()
    inp = timing.BenchInputs(shape, config, md, q, kv)
    out, lse = timing.jax_kernel("pallas_triton", interpret=True)(inp)[0]()
    ref_out, ref_lse = reference.mla_decode(q[0].float().numpy(), kv.float().numpy().astype(np.float64), md, config)
    tol = TOLERANCES["bfloat16"]
    assert compare(np.asarray(out, np.float64), ref_out, rel_tol=tol["out_rel"]).ok
    assert compare(np.asarray(lse), ref_lse, name="lse", abs_tol=tol["lse_abs"]).ok


def test_run_bench_rows_carry_the_distribution_and_the_twin_ratio(monkeypatch):
    _fake_bench(monkeypatch, "torch.fa3", "jax.pallas_mosaic_gpu")
    twin, tail = Shape(16, 64, 4096), Shape(16, 64, 4096, dist="tail")
    rows = bench.run_bench([twin, tail], ["torch.fa3", "jax.pallas_mosaic_gpu"], reps=1, log=lambda line: None)
    assert [r["shape"]["dist"] for r in rows] == ["uniform"] * 2 + ["tail"] * 2
    for r in rows[2:]:
        assert r["twin"] == twin.name and r["max_seq_len"] == tail.max_seq_len and r["kv_tokens"] == 64 * 4096
        twin_row = next(t for t in rows[:2] if t["impl"] == r["impl"])
        assert r["time_vs_twin"] == pytest.approx(r["seconds"] / twin_row["seconds"])
        assert r["bytes"] == twin_row["bytes"] and r["flops"] == twin_row["flops"]
    assert not any("twin" in r or "time_vs_twin" in r for r in rows[:2])
    json.dumps(rows)  # the rows stay JSON


def _timed_row(shape, impl, seconds, base_seconds, base="torch.fa3"):
    return {"shape": dataclasses.asdict(shape), "name": shape.name, "impl": impl, "seconds": seconds,
            "speedup_vs_" + base: base_seconds / seconds}


def test_summary_reports_ragged_time_against_the_uniform_twin():
    impls = ["torch.fa3", "jax.pallas_mosaic_gpu"]
    twin = Shape(16, 64, 4096)
    rand, tail, few = (Shape(16, 64, 4096, dist=d) for d in RAGGED)
    other = Shape(128, 32, 4096, dist="tail")  # its twin is not timed: no ratio
    times = {  # (FA3, Mosaic) seconds
        twin: (10.0, 8.0), rand: (11.0, 8.0), tail: (10.0, 10.0), few: (12.0, 16.0), other: (5.0, 5.0),
    }
    rows = [_timed_row(s, impl, t[k], t[0]) for s, t in times.items() for k, impl in enumerate(impls)]
    rows.append({"shape": dataclasses.asdict(tail), "name": tail.name, "impl": "jax.pallas_triton",
                 "error": "NotImplementedError: x"})
    text, summ = bench.summary(rows, impls)
    r = summ["ragged_vs_twin"]
    fa3, mo = r["torch.fa3"], r["jax.pallas_mosaic_gpu"]
    assert fa3["shapes"] == 3 and fa3["geomean"] == pytest.approx((1.1 * 1.0 * 1.2) ** (1 / 3))
    assert (fa3["min"], fa3["max"], fa3["within_target"], fa3["target"]) == (1.0, pytest.approx(1.2), 2, 1.15)
    assert mo["geomean"] == pytest.approx((1.0 * 1.25 * 2.0) ** (1 / 3)) and mo["within_target"] == 1
    assert mo["by_dist"]["fewlong"] == {"shapes": 1, "geomean": 2.0, "min": 2.0, "max": 2.0}
    assert list(mo["by_dist"]) == list(RAGGED)
    # against the first impl over the ragged rows alone (the 4 with a row of both, `other` included)
    assert mo["speedup_shapes"] == 4 and "speedup_shapes" not in fa3
    assert mo["geomean_speedup"] == pytest.approx((11 / 8 * 1.0 * 0.75 * 1.0) ** (1 / 4))
    assert (mo["speedup_min"], mo["speedup_max"]) == (0.75, 11 / 8)
    assert "ragged rows against their uniform twins" in text and "2/3" in text and "1/3" in text
    assert "fewlong 2.000 (2.00-2.00)" in text and "(ragged rows only, torch.fa3/impl)" in text
    # the geomean and min / max against the first impl, over all rows, as before
    assert summ["jax.pallas_mosaic_gpu"]["min"] == 0.75 and summ["jax.pallas_mosaic_gpu"]["shapes"] == 5
    # rows without ragged shapes (a baseline written before shapes had a dist) give no ragged section
    old = [{k: v for k, v in row.items() if k != "shape"} | {"shape": {"num_heads": 16, "batch": 64, "seq_len": 4096,
           "q_len": 1, "page_size": 64, "dtype": "bfloat16"}} for row in rows[:2]]
    text, summ = bench.summary(old, impls)
    assert "ragged_vs_twin" not in summ and "ragged" not in text


def test_merge_pairs_ragged_rows_with_twins_of_another_shard():
    """A shard's ragged row and its twin may be timed in different shards: merge recomputes time_vs_twin and the
    summary's ragged section over all rows (and leaves its inputs as they were)."""
    impls = ["torch.fa3"]
    grid = GRIDS["ragged"]

    def shard(i, n):
        rows = [{"shape": dataclasses.asdict(s), "name": s.name, "impl": "torch.fa3",
                 "seconds": 2.0 if s.ragged else 1.0} for s in grid[i::n]]
        return {"grid": "ragged", "impls": impls, "rows": rows, "complete": True, "shard": f"{i}/{n}",
                "unavailable": {}}

    a, b = shard(0, 2), shard(1, 2)
    merged = bench.merge([a, b])
    assert merged["complete"]
    assert all(r["time_vs_twin"] == 2.0 for r in merged["rows"] if r["shape"]["dist"] != "uniform")
    e = merged["summary"]["ragged_vs_twin"]["torch.fa3"]
    assert e["shapes"] == sum(s.ragged for s in grid) and e["geomean"] == pytest.approx(2.0)
    assert not any("time_vs_twin" in r for r in a["rows"] + b["rows"])


def test_committed_baselines_still_summarize_and_plot():
    """The baselines in benchmarks/ (shape dicts without `dist`) read as uniform: no twins, the same summary."""
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "h100" / "fp8.json"
    result = json.loads(path.read_text())
    _, summ = bench.summary(result["rows"], result["impls"])
    assert "ragged_vs_twin" not in summ
    assert summ["jax.pallas_mosaic_gpu"]["geomean_speedup"] == pytest.approx(
        result["summary"]["jax.pallas_mosaic_gpu"]["geomean_speedup"])
    assert all(bench.row_dist(r) == "uniform" and bench.twin_name(r) is None for r in result["rows"])
    plots = pytest.importorskip("parity.plots")
    pytest.importorskip("matplotlib")
    assert plots.twin_ratios(result) == [] and len(plots.roofline_figure(result).axes) == 2


def test_roofline_adds_a_panel_of_ragged_ratios():
    plots = pytest.importorskip("parity.plots")
    pytest.importorskip("matplotlib")
    impls = ["torch.fa3", "jax.pallas_mosaic_gpu"]
    rows = []
    for s in GRIDS["ragged"]:
        for k, impl in enumerate(impls):
            sec = (1.3 if s.ragged else 1.0) * (1 + k) * 1e-4
            rows.append({"shape": dataclasses.asdict(s), "name": s.name, "impl": impl, "bytes": s.bytes(),
                         "flops": s.flops(), "seconds": sec, "TBps": s.bytes() / sec / 1e12,
                         "TFLOPps": s.flops() / sec / 1e12})
    bench_result = {"grid": "ragged", "impls": impls, "rows": rows}
    ratios = plots.twin_ratios(bench_result)
    assert len(ratios) == 2 * sum(s.ragged for s in GRIDS["ragged"])
    assert all(v == pytest.approx(1.3) for _, _, _, v in ratios)
    fig = plots.roofline_figure(bench_result)
    assert len(fig.axes) == 3
    panel = fig.axes[2]
    ys = [y for line in panel.get_lines() for y in line.get_ydata() if line.get_marker() == "o"]
    assert len(ys) == len(ratios) and ys == pytest.approx([1.3] * len(ys))
    assert [t.get_text() for t in panel.texts] == list(RAGGED)  # grouped by distribution
    # H = 64 has its own marker in the legend
    assert {"H=16", "H=64", "H=128"} <= {t.get_text() for t in fig.legends[0].get_texts()}


# ----------------------------------------------------------------------------- sparse grid


def test_sparse_shapes_name_bytes_and_flops():
    from parity.shapes import GRIDS, SparseShape

    s = parse_shape("H128_B64_S65536_q2_top2048")
    assert s == SparseShape(128, 64, 65536, 2, 2048) and s.name == "H128_B64_S65536_q2_top2048"
    assert parse_shape("H16_B1_S8192_q1_top64_P16") == SparseShape(16, 1, 8192, 1, 64, page_size=16)
    assert s.kv_tokens == 128 * 2048 and s.flops() == 2 * 128 * 128 * 2048 * 1088
    io = 128 * 128 * (576 + 512) * 2
    assert s.bytes() == 128 * 2048 * (1152 + 4) + io  # bf16 rows and the int32 indices
    assert bench.row_bytes(s, "torch.flashmla") == 128 * 2048 * (656 + 4) + io  # the fp8_ds_mla layout
    assert bench.row_bytes(s, "torch.fa3") == s.bytes()
    assert not bench.is_fp8(Shape(16, 1, 1024), "torch.flashmla") and bench.is_fp8(s, "torch.flashmla")
    with pytest.raises(ValueError, match="topk must be <= seq_len.*topk=4096, seq_len=2048"):
        SparseShape(16, 1, 2048, 1, 4096)
    grid = GRIDS["sparse"]
    assert len(grid) == 19 and {g.num_heads for g in grid} == {16, 64, 128} and {g.q_len for g in grid} == {1, 2}
    assert all(g.topk == 2048 and 8192 <= g.seq_len <= 131072 and g.batch * g.seq_len <= 1 << 22 for g in grid)


def _tiny_sparse_inputs():
    from parity.shapes import SparseShape

    return timing.make_sparse_inputs(SparseShape(16, 3, 300, q_len=2, topk=70, page_size=16), device="cpu")


def test_sparse_inputs_read_distinct_positions_of_each_tokens_own_request():
    from mla_spec import build_sparse_metadata

    inp = _tiny_sparse_inputs()
    s, idx = inp.shape, inp.sparse.indices.numpy()
    assert idx.shape == (6, 70) and idx.dtype == np.int32 and inp.kv_cache.shape == (3 * 19 + 1, 16, 576)
    build_sparse_metadata(idx, config=inp.config, num_blocks=inp.kv_cache.shape[0])  # valid slots
    blocks = idx // 16
    for t in range(6):
        assert len(set(idx[t])) == 70, "positions repeat within a token"
        owner = {int(b) for b in blocks[t]}
        assert 0 not in owner  # block 0 is nobody's
        # every slot a token reads is in a page of its own request (requests own disjoint blocks)
        others = {int(b) for u in range(6) if u // 2 != t // 2 for b in blocks[u]}
        assert not owner & others
    assert not np.array_equal(idx[0], idx[1]), "a request's two tokens read different picks"


@pytest.mark.parametrize("fp8", [False, True])
def test_jax_sparse_runner_is_the_reference(fp8):
    """The jax sparse runner's code path (the cache through DLPack, fp8: the fp8_ds_mla layout quantized by
    mla_torch, the timed fori_loop) with the jnp path: out / lse against the float64 reference."""
    import mla_torch
    from mla_spec import reference as ref

    inp = _tiny_sparse_inputs()
    once, time_n = timing._jax_sparse("xla", inp, fp8, interpret=True)
    out, lse = once()
    kv = mla_torch.quantize_sparse_fp8(inp.kv_cache).numpy() if fp8 else inp.kv_cache.float().numpy()
    ref_out, ref_lse = ref.sparse_mla_decode(inp.q[0].float().numpy(), kv, inp.sparse.__class__(
        indices=inp.sparse.indices.numpy()), inp.config, cache_format="fp8_ds_mla" if fp8 else "auto")
    tol = TOLERANCES["bfloat16"]
    c_out = compare(np.asarray(out, np.float64), ref_out, rel_tol=tol["out_rel"])
    c_lse = compare(np.asarray(lse), ref_lse, name="lse", abs_tol=tol["lse_abs"])
    assert c_out.ok and c_lse.ok, (c_out.message, c_lse.message)
    time_n(4)()
    with pytest.raises(NotImplementedError, match="no sparse impl 'pallas_nope'"):
        timing._jax_sparse("pallas_nope", inp, fp8, interpret=True)
