"""The parity harness: comparator, scenarios, runner and CLI."""

import json

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
