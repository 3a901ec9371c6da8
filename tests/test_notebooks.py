"""Execute every notebooks/*.ipynb top to bottom; a failing cell fails its notebook's test."""
import os
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 600


@pytest.fixture
def this_python_kernel(tmp_path, monkeypatch):
    """Make kernel `python3` this interpreter (a user-wide `python3` kernelspec may point elsewhere)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ggviz tests)",
        "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))  # searched before all other kernel dirs
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def run_notebook(path, cwd=NB_DIR):
    """Execute the notebook at path in kernel `python3`, cwd as its working directory."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell failed:\n{e}", pytrace=False)
    return nb


WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def static_gaps(nb) -> list[str]:
    """Outputs that show a live widget with no static rendering beside it (blank on GitHub, nbviewer, in an
    nbconvert HTML page or a printed handout): each as 'cell N'."""
    gaps = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_MIME in data and not any(str(data.get(m, "")).strip() for m in ("text/html", "image/png",
                                                                                       "image/svg+xml")):
                gaps.append(f"cell {i}")
    return gaps


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, this_python_kernel):
    """Every notebook runs top to bottom, and every view it displays carries a static rendering."""
    nb = run_notebook(path)
    assert not static_gaps(nb), f"{path.name}: widget outputs without a static rendering: {static_gaps(nb)}"


def test_static_gap_check_can_fail():
    nbformat = pytest.importorskip("nbformat")
    cell = nbformat.v4.new_code_cell("w")
    cell.outputs = [nbformat.v4.new_output("display_data", data={WIDGET_MIME: {"model_id": "x"}, "text/plain": "W"})]
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert static_gaps(nb) == ["cell 0"]
    cell.outputs[0]["data"]["text/html"] = "<img src='data:image/png;base64,AA'>"
    assert static_gaps(nb) == []


def test_harness_reports_failing_cell(tmp_path, this_python_kernel):
    """The harness itself: runs in this venv's kernel, in the right cwd, and reports a failing cell."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import os, sys, ggviz; print(os.getcwd()); print(sys.executable)"),
        nbformat.v4.new_code_cell("raise ValueError('boom from cell 2')"),
    ]
    path = tmp_path / "failing.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(pytest.fail.Exception) as ei:
        run_notebook(path, cwd=tmp_path)
    assert "failing.ipynb" in str(ei.value) and "boom from cell 2" in str(ei.value)
    nb.cells.pop()
    nbformat.write(nb, path)
    out = run_notebook(path, cwd=tmp_path).cells[0].outputs[0]["text"].split()
    assert out == [str(tmp_path), sys.executable]
