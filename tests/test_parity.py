"""The parity harness: comparator, scenarios, runner and CLI."""

import json
import os
import pathlib
import sys

import numpy as np
import pytest

from parity.__main__ import main
from parity.compare import compare, compare_out_lse
from parity.scenarios import SCENARIOS, make_batch, round_to

# ----------------------------------------------------------------------------- comparator


def test_compare_reports_worst_position():
    b = np.zeros((3, 4, 5))
    b[...] = 1.0
    a = b.copy()
    a[2, 1, 3] += 0.5
    c = compare(a, b, rel_tol=1e-3)
    assert not c.ok
    assert c.worst_index == (2, 1, 3)
    assert c.max_abs_err == pytest.approx(0.5)
    assert "(2, 1, 3)" in c.message and "rel_err" in c.message


def test_compare_nan_positions_must_match():
    b = np.ones(10)
    a = b.copy()
    a[4] = np.nan
    c = compare(a, b, rel_tol=1.0)
    assert not c.ok and c.worst_index == (4,) and "NaN positions differ" in c.message
    both = compare(a, a.copy(), rel_tol=0.0)
    assert both.ok  # NaN in the same place on both sides, the rest equal


def test_compare_inf_sign_matters():
    a, b = np.array([np.inf, 1.0]), np.array([-np.inf, 1.0])
    assert not compare(a, b).ok


def test_compare_shape_mismatch_fails():
    assert not compare(np.ones(3), np.ones(4)).ok


def test_compare_cosine():
    b = np.arange(1.0, 11.0)
    assert compare(b * 1.0001, b, cos_tol=1 - 1e-9).ok  # scaled: cosine 1, rel err 1e-4
    assert not compare(b * 1.0001, b, rel_tol=1e-5).ok
    assert not compare(b[::-1].copy(), b, cos_tol=0.99).ok


def test_compare_out_lse_uses_dtype_tolerances():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 16, 512))
    lse = rng.standard_normal((4, 16))
    noisy = ref * (1 + 4e-3 * rng.standard_normal(ref.shape))
    assert all(c.ok for c in compare_out_lse(noisy, lse, ref, lse, "bfloat16"))
    assert not compare_out_lse(noisy, lse, ref, lse, "float16")[0].ok
    assert not compare_out_lse(ref, lse + 2e-3, ref, lse, "bfloat16")[1].ok


# ----------------------------------------------------------------------------- scenarios


