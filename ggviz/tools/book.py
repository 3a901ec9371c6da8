"""ggviz book: the notebooks, executed, as a browsable offline site -- a handout that needs no kernel and no network.

    ggviz book -o book/ [--only 00_quickstart 04_allocator] [--timeout 600] [--executed DIR]

Not a mirror of ggml: the classroom side of ggviz. Each ``notebooks/NN_name.ipynb`` runs top to bottom in a fresh
kernel (nbclient, this interpreter, the notebooks folder as its working directory), then is written as
``NN_name.html`` by nbconvert's HTML exporter, and ``index.html`` links them with their titles. ``--executed DIR``
takes notebooks executed already (``DIR/NN_name.ipynb``, e.g. saved from JupyterLab after "Run All") instead of
running them again; each must hold the same cells as the one in ``notebooks/`` and have run every code cell.

The pages are static: every ggviz view puts its static rendering (``to_html``: HTML, SVG, PNG) in its mime bundle
beside the live widget, and the book keeps that one -- it drops the widget views and the widget state, which would
need a kernel and a widget manager loaded from the network -- and leaves out the scripts nbconvert would fetch from a
CDN (RequireJS, MathJax), so a page opens from a USB stick the same as from a web server.
"""
from __future__ import annotations

import argparse
import copy
import html
import importlib.resources
import json
import os
import pathlib
import re
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbconvert import HTMLExporter
from traitlets.config import Config

from .. import fetch
from ..progress import progress

# the index page's stylesheet (a package file, like the report's: no CSS in Python strings)
_INDEX_CSS = importlib.resources.files("ggviz").joinpath("templates", "book", "index.css").read_text("utf-8").strip()

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


class BookError(RuntimeError):
    """A notebook could not be built into the book (a cell failed, or none was found)."""


def notebooks(folder=NOTEBOOK_DIR, only=None) -> list[pathlib.Path]:
    """The notebooks of ``folder`` in order, or those named in ``only`` (stems like ``04_allocator``)."""
    paths = sorted(pathlib.Path(folder).glob("*.ipynb"))
    if only:
        by_stem = {p.stem: p for p in paths}
        missing = [n for n in only if pathlib.Path(n).stem not in by_stem]
        if missing:
            raise BookError(f"no notebook named {', '.join(missing)} in {folder} (have: {', '.join(by_stem)})")
        paths = [by_stem[pathlib.Path(n).stem] for n in only]
    if not paths:
        raise BookError(f"no notebooks in {folder}")
    return paths


def _kernel_dir(tmp: pathlib.Path) -> pathlib.Path:
    """A kernelspec ``python3`` that is this interpreter (a user-wide one may point at another Python)."""
    spec = tmp / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ggviz book)", "language": "python"}))
    return tmp


def execute(path: pathlib.Path, timeout: int = 600):
    """Run a notebook top to bottom in a fresh kernel; returns the executed notebook."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="ggviz-book-") as tmp:
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(_kernel_dir(pathlib.Path(tmp))), old]))
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        except CellExecutionError as e:
            raise BookError(f"{path.name}: a cell failed:\n{e}") from e
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old
    return nb


def make_static(nb) -> int:
    """Keep each output's static rendering only: drop the widget views (and the saved widget state). Returns how
    many widget views were dropped; raises if one had no static rendering to fall back on."""
    dropped = 0
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
                dropped += 1
                if not any(str(data.get(m, "")).strip() for m in ("text/html", "image/png", "image/svg+xml")):
                    raise BookError(f"cell {i} displays a widget with no static rendering")
    nb.metadata.get("widgets", {}).pop(WIDGET_STATE, None)
    nb.metadata.pop("widgets", None)
    return dropped


def read_executed(folder, path: pathlib.Path):
    """The executed copy of notebook ``path`` in ``folder``: refused if it is missing, holds other cells than
    ``path`` (a stale copy), or has a code cell that did not run."""
    got = pathlib.Path(folder) / path.name
    if not got.is_file():
        raise BookError(f"{got}: no executed copy of {path.name} there")
    nb = nbformat.read(got, as_version=4)
    want = nbformat.read(path, as_version=4)
    src = [(c.cell_type, c.source) for c in nb.cells]
    ref = [(c.cell_type, c.source) for c in want.cells]
    if src != ref:
        i = next((i for i, (a, b) in enumerate(zip(src, ref)) if a != b), min(len(src), len(ref)))
        raise BookError(f"{got}: not the cells of {path} (they differ from cell {i} on): execute it again")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.strip() and cell.get("execution_count") is None:
            raise BookError(f"{got}: cell {i} has not been executed: run the whole notebook first")
    return nb


def title_of(nb, default: str) -> str:
    """The first markdown heading of the notebook."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return default


ANSWER_TAG = "answer-in-source"      # a cell whose source names an exercise's answer (a "why" choice): no input shown


def _exporter() -> HTMLExporter:
    cfg = Config()
    cfg.TagRemovePreprocessor.enabled = True
    cfg.TagRemovePreprocessor.remove_input_tags = {ANSWER_TAG}
    exp = HTMLExporter(template_name="lab", config=cfg)
    exp.exclude_input_prompt = False
    # offline: no RequireJS (only widgets need it, and the book has none) and no MathJax from a CDN
    exp.require_js_url = ""
    exp.mathjax_url = ""
    exp.widget_renderer_url = ""
    return exp


