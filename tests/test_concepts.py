"""docs/concepts.md, the curriculum's concepts and where each is shown, kept honest.

* Its legend defines every mark a row uses, and the count it states per mark is the table's.
* Each ● row ("interactive, from a real run") names where: ``nbNN §K `View``` -- and a view of that class
  (``ggviz.viz``'s, whose output names it: ``data-ggv-view``) is displayed in section K of notebook NN: in the
  executed notebook's outputs (the session's runs, tests/conftest.py's ``notebook_runner``: nothing executed twice)
  and in the book's page (tests/test_browser.py builds the book from the same runs and calls ``book_problems``).
"""
from __future__ import annotations

import html
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "concepts.md"
NB_DIR = ROOT / "notebooks"
MARKS = "●◐○✗"
NOTEBOOK = re.compile(r"nb(\d\d)((?:(?!nb\d\d).)*)")        # "nbNN" and what follows, up to the next "nbNN"
SECTION = re.compile(r"§(\d+)[^`§]*?`(\w+)`")               # "§K ... `View`", no other § between
VIEW_ATTR = re.compile(r"data-ggv-view=['\"](\w+)['\"]")      # (the book's HTML writer re-quotes attributes)


def rows(text: str) -> list[tuple[str, str, str]]:
    """(concept, where, mark) of each row of the table (the header and its rule left out)."""
    out = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| concept") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            out.append((cells[0], cells[1], cells[-1]))
    return out


def table_problems(text: str) -> list[str]:
    """The legend and the stated counts against the rows."""
    found = rows(text)
    intro = text.split("\n| ", 1)[0]
    out = []
    for concept, where, mark in found:
        if mark not in MARKS:
            out.append(f"{concept!r}: mark {mark!r} is not one of {MARKS}")
        if mark == "●" and not _places_in(where):
            out.append(f"{concept!r}: a ● row must name where a view shows it: nbNN §K `View`, got {where!r}")
    for m in sorted({m for _, _, m in found}):
        if f"**{m}**" not in intro:
            out.append(f"the legend does not define {m}")
    stated = dict((m, int(n)) for n, m in re.findall(r"(\d+) ([" + MARKS + "])", intro))
    counts = {m: sum(r[2] == m for r in found) for m in MARKS if any(r[2] == m for r in found)}
    if stated != counts:
        out.append(f"the text states {stated}, the table has {counts}")
    m = re.search(r"(\d+) concepts", intro)
    if not m or int(m.group(1)) != len(found):
        out.append(f"the text states {m.group(0) if m else 'no count of concepts'}, the table has {len(found)} rows")
    return out


def _places_in(where: str) -> list[tuple[str, int, str]]:
    """("NN", K, View) for each "nbNN §K `View`" of a row's where ("nb04 §1 `A`, §2 `A`" names two)."""
    return [(nb, int(k), view) for nb, rest in NOTEBOOK.findall(where) for k, view in SECTION.findall(rest)]


def places(text: str) -> list[tuple[str, str, int, str]]:
    """(concept, notebook stem prefix "NN", section K, view class) named by each ● row."""
    return [(c, nb, k, view) for c, where, mark in rows(text) if mark == "●" for nb, k, view in _places_in(where)]


def _section_of(heading: str) -> int | None:
    m = re.match(r"\s*(\d+)\b", heading)
    return int(m.group(1)) if m else None


def notebook_views(nb) -> dict[int, set[str]]:
    """The view classes each numbered ``## K.`` section of an executed notebook displays."""
    out: dict[int, set[str]] = {}
    sec = None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("## "):
                    sec = _section_of(line[3:])
            continue
        for o in cell.get("outputs", []):
            h = o.get("data", {}).get("text/html", "")
            h = "".join(h) if isinstance(h, list) else h
            if sec is not None:
                out.setdefault(sec, set()).update(VIEW_ATTR.findall(h))
    return out


def page_views(page: str) -> dict[int, set[str]]:
    """The same, read from a book page (nbconvert's HTML: each ``## K.`` an <h2>)."""
    out: dict[int, set[str]] = {}
    parts = re.split(r"<h2\b[^>]*>", page)
    for part in parts[1:]:
        head = html.unescape(re.sub(r"<[^>]+>", "", part.split("</h2>", 1)[0]))
        sec = _section_of(head)
        if sec is not None:
            out.setdefault(sec, set()).update(VIEW_ATTR.findall(part))
    return out


def missing(text: str, views_of) -> list[str]:
    """The ● places whose view is not displayed: ``views_of(nn)`` gives a notebook's {section: views}."""
    out, got = [], {}
    for concept, nb, k, view in places(text):
        if nb not in got:
            got[nb] = views_of(nb)
        if view not in got[nb].get(k, set()):
            out.append(f"{concept!r}: no {view} displayed in nb{nb} §{k} (there: {sorted(got[nb].get(k, set()))})")
    return out


def book_problems(pages) -> list[str]:
    """``missing`` on the book's pages (called by tests/test_browser.py's book test, which builds them)."""
    by_nb = {p.name[:2]: p for p in pages if p.name[:2].isdigit()}
    return missing(TABLE.read_text(encoding="utf-8"),
                   lambda nb: page_views(by_nb[nb].read_text(encoding="utf-8")) if nb in by_nb else {})


def test_concept_table_is_consistent():
    problems = table_problems(TABLE.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_concept_table_check_can_fail():
    ok = ("3 concepts: 1 ●, 1 ◐, 1 ✗. **●** live **◐** static **✗** missing\n\n| concept | where | |\n|---|---|---|\n"
          "| a | nb01 §4 `TensorExplorer` | ● |\n| b | nb02 §1 | ◐ |\n| c | — | ✗ |\n")
    assert table_problems(ok) == []
    assert len(table_problems(ok.replace("3 concepts", "4 concepts"))) == 1
    assert len(table_problems(ok.replace("**✗** missing", ""))) == 1
    assert len(table_problems(ok.replace("| b | nb02 §1 | ◐ |", "| b | nb02 §1 | ● |"))) == 2  # no view; counts
    assert places(ok) == [("a", "01", 4, "TensorExplorer")]
    assert _places_in("nb02 §1 (a table), §4 `ArenaWidget`; nb09 §3 `P`, §4 `H` (§1 text)") == [
        ("02", 4, "ArenaWidget"), ("09", 3, "P"), ("09", 4, "H")]
    nbformat = __import__("nbformat")
    cells = [nbformat.v4.new_markdown_cell("## 4. Views"), nbformat.v4.new_code_cell("v")]
    cells[1].outputs = [nbformat.v4.new_output("display_data", data={
        "text/html": "<div class='ggv-out' data-ggv-view='TensorExplorer'><svg></svg></div>"})]
    nb = nbformat.v4.new_notebook(cells=cells)
    assert missing(ok, lambda n: notebook_views(nb)) == []
    cells[0].source = "## 3. Elsewhere"
    assert len(missing(ok, lambda n: notebook_views(nb))) == 1
    page = '<h2 id="x">4. Views<a>¶</a></h2><div data-ggv-view="TensorExplorer"></div><h2>5. Next</h2>'
    assert missing(ok, lambda n: page_views(page)) == []
    assert len(missing(ok, lambda n: page_views(page.replace("4. Views", "5. Views")))) == 1


def test_each_interactive_concept_is_displayed_live(notebook_runner):
    """Each ● row's view, in its section of the executed notebook (the session's runs)."""
    paths = {p.stem[:2]: p for p in sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))}
    problems = missing(TABLE.read_text(encoding="utf-8"), lambda nb: notebook_views(notebook_runner(paths[nb])))
    assert not problems, "\n".join(problems)