def test_scenarios_cover_the_table():
    scs = SCENARIOS.values()
    assert {s.page_size for s in scs} >= {1, 16, 64}
    assert {s.num_heads for s in scs} >= {16, 128}
    assert max(max(s.query_lens) for s in scs) == 8
    lens = {x for s in scs for x in s.seq_lens}
    assert {1, 17, 33, 97} <= lens and max(lens) >= 1024


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_batches_poison_every_unreadable_slot(name):
    b = make_batch(SCENARIOS[name], "bfloat16")
    P = b.config.page_size
    readable = np.zeros(b.kv_cache.shape[:2], bool)
    for r, seq_len in enumerate(b.scenario.seq_lens):
        pos = np.arange(seq_len)
        readable[b.metadata.block_table[r, pos // P], pos % P] = True
    assert not readable[0].any(), "block 0 stays unused"
    assert np.isnan(b.kv_cache[~readable]).all()
    assert np.isfinite(b.kv_cache[readable]).all()
    np.testing.assert_array_equal(b.q, round_to(b.q, "bfloat16"))


def test_make_batch_is_deterministic():
    a = make_batch(SCENARIOS["spec_decode"], "float16", seed=3)
    b = make_batch(SCENARIOS["spec_decode"], "float16", seed=3)
    np.testing.assert_array_equal(a.q, b.q)
    np.testing.assert_array_equal(a.metadata.block_table, b.metadata.block_table)


# ----------------------------------------------------------------------------- CLI


def test_cli_runs_references_and_writes_json(tmp_path, capsys):
    path = tmp_path / "report.json"
    rc = main(["--scenarios", "single_token,spec_decode_page_16", "--impls", "torch.reference,numpy.reference,jax.xla",
               "--dtypes", "bfloat16", "--json", str(path), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "spec_decode_page_16" in out and "4 passed, 0 failed" in out
    report = json.loads(path.read_text())
    assert {r["impl"] for r in report["rows"]} == {"numpy.reference", "jax.xla"}
    assert all(r["status"] == "pass" for r in report["rows"])


def test_cli_exit_code_is_nonzero_on_failure(monkeypatch, capsys):
    from parity import compare as compare_mod

    tight = {k: dict(v, out_rel=0.0) for k, v in compare_mod.TOLERANCES.items()}
    monkeypatch.setattr(compare_mod, "TOLERANCES", tight)
    rc = main(["--scenarios", "spec_decode", "--impls", "torch.reference,numpy.reference", "--dtypes", "bfloat16",
               "--quiet"])
    assert rc == 1
    assert "FAIL" in capsys.readouterr().out


def test_cli_refuses_a_run_that_compares_nothing(monkeypatch, capsys):
    """`--impls torch.reference` compared nothing and reported "0 passed" with exit 0."""
    from parity import runner

    monkeypatch.setattr(runner, "environment", lambda: pytest.fail("ran before refusing"))
    for impls in ("torch.reference", "torch.reference,torch.reference"):
        assert main(["--impls", impls, "--scenarios", "single_token", "--quiet"]) == 2
        captured = capsys.readouterr()
        assert "passed" not in captured.out
        err = captured.err.strip()
        assert "\n" not in err and err.startswith("error: nothing to compare: the implementations given "
                                                  "(torch.reference) are only the baseline torch.reference"), err
    with pytest.raises(ValueError, match="nothing to compare"):
        runner.run_parity([SCENARIOS["single_token"]], ["bfloat16"], ["torch.reference"])


def test_cli_rejects_unknown_names(capsys):
    assert main(["--scenarios", "nope", "--quiet"]) == 2
    assert main(["--impls", "torch.reference,jax.magic", "--scenarios", "single_token", "--quiet"]) == 2


def test_cli_help_and_list(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "bench" in capsys.readouterr().out
    assert main(["list"]) == 0
    assert "heads_128_spec" in capsys.readouterr().out


def test_bench_without_gpu_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only message")
    assert main(["bench", "--grid", "smoke"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


# ----------------------------------------------------------------------------- progress


def test_progress_is_a_tqdm_bar_of_the_items_done(capsys):
    """The CLI's progress: a tqdm bar on stderr that counts the items done and names the one running; report lines
    go to stdout around it; --quiet shows nothing."""
    from parity.runner import Progress

    p = Progress(3)
    p("a")
    assert p.bar.n == 0 and "a" in p.bar.postfix
    p("b")
    assert p.bar.n == 1 and "b" in p.bar.postfix
    p.log("a finished row")
    p("c")
    p.close()
    assert p.bar.n == 3
    assert capsys.readouterr().out == "a finished row\n"
    q = Progress(2, enabled=False)
    q("x")
    q.close()
    assert capsys.readouterr().err == ""


def test_num_items_counts_the_non_baseline_impls():
    from parity.runner import BASELINE, num_items

    assert num_items(["a", "b"], ["bfloat16", "float16"], [BASELINE, "torch.fa3", "jax.xla"]) == 8
    assert num_items(["a"], ["bfloat16"], ["jax.xla"]) == 1


# ----------------------------------------------------------------------------- PNGs

BENCH_JSON = pathlib.Path(__file__).parent.parent / "benchmarks" / "h200" / "triton.json"  # the triton grid's baseline


def _assert_png(path, min_bytes=20_000):
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert len(data) > min_bytes, f"{path} is only {len(data)} bytes"


def test_cli_writes_the_error_distribution_png(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the notebooks extra (matplotlib) is not installed")
    png, js = tmp_path / "errors.png", tmp_path / "report.json"
    rc = main(["--scenarios", "single_token,spec_decode_page_16,heads_128_spec", "--impls",
               "torch.reference,numpy.reference,jax.xla", "--dtypes", "bfloat16,float16", "--json", str(js),
               "--png", str(png), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"wrote {png} (error distributions)" in out
    _assert_png(png)
    assert json.loads(js.read_text())["rows"]


def test_cli_without_matplotlib_says_so_and_still_writes_the_json(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` now raises ImportError
    png, js = tmp_path / "errors.png", tmp_path / "report.json"
    rc = main(["--scenarios", "single_token", "--impls", "torch.reference,jax.xla", "--dtypes", "bfloat16",
               "--json", str(js), "--png", str(png), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.out
    assert "matplotlib is not installed" in captured.err and str(png) in captured.err
    assert not png.exists()
    assert json.loads(js.read_text())["rows"][0]["status"] == "pass"
    assert main(["plot", str(BENCH_JSON), "--png", str(png)]) == 2  # nothing else to do: a failure
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_roofline_from_the_committed_bench_uses_the_anchor_ceilings(tmp_path):
    pytest.importorskip("matplotlib", reason="the notebooks extra (matplotlib) is not installed")
    from parity import plots

    bench = json.loads(BENCH_JSON.read_text())
    assert "copy_TBps" not in bench  # written before the bench measured its own ceilings
    assert plots.report_kind(bench) == "bench"
    copy, mm, source = plots.ceilings(bench)
    assert (copy, mm) == (4.26, 788.0) and "anchors" in source
    fig = plots.roofline_figure(bench)
    assert "anchors" in fig.get_suptitle() and "4.26 TB/s" in fig.get_suptitle()
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "arithmetic intensity" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "copy 4.26 TB/s" in labels and "bf16 matmul 788 TFLOP/s" in labels
    assert any(s.startswith("torch.fa3 (60 shapes)") for s in labels)
    assert sum(len(c.get_offsets()) for c in ax.collections) == 180  # one marker per (impl, shape)
    path = tmp_path / "roofline.png"
    assert "anchors" in plots.write_png(bench, path)
    _assert_png(path)


def test_roofline_uses_measured_ceilings_when_the_bench_has_them():
    pytest.importorskip("matplotlib", reason="the notebooks extra (matplotlib) is not installed")
    from parity import plots

    bench = dict(json.loads(BENCH_JSON.read_text()), copy_TBps=4.0, matmul_TFLOPps=700.0)
    assert plots.ceilings(bench) == (4.0, 700.0, "measured in this run")
    title = plots.roofline_figure(bench).get_suptitle()
    assert "copy 4.00 TB/s, matmul 700 TFLOP/s (measured in this run)" in title


def test_speed_ratios_from_the_committed_bench():
    from parity import plots

    bench = json.loads(BENCH_JSON.read_text())
    ratios = plots.speed_ratios(bench, "torch.fa3")
    assert set(ratios) == {"torch.flashmla", "jax.pallas_triton"} and len(ratios["jax.pallas_triton"]) == 60
    gm = plots.geomean(v for _, v in ratios["jax.pallas_triton"])
    assert gm == pytest.approx(bench["summary"]["jax.pallas_triton"]["geomean_speedup"])  # the bench's own summary
    vs_flashmla = plots.speed_ratios(bench, "torch.flashmla")
    assert set(vs_flashmla) == {"torch.fa3", "jax.pallas_triton"}


def test_plot_subcommand_draws_committed_results(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the notebooks extra (matplotlib) is not installed")
    roof, err, report = tmp_path / "roofline.png", tmp_path / "errors.png", tmp_path / "report.json"
    assert main(["--scenarios", "single_token", "--impls", "torch.reference,jax.xla", "--dtypes", "bfloat16",
                 "--json", str(report), "--quiet"]) == 0
    assert main(["plot", str(BENCH_JSON), "--png", str(roof)]) == 0
    assert main(["plot", str(report), "--png", str(err)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {roof} (roofline; ceilings anchors'" in out and f"wrote {err} (error distributions)" in out
    _assert_png(roof)
    _assert_png(err)


def test_plot_subcommand_refuses_what_it_cannot_draw(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"something": 1}]}))
    assert main(["plot", str(bad), "--png", str(tmp_path / "x.png")]) == 2
    assert "neither a parity report nor a bench result" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing.json"), "--png", str(tmp_path / "x.png")]) == 2
    assert "cannot read" in capsys.readouterr().err
    latin = tmp_path / "latin1.json"  # not UTF-8: had raised UnicodeDecodeError with a traceback
    latin.write_bytes(b'{"rows": "caf\xe9"}')
    assert main(["plot", str(latin), "--png", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err == f"cannot read {latin}: not UTF-8 text (byte 0xe9 at offset 13)\n", err
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    assert main(["plot", str(listed), "--png", str(tmp_path / "x.png")]) == 2
    assert "expected a JSON object" in capsys.readouterr().err
    numbers = tmp_path / "numbers.json"
    numbers.write_text(json.dumps({"rows": [1, 2]}))
    assert main(["plot", str(numbers), "--png", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err == f"{numbers}: rows[0] must be an object, got rows[0]=1 (a JSON number)\n"
    letters = tmp_path / "letters.json"  # impls as one string: a list of names is what `merge` and `plot` read
    letters.write_text(json.dumps({**json.loads(BENCH_JSON.read_text()), "impls": "abc"}))
    assert main(["plot", str(letters), "--png", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err == f"{letters}: impls must be a non-empty list of names, got impls='abc' (a JSON string)\n", err
    with pytest.raises(SystemExit):  # --png is required
        main(["plot", str(BENCH_JSON)])
    assert not (tmp_path / "x.png").exists()


def test_bench_ceilings_refuse_cleanly_without_a_gpu(tmp_path, capsys):
    import torch

    from parity import timing

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only refusal")
    with pytest.raises(RuntimeError, match="measure_ceilings needs a CUDA GPU"):
        timing.measure_ceilings()
    png, js = tmp_path / "roofline.png", tmp_path / "bench.json"
    assert main(["bench", "--grid", "smoke", "--png", str(png), "--json", str(js)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert not png.exists() and not js.exists()


def test_bench_arguments():
    from parity.__main__ import build_parser

    args = build_parser().parse_args(["bench", "--grid", "smoke", "--png", "r.png", "--no-ceilings"])
    assert (args.grid, args.png, args.no_ceilings) == ("smoke", "r.png", True)
    assert build_parser().parse_args(["bench"]).no_ceilings is False


# ----------------------------------------------------------------------------- CLI: bad arguments


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--seed", "-1"], ["argument --seed", "'-1'"]),
        (["check", "--seed", "x"], ["argument --seed", "'x'"]),
        (["--impls", ","], ["argument --impls", "','"]),
        (["--scenarios", ","], ["argument --scenarios", "','"]),
        (["check", "--dtypes", ""], ["argument --dtypes", "''"]),
    ],
)
def test_cli_bad_values_name_their_option(argv, names, capsys):
    """A bad value fails at parse time (exit 2) with a message naming the option and the value (a negative seed
    had failed in NumPy as "error: expected non-negative integer"; `--impls ,` had run the defaults)."""
    with pytest.raises(SystemExit) as e:
        main(argv + ["--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert all(n in err for n in names), err


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "{missing}/report.json"],
        ["check", "--png", "{missing}/errors.png"],
        ["--json", "{tmp}"],  # a directory
        ["bench", "--json", "{missing}/bench.json"],
        ["bench", "--png", "{missing}/roofline.png"],
        ["plot", "{bench}", "--png", "{missing}/roofline.png"],
        ["merge", "{bench}", "--json", "{missing}/merged.json"],
        ["merge", "{bench}", "--json", "{tmp}/merged.json", "--png", "{missing}/roofline.png"],
    ],
)
def test_cli_refuses_an_unwritable_output_path_before_running(argv, tmp_path, capsys, monkeypatch):
    """Every output path (--json, --png of check, bench, plot, merge) is checked before anything runs: a missing
    directory exits 2 naming the option and the path, rather than a FileNotFoundError after the whole run."""
    from parity import runner

    monkeypatch.setattr(runner, "run_parity", lambda *a, **k: pytest.fail("ran before checking the output path"))
    missing = tmp_path / "no_such_dir"
    argv = [a.format(missing=missing, tmp=tmp_path, bench=BENCH_JSON) for a in argv]
    with pytest.raises(SystemExit) as e:
        main(argv + (["--quiet"] if argv[0] in ("--json", "check") else []))
    assert e.value.code == 2
    err = capsys.readouterr().err
    bad = next(a for a in argv if a.startswith(str(missing)) or a == str(tmp_path))
    opt = argv[argv.index(bad) - 1]
    assert f"argument {opt}" in err and repr(bad) in err, err
    assert not (tmp_path / "merged.json").exists()


def _special_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return [str(fifo)] + (["/dev/full"] if os.path.exists("/dev/full") else [])


@pytest.mark.parametrize("argv", [["{opt}", "{path}", "--quiet"], ["check", "{opt}", "{path}", "--quiet"],
                                  ["bench", "--grid", "smoke", "{opt}", "{path}"]])
def test_cli_refuses_a_special_file_as_output_before_running(argv, tmp_path, capsys, monkeypatch):
    """`--json /dev/full` ran the whole check, then lost its results to "No space left on device"."""
    from parity import bench as bench_mod
    from parity import runner

    monkeypatch.setattr(runner, "run_parity", lambda *a, **k: pytest.fail("ran before checking the output path"))
    monkeypatch.setattr(bench_mod, "main", lambda *a, **k: pytest.fail("ran before checking the output path"))
    for path in _special_files(tmp_path):
        for opt in ("--json", "--png"):
            with pytest.raises(SystemExit) as e:
                main([arg.format(opt=opt, path=path) for arg in argv])
            assert e.value.code == 2
            err = capsys.readouterr().err
            assert f"argument {opt}: cannot write {path!r}: it is not a regular file" in err, err


def test_cli_says_so_when_the_report_cannot_be_written(tmp_path, capsys, monkeypatch):
    """A write that fails after the run (a full disk) is one line naming the path and exit 2, not a traceback."""
    import builtins

    from parity import bench as bench_mod
    from parity import runner

    path = tmp_path / "report.json"
    real_open = builtins.open

    def full_disk(file, mode="r", *a, **k):
        if str(file) == str(path) and "w" in mode:
            raise OSError(28, "No space left on device")
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", full_disk)
    row = runner.Row("single_token", "bfloat16", "jax.xla", runner.BASELINE, "skip", note="stand-in")
    monkeypatch.setattr(runner, "run_parity", lambda *a, **k: [row])
    assert bench_mod.check_output_path(str(path)) is None
    assert main(["--impls", "torch.reference,jax.xla", "--scenarios", "single_token", "--json", str(path), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert "0 passed, 0 failed, 1 skipped" in captured.out  # the table was printed before the write
    assert captured.err == f"cannot write {path}: [Errno 28] No space left on device\n", captured.err
