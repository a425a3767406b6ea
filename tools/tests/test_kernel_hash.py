"""tools/kernel_hash.py: the fingerprint grid, one lowering, and the comparison of two fingerprint files."""

import json

from tools import kernel_hash


def test_the_grid_spans_heads_q_lens_pages_caches_and_batches():
    problems = kernel_hash.problems()
    assert len(problems) == 1200
    assert {p[0] for p in problems} == set(kernel_hash.HEADS)
    assert {p[3] for p in problems} == {1, 2, 3, 4}
    assert {p[4] for p in problems} == set(kernel_hash.PAGES)
    assert {p[5] for p in problems} == {"bf16", "fp16", "fp8"}
    quick = kernel_hash.problems(quick=True)
    assert 30 < len(quick) < 60 and set(quick) <= set(problems)


def test_fingerprints_are_the_same_twice_and_differ_between_problems():
    """The kernels' and the call's (StableHLO around them) fingerprints: stable in one process, different for another
    cache dtype; the call's text keeps each custom call's target but none of its payload."""
    fp8 = kernel_hash.fingerprints((16, 2, 300, 1, 16, "fp8"))
    assert sorted(fp8) == ["H16_B2_S300_q1_p16_fp8", "H16_B2_S300_q1_p16_fp8#xla"]
    assert all(len(v) == 64 for v in fp8.values())
    assert fp8 == kernel_hash.fingerprints((16, 2, 300, 1, 16, "fp8"))
    bf16 = kernel_hash.fingerprints((16, 2, 300, 1, 16, "bf16"))
    assert set(bf16.values()).isdisjoint(fp8.values())
    texts, hlo = kernel_hash.lowered_texts((16, 1, 1024, 1, 64, "bf16"))  # split-KV: the Triton combine follows
    assert len(texts) == 1 and "custom_call @mosaic_gpu" in hlo and "custom_call @__gpu$xla.gpu.triton" in hlo
    assert "kernel_hash =" not in hlo and " ir = " not in hlo  # neither kernel's payload (they carry source paths)


def test_compare_names_each_problem_that_differs(tmp_path, capsys):
    before, after = tmp_path / "b.json", tmp_path / "a.json"
    before.write_text(json.dumps({"x": "1" * 64, "y": "2" * 64}))
    after.write_text(json.dumps({"x": "1" * 64, "y": "3" * 64, "z": "4" * 64}))
    assert kernel_hash.main(["--compare", str(before), str(after)]) == 1
    out = capsys.readouterr().out
    assert "DIFF y" in out and "1 of 2 problems lower to the same text (1 in one file only)" in out
    assert kernel_hash.main(["--compare", str(before), str(before)]) == 0
