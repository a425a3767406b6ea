"""tools/mosaic_sass.py (a design aid): Mosaic GPU PTX assembled on any machine with Triton's ptxas, and the loops of
its SASS. The end-to-end case reads a ring probe's PTX dumped on the GPU machine (tools/tests/data) and finds what
the GPU machine's ptxas found for it: no spills, 40 wgmmas in warpgroup 0's step."""

import os

import pytest

from tools import mosaic_sass

SASS = """
        /*0100*/                   MOV R1, c[0x0][0x28] ;
        /*0110*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0120*/                   R2UR UR4, R2 ;
        /*0130*/              @P1 BRA 0x110 ;
        /*0140*/                   EXIT ;
        /*0150*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR24+0x38800], RZ ;
        /*0160*/              @!P1 BRA 0x150 ;
        /*0170*/                   BRA 0x100 ;
"""


def test_loops_are_the_predicated_backward_branches():
    found = mosaic_sass.loops(SASS)
    assert [(lp["start"], lp["end"]) for lp in found] == [(0x110, 0x130), (0x150, 0x160)]
    first = found[0]
    assert first["instructions"] == 3
    assert first["counts"]["HGMMA"] == 1 and first["counts"]["R2UR"] == 1 and first["counts"]["BRA"] == 1


def test_with_version():
    assert mosaic_sass.with_version(".version 9.0\n.target sm_90a\n", "8.7") == ".version 8.7\n.target sm_90a\n"
    with pytest.raises(ValueError, match="no .version line"):
        mosaic_sass.with_version(".target sm_90a\n", "8.7")


def test_not_ptx_is_refused_before_ptxas(tmp_path):
    with pytest.raises(ValueError, match="not PTX: no .version line"):
        mosaic_sass.assemble(".target sm_90a\n", str(tmp_path))


PROBE_PTX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "probe-ring.ptx.gz")


def test_the_ring_probe_assembles_as_on_the_gpu_machine(tmp_path):
    pytest.importorskip("triton")
    try:
        mosaic_sass.tools()
    except RuntimeError as e:
        pytest.skip(str(e))
    out = mosaic_sass.assemble(mosaic_sass.read_ptx(PROBE_PTX), str(tmp_path))
    assert out["spill_stores"] == 0 and out["spill_loads"] == 0
    assert 150 < out["registers"] < 255  # (194 on the GPU machine's ptxas, 196 on Triton 3.6's)
    wgmma_loops = [lp for lp in mosaic_sass.loops(out["sass"]) if lp["counts"]["HGMMA"]]
    # warpgroup 0's step: the scores' 36 wgmmas and its P @ V half's 4; warpgroup 1's: its half's 4
    assert sorted(lp["counts"]["HGMMA"] for lp in wgmma_loops) == [4, 40]
