"""Each notebook is a pair: its source notebooks/NN_name.py (jupytext percent format) and notebooks/NN_name.ipynb.

The .py is what is reviewed, linted and edited; the .ipynb, committed without outputs, is what tests/test_notebooks.py
executes. Both carry the jupytext metadata `formats: ipynb,py:percent`, so JupyterLab with jupytext opens either as a
notebook and saves both, and `jupytext --sync notebooks/*.py` brings the older file of each pair up to date.

These tests check that every .py has its .ipynb and vice versa, and that the .ipynb holds the cells of its .py (same
cell types, same sources, no outputs).

Cell ids: jupytext gives a new cell a random id, and `jupytext --sync` keeps the ids the .ipynb already has. The check
tolerates any (unique) ids, so an .ipynb written by JupyterLab or by `jupytext --sync` passes. For a byte-for-byte
reproducible .ipynb, run this file:

    python tests/test_notebook_sources.py      # rewrite every notebooks/*.ipynb from its .py

which writes each .ipynb from its .py alone, without outputs, the cell ids numbered by position ("03-07": notebook 03,
cell 7); the committed notebooks are written that way.
"""
from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
SOURCES = sorted(NB_DIR.glob("*.py"))
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
FORMATS = "ipynb,py:percent"
FIX = "python tests/test_notebook_sources.py"  # rewrites every .ipynb from its .py


def notebook_from_source(py: pathlib.Path):
    """The notebook that py describes, as the canonical .ipynb holds it: no outputs, cell ids "NN-ii"."""
    import jupytext

    nb = jupytext.read(py, fmt="py:percent")
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{py.stem[:2]}-{i:02d}"
    return nb


def canonical_ipynb(py: pathlib.Path) -> str:
    """The text of py's .ipynb, a function of py alone."""
    import jupytext

    text = jupytext.writes(notebook_from_source(py), fmt="ipynb")
    return text if text.endswith("\n") else text + "\n"


def test_every_notebook_has_its_source():
    py = {p.stem for p in SOURCES}
    ipynb = {p.stem for p in NOTEBOOKS}
    assert py, "no notebooks/*.py"
    assert not ipynb - py, (f"notebooks without a .py source: {sorted(ipynb - py)}; "
                            f"create it with `jupytext --set-formats {FORMATS} notebooks/NAME.ipynb`")
    assert not py - ipynb, f"sources without a notebook: {sorted(py - ipynb)}; create it with `{FIX}`"


@pytest.mark.parametrize("py", SOURCES, ids=[p.stem for p in SOURCES])
def test_notebook_matches_its_source(py):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("jupytext")
    ipynb = py.with_suffix(".ipynb")
    if not ipynb.is_file():
        pytest.skip("no .ipynb (test_every_notebook_has_its_source reports it)")
    rel = f"notebooks/{ipynb.name}"
    fix = (f"run `{FIX}` to rewrite it from {py.name} (if you edited the .ipynb rather than the .py, first "
           f"`jupytext --sync notebooks/{ipynb.name}`: it updates the older file of the pair)")

    want = notebook_from_source(py)
    have = nbformat.read(ipynb, as_version=4)
    assert want.metadata.get("jupytext", {}).get("formats") == FORMATS, \
        f"{py.name} is not paired: its header needs `formats: {FORMATS}` (`jupytext --set-formats {FORMATS} {rel}`)"
    assert have.metadata.get("jupytext", {}).get("formats") == FORMATS, f"{rel} is not paired with its .py: {fix}"

    want_cells = [(c.cell_type, c.source) for c in want.cells]
    have_cells = [(c.cell_type, c.source) for c in have.cells]
    if have_cells != want_cells:
        i = next((i for i, (a, b) in enumerate(zip(have_cells, want_cells)) if a != b),
                 min(len(have_cells), len(want_cells)))
        pytest.fail(f"{rel} differs from {py.name}: {len(have_cells)} cells vs {len(want_cells)}, first difference "
                    f"at cell {i}:\n  .ipynb: {have_cells[i] if i < len(have_cells) else None!r:.300}\n"
                    f"  .py:    {want_cells[i] if i < len(want_cells) else None!r:.300}\n{fix}", pytrace=False)

    with_outputs = [i for i, c in enumerate(have.cells)
                    if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not with_outputs, f"{rel} is committed with outputs (cells {with_outputs}): {fix}"
    ids = [c.get("id") for c in have.cells]
    assert None not in ids and len(set(ids)) == len(ids), f"{rel}: missing or repeated cell ids: {fix}"


def main(argv: list[str]) -> int:
    """Rewrite notebooks/NAME.ipynb from notebooks/NAME.py, for the .py files named in argv (default: all)."""
    for py in [pathlib.Path(a).resolve().with_suffix(".py") for a in argv] or SOURCES:
        text = canonical_ipynb(py)
        ipynb = py.with_suffix(".ipynb")
        if not ipynb.is_file() or ipynb.read_text(encoding="utf-8") != text:
            ipynb.write_text(text, encoding="utf-8")
            print(f"wrote {ipynb.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
