"""tools/triton_sass.py on the CPU: the Triton kernel compiled for sm_90 by the installed Triton."""

import re

import pytest


def test_triton_sass_compiles_the_triton_kernel_for_sm90_here(capsys):
    """python -m tools.triton_sass: lowered for an abstract H200, compiled by the installed Triton, and
    its SASS counted: the fp8 tile is converted (F2F / F2FP), a 16-row tile runs mma.sync (HMMA)."""
    pytest.importorskip("triton", reason="the triton package (installed with torch on Linux) is needed")
    from tools import triton_sass

    assert triton_sass.main(["--shape", "H16_B1_S1024_q1", "--fp8"]) == 0
    out = capsys.readouterr().out
    regs = int(re.search(r"registers (\d+)", out).group(1))
    assert 0 < regs <= 255, out
    counts = dict((op, int(n)) for op, n in re.findall(r"([A-Z][A-Z0-9]*) (\d+)", out.splitlines()[-1]))
    assert counts.get("HMMA", 0) > 0, out  # a 16-row tile: mma.sync
    assert any(op.startswith("F2F") for op in counts), out


def test_triton_sass_refuses_a_ragged_shape(capsys):
    """Its lowering takes every request seq_len long: a ragged shape is refused, naming its uniform twin."""
    from parity.shapes import parse_shape
    from tools import triton_sass

    assert triton_sass.main(["--shape", "H16_B64_S4096_q1_tail"]) == 2
    assert "its uniform twin: H16_B64_S4096_q1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="uniform batches only"):
        triton_sass.triton_module(parse_shape("H16_B64_S4096_q1_fewlong"), False, {})
