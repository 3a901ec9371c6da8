"""Execute every notebooks/*.ipynb top to bottom; a failing cell fails its notebook's test.

The notebooks run through the session's ``notebook_runner`` (tests/conftest.py: ``ggviz book``'s executor, each
notebook once per session; the book test in tests/test_browser.py renders the same runs)."""
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
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
def test_notebook_runs(path, notebook_runner):
    """Every notebook runs top to bottom, and every view it displays carries a static rendering."""
    nb = notebook_runner(path)
    assert not static_gaps(nb), f"{path.name}: widget outputs without a static rendering: {static_gaps(nb)}"


def test_static_gap_check_can_fail():
    nbformat = pytest.importorskip("nbformat")
    cell = nbformat.v4.new_code_cell("w")
    cell.outputs = [nbformat.v4.new_output("display_data", data={WIDGET_MIME: {"model_id": "x"}, "text/plain": "W"})]
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert static_gaps(nb) == ["cell 0"]
    cell.outputs[0]["data"]["text/html"] = "<img src='data:image/png;base64,AA'>"
    assert static_gaps(nb) == []


def test_harness_reports_failing_cell(tmp_path, notebook_runner):
    """The harness itself: runs in this venv's kernel, importing this checkout's ggviz, in the right cwd, and
    reports a failing cell."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import os, sys, ggviz; print(os.getcwd()); print(sys.executable); "
                                  "print(ggviz.__file__)"),
        nbformat.v4.new_code_cell("raise ValueError('boom from cell 2')"),
    ]
    path = tmp_path / "failing.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(pytest.fail.Exception) as ei:
        notebook_runner.run(path)
    assert "failing.ipynb" in str(ei.value) and "boom from cell 2" in str(ei.value)
    nb.cells.pop()
    nbformat.write(nb, path)
    out = notebook_runner.run(path).cells[0].outputs[0]["text"].split()
    assert out == [str(tmp_path), sys.executable, str(ROOT / "ggviz" / "__init__.py")]
