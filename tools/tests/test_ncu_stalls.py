"""tools/ncu_stalls.py: the stall summary of an ncu SASS source page (CPU only)."""

import gzip
import pathlib

import pytest

from tools import ncu_stalls

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_wait", "stall_short_sb", "stall_selected", "stall_wait (Not Issued)"]


def _page(tmp_path, rows, name="page.csv.gz"):
    text = "\n".join([",".join(['"Kernel Name"', '"k"']), ",".join(f'"{h}"' for h in HEADER)]
                     + [",".join(f'"{c}"' for c in r) for r in rows]) + "\n"
    path = tmp_path / name
    with gzip.open(path, "wt") as f:
        f.write(text)
    return str(path)


ROWS = [["0x0", "LDSM.16.M88.4 R1, [R2]", 2, 2, 10, 2, 0, 0, 2],
        ["0x10", "F2FP.F16.E4M3.UNPACK_B R3, R1", 6, 5, 10, 0, 5, 1, 0],
        ["0x20", "F2FP.F16.E4M3.UNPACK_B R4, R1.H1", 1, 0, 10, 0, 0, 1, 0],
        ["0x30", "@!P1  BRA 0x0", 1, 1, 10, 1, 0, 0, 1],
        ["0x40", "EXIT", 0, 0, 1, 0, 0, 0, 0]]


def test_summary_counts_reasons_and_opcodes(tmp_path):
    header, rows = ncu_stalls.read_page(_page(tmp_path, ROWS))
    s = ncu_stalls.summary(header, rows)
    assert s["samples"] == 10 and s["executed"] == 41
    assert dict(s["reasons"]) == {"stall_wait": 3, "stall_short_sb": 5, "stall_selected": 2}  # (not "Not Issued")
    assert s["opcode_samples"]["F2FP"] == 7 and s["opcode_executed"]["F2FP"] == 20
    assert s["opcode_samples"]["BRA"] == 1  # (the predicate stripped)
    assert ncu_stalls.loops(header, rows, min_len=2) == [(0, 3, 10)]


def test_cli_prints_the_summary_and_a_range(tmp_path, capsys):
    path = _page(tmp_path, ROWS)
    assert ncu_stalls.main([path, "--loops", "--range", "1:3"]) == 0
    out = capsys.readouterr().out
    assert "stall_short_sb" in out and "50.0%" in out and "F2FP" in out
    assert "F2FP.F16.E4M3.UNPACK_B R3, R1" in out and "EXIT" not in out.split("SASS")[-1]


def test_refuses_other_pages(tmp_path):
    p = tmp_path / "other.csv"
    p.write_text('"a","b"\n"c","d"\n')
    with pytest.raises(ValueError, match="not an ncu SASS source page"):
        ncu_stalls.read_page(str(p))
    assert ncu_stalls.main([_page(tmp_path, [r[:2] + [0, 0] + r[4:5] + [0, 0, 0, 0] for r in ROWS], "zero.csv.gz")]) == 1


def test_a_page_from_the_gpu_machine():
    """An H200 page of the 16-row fp8 kernel (H16 B128 S16384): its samples and stall reasons, read whole."""
    page = pathlib.Path(__file__).parent / "data" / "sass_jax.pallas_mosaic_gpu.fp8.csv.gz"
    header, rows = ncu_stalls.read_page(str(page))
    s = ncu_stalls.summary(header, rows)
    assert s["samples"] == 36496 and s["executed"] == 127051720
    assert s["reasons"]["stall_short_sb"] == 8993 and s["reasons"]["stall_wait"] == 10123
