"""Execute every notebooks/*.ipynb top to bottom; a failing cell fails its notebook's test.

The notebooks run through the session's ``notebook_runner`` (tests/conftest.py: ``ggviz book``'s executor, each
notebook once per session; the book test in tests/test_browser.py renders the same runs)."""
import pathlib
import re
import sys

import pytest

from ggviz.tools import book

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


EXERCISE = re.compile(r"<div class='ggv-exercise' data-kind='(\w+)'(.*?)</details></div>", re.S)


def exercises(nb, cells: bool = False) -> list:
    """(kind, static HTML) of every exercise a notebook displayed (``Exercise.to_html``); with ``cells``, (kind,
    HTML, the cell that displayed it)."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            html = out.get("data", {}).get("text/html", "")
            found += [(k, h, cell) if cells else (k, h)
                      for k, h in EXERCISE.findall("".join(html) if isinstance(html, list) else html)]
    return found


def gemma_fetched() -> bool:
    from ggviz.fetch import FetchError, resolve_model
    try:
        resolve_model("gemma3-270m")
    except FetchError:
        return False
    return True


def test_exercises_in_every_notebook(notebook_runner):
    """At least three exercises per notebook, one of each kind (predict a number; change, predict, rerun; why),
    30 or more in all, each answer folded in a closed <details> of its static rendering (the book's page); a "why"
    cell, whose source names the right reason, is tagged so that the book leaves its input out (and the live
    notebook collapses it). The runs are the session's (no notebook executed twice)."""
    kinds, total = {}, 0
    for path in NOTEBOOKS:
        if path.stem.startswith("08") and not gemma_fetched():
            continue                  # nb08's exercises are about Gemma-3 (`ggviz fetch gemma3-270m`; CI fetches it)
        found = exercises(notebook_runner(path), cells=True)
        kinds[path.stem] = sorted({k for k, _, _ in found})
        total += len(found)
        assert len(found) >= 3, f"{path.name}: {len(found)} exercises"
        for kind, html, cell in found:
            if kind == "why":             # the right reason is written in the source: the book shows no input
                assert book.ANSWER_TAG in cell.metadata.get("tags", []), f"{path.name}: untagged why cell"
            assert re.search(r"<details(?![^>]*\bopen)[^>]*><summary>[^<]*</summary><div class='ggv-answer'>", html), \
                f"{path.name}: a {kind} exercise whose answer is not folded: {html[:200]}"
            assert "Answer:" not in html.split("<details")[0], f"{path.name}: answer before the fold"
    assert all(k == ["predict", "rerun", "why"] for k in kinds.values()), kinds
    assert total >= 30 - (0 if len(kinds) == len(NOTEBOOKS) else 3), total


def test_exercise_scan_can_fail():
    nbformat = pytest.importorskip("nbformat")
    from ggviz.viz.widgets import Exercise
    cell = nbformat.v4.new_code_cell("e")
    e = Exercise("why?", "b", choices=["a", "b"], kind="why")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": e.to_html()})]
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert [k for k, _ in exercises(nb)] == ["why"]
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "<b>Answer:</b> b"})]
    assert exercises(nb) == []


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


def test_nb01_routing_picks_the_top_probabilities(notebook_runner):
    """nb01 §4's MoE layer picks its experts with ggml_argsort_top_k in the graph: on the page, each token's ids are
    its two largest probabilities (as printed, best first) and its weights are those probabilities -- checkable by
    hand from the router table."""
    nb = notebook_runner(NB_DIR / "01_tensors_and_views.ipynb")
    (text,) = [o["data"]["text/plain"] for c in nb.cells for o in c.get("outputs", [])
               if str(o.get("data", {}).get("text/plain", "")).startswith("the router:")]
    rows = [line.split() for line in text.splitlines()[3:] if line.strip()]
    assert len(rows) == 6
    for r in rows:                       # token, p(expert 0..3), "a,", "b", "wa,", "wb"
        p = [float(v) for v in r[1:5]]
        ids, w = [int(r[5].rstrip(",")), int(r[6])], [r[7].rstrip(","), r[8]]
        rest = [p[e] for e in range(4) if e not in ids]
        assert p[ids[0]] >= p[ids[1]] >= max(rest), r
        assert w == [r[1 + e] for e in ids], r
