"""The notebooks run top to bottom (on a CPU with small shapes) without errors."""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra is not installed")
NotebookClient = pytest.importorskip("nbclient", reason="the notebooks extra is not installed").NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"01_walkthrough.ipynb", "02_performance.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Traceback" not in text


def test_walkthrough_executes_with_the_gpu_dtypes():
    """01_walkthrough with SMALL = False (what it sets on a GPU: a bfloat16 config and arrays) runs here too, so
    that its GPU configuration is checked without a GPU (session 34: it passed float32 arrays to a bfloat16 config)."""
    path = pathlib.Path(__file__).parent.parent / "notebooks" / "01_walkthrough.ipynb"
    nb = nbformat.read(path, as_version=4)
    line = 'SMALL = jax.default_backend() == "cpu"'
    [cell] = [c for c in nb.cells if c.cell_type == "code" and line in c.source]
    cell.source = cell.source.replace(line, "SMALL = False")
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "pallas_triton interpret mode -> True" in text