def _offline(page: str) -> str:
    """Remove the scripts that would load from the network (nbconvert adds some unconditionally: RequireJS,
    the mermaid module)."""
    out, pos = [], 0
    while True:
        i = page.find("<script", pos)
        if i < 0:
            out.append(page[pos:])
            return "".join(out)
        j = page.find(">", i)
        tag = page[i:j + 1]
        end = page.find("</script>", j) + len("</script>")
        out.append(page[pos:i])
        script = page[i:end]
        if "http://" in script or "https://" in script or 'src=""' in tag:
            pos = end                      # loads (or would load) from the network: leave it out
        else:
            out.append(script)
            pos = end


def build_book(out_dir, only=None, folder=NOTEBOOK_DIR, timeout: int = 600,
               disable_progress: bool | None = None, executed=None) -> list[pathlib.Path]:
    """Execute the notebooks and write the site into ``out_dir``; returns the pages (index first).

    ``executed``: where the executed notebooks come from instead of running each here -- a folder (see
    ``read_executed``) or a function ``path -> executed notebook`` (the test suite's, which has run them already);
    the notebook it gives is copied, not changed."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = notebooks(folder, only)
    exp = _exporter()
    entries, pages = [], []
    with progress(total=len(paths), desc="ggviz book", unit="notebook", disable=disable_progress) as bar:
        for path in paths:
            bar.set_postfix_str(path.stem, refresh=True)
            t0 = time.perf_counter()
            if executed is None:
                nb = execute(path, timeout)
            elif callable(executed):
                nb = copy.deepcopy(executed(path))
            else:
                nb = read_executed(executed, path)
            n_views = make_static(nb)
            body, _ = exp.from_notebook_node(nb)
            page = out / f"{path.stem}.html"
            page.write_text(_offline(body), encoding="utf-8")
            pages.append(page)
            entries.append((page.name, title_of(nb, path.stem), n_views, time.perf_counter() - t0))
            bar.update(1)
    rows = "\n".join(f"<li><a href='{html.escape(name)}'>{html.escape(title)}</a> "
                     f"<small>({n} views, "
                     + (f"ran in {dt:.0f} s" if executed is None else "executed beforehand") + ")</small></li>"
                     for name, title, n, dt in entries)
    index = out / "index.html"
    index.write_text("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>ggviz notebooks</title>"
                     f"<style>{_INDEX_CSS}</style>"
                     "</head><body><h1>ggviz: how ggml and llama.cpp run a language model</h1>"
                     "<p>The notebooks of ggviz, executed on a real model. Every figure is static: no kernel and "
                     f"no network needed.</p><ol>\n{rows}\n</ol></body></html>", encoding="utf-8")
    return [index] + pages


_NEEDS_MODEL = re.compile(r"""resolve_model\(\s*["']([\w.-]+)["']""")


def needed_models(paths) -> dict[str, list[str]]:
    """The registry models (besides the default one) that the notebooks load by name
    (``resolve_model("gemma3-270m")``), each with the notebooks that need it."""
    names = fetch.registry()
    need: dict[str, list[str]] = {}
    for path in paths:
        for m in _NEEDS_MODEL.findall(pathlib.Path(path).with_suffix(".py").read_text(encoding="utf-8")
                                      if pathlib.Path(path).with_suffix(".py").is_file() else ""):
            if m in names and m != fetch.DEFAULT_MODEL and path.stem not in need.setdefault(m, []):
                need[m].append(path.stem)
    return need


def fetch_needed(paths) -> None:
    """Fetch (licence notice, progress bar) every model a notebook of ``paths`` needs and that is not here yet, so
    that no page is built without what it shows; BookError (two lines) when one cannot be fetched."""
    for name, stems in needed_models(paths).items():
        try:
            fetch.resolve_model(name)                # here and verified: nothing to do
            continue
        except fetch.FetchError:
            pass
        print(f"ggviz book: {', '.join(stems)} need{'s' if len(stems) == 1 else ''} {name}: fetching it",
              file=sys.stderr)
        try:
            fetch.fetch_model(name, quiet=False)
        except fetch.FetchError as e:
            raise BookError(f"{', '.join(stems)} need{'s' if len(stems) == 1 else ''} {name}, which could not be "
                            f"fetched ({str(e).splitlines()[0]}).\nRun `ggviz fetch {name}`, or build the book "
                            f"without {'it' if len(stems) == 1 else 'them'}: --only NAME ...") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ggviz book", description="execute the notebooks and write them as a "
                                 "browsable offline site")
    ap.add_argument("-o", "--out", default="book", help="output folder (default: book)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these notebooks (e.g. 00_quickstart)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a cell may run (default 600)")
    ap.add_argument("--executed", metavar="DIR", help="take the notebooks already executed in DIR (same names) "
                    "instead of running them")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if a.executed is None:
            fetch_needed(notebooks(only=a.only))
        pages = build_book(a.out, a.only, timeout=a.timeout, executed=a.executed)
    except BookError as e:
        print(f"ggviz book: {e}", file=sys.stderr)
        return 1
    print(f"{pages[0]}  ({len(pages) - 1} notebooks, {time.perf_counter() - t0:.0f} s) -- open it in a browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
