"""The notebooks run top to bottom (on a CPU with small shapes) without errors."""

import json
import pathlib
import shutil

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra is not installed")
NotebookClient = pytest.importorskip("nbclient", reason="the notebooks extra is not installed").NotebookClient

NOTEBOOK_DIR = pathlib.Path(__file__).parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def execute(path: pathlib.Path, nb=None):
    """Runs the notebook at `path` (or `nb`, read from it) in its own folder; returns its code cells' outputs."""
    nb = nbformat.read(path, as_version=4) if nb is None else nb
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def text_of(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs)


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"01_walkthrough.ipynb", "02_performance.ipynb", "03_beyond_fa3.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
    outputs = execute(path)
    assert not [o for o in outputs if o.output_type == "error"]
    assert "Traceback" not in text_of(outputs)


def test_walkthrough_executes_with_the_gpu_dtypes():
    """01_walkthrough with SMALL = False (what it sets on a GPU: a bfloat16 config and arrays) runs here too, so
    that its GPU configuration is checked without a GPU."""
    path = NOTEBOOK_DIR / "01_walkthrough.ipynb"
    nb = nbformat.read(path, as_version=4)
    line = 'SMALL = jax.default_backend() == "cpu"'
    [cell] = [c for c in nb.cells if c.cell_type == "code" and line in c.source]
    cell.source = cell.source.replace(line, "SMALL = False")
    outputs = execute(path, nb)
    assert not [o for o in outputs if o.output_type == "error"]
    assert "pallas_triton interpret mode -> True" in text_of(outputs)


def _bench_row(name, impl, heads, q_len, seconds, fa3_seconds):
    shape = {"num_heads": heads, "batch": 8, "seq_len": 4096, "q_len": q_len, "page_size": 64, "dtype": "bfloat16"}
    nbytes = 8 * 4096 * 576 * 2
    flops = 2 * heads * 8 * q_len * 4096 * (576 + 512)
    return {"shape": shape, "name": name, "impl": impl, "bytes": nbytes, "flops": flops, "seconds": seconds,
            "n_calls": 100, "TBps": nbytes / seconds / 1e12, "TFLOPps": flops / seconds / 1e12,
            "timed_from": 1.8e9, "timed_to": 1.8e9 + 1, "speedup_vs_torch.fa3": fa3_seconds / seconds}


def test_performance_notebook_reads_whatever_baselines_exist(tmp_path):
    """02_performance finds every benchmarks/<gpu>/<grid>.json beside its folder, whatever the GPU kinds and grids:
    here two made-up baselines, one with measured ceilings (a roofline) and one without (none drawn)."""
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / "02_performance.ipynb"
    shutil.copy(NOTEBOOK_DIR / path.name, path)
    for gpu, grid, ceilings in (("gpu_a", "grid_x", True), ("gpu_b", "grid_y", False)):
        rows = []
        for name, heads, q_len in (("H16_B8_S4096_q1", 16, 1), ("H128_B8_S4096_q2", 128, 2)):
            rows += [_bench_row(name, "torch.fa3", heads, q_len, 50e-6, 50e-6),
                     _bench_row(name, "jax.pallas_mosaic_gpu", heads, q_len, 40e-6, 50e-6)]
        bench = {"grid": grid, "device": f"made-up {gpu}", "impls": ["torch.fa3", "jax.pallas_mosaic_gpu"],
                 "complete": True, "rows": rows, "summary": {}}
        if ceilings:
            bench.update(copy_TBps=4.0, matmul_TFLOPps=800.0)
        (tmp_path / "benchmarks" / gpu).mkdir(parents=True)
        (tmp_path / "benchmarks" / gpu / f"{grid}.json").write_text(json.dumps(bench))
    outputs = execute(path)
    assert not [o for o in outputs if o.output_type == "error"]
    text = text_of(outputs)
    assert "benchmarks/gpu_a/grid_x.json: grid 'grid_x' on made-up gpu_a" in text
    assert "benchmarks/gpu_b/grid_y.json: no ceilings measured in this run; no roofline" in text
    assert "jax.pallas_mosaic_gpu      geomean 1.250" in text
    assert "ridge 200 FLOPs a byte" in text
    assert sum(o.output_type == "display_data" for o in outputs) == 3  # two ratio plots, one roofline
