"""``ggviz book``: what makes the pages static and offline (the full build is driven in Chromium by
tests/test_browser.py)."""
from __future__ import annotations

import nbformat
import pytest

from ggviz import book


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
