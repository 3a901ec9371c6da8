"""ggviz book: the notebooks, executed, as a browsable offline site -- a handout that needs no kernel and no network.

    ggviz book -o book/ [--only 00_quickstart 04_allocator] [--timeout 600] [--executed DIR]

Not a mirror of ggml: the classroom side of ggviz. Each ``notebooks/NN_name.ipynb`` runs top to bottom in a fresh
kernel (nbclient, this interpreter, the notebooks folder as its working directory), then is written as
``NN_name.html`` by nbconvert's HTML exporter, and ``index.html`` links them with their titles. ``--executed DIR``
takes notebooks executed already (``DIR/NN_name.ipynb``, e.g. saved from JupyterLab after "Run All") instead of
running them again; each must hold the same cells as the one in ``notebooks/`` and have run every code cell.

Each ggviz view puts its static rendering (``to_html``: HTML, SVG, PNG) in its mime bundle beside the live widget;
a view that can run without a kernel also puts its recording there (``BOOK_MIME``: its widget's traits and the
recorded answers to every interaction; the kernels run here set ``GGVIZ_BOOK=1`` to ask for it). The book drops the
widget views and the widget state, which would need a kernel and a widget manager loaded from the network, and
writes each recorded view as its static picture plus the recording (gzip + base64 above 16 KB); the page carries
each ES module it needs once (the widget's own, from ggviz/templates/widgets/) and book_model.js, which runs them on
the recording: stepping, selecting, panning work in the page, from a USB stick the same as from a web server. The
scripts nbconvert would fetch from a CDN (RequireJS, MathJax) are left out. ``ggviz book`` prints each page's weight;
a page over ``PAGE_BUDGET`` bytes is named in the output.
"""
from __future__ import annotations

import argparse
import base64
import copy
import gzip
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
from ..viz.widgets._base import BOOK_MIME, template

# the index page's stylesheet (a package file, like the report's: no CSS in Python strings)
_INDEX_CSS = importlib.resources.files("ggviz").joinpath("templates", "book", "index.css").read_text("utf-8").strip()
_PRINT_CSS = importlib.resources.files("ggviz").joinpath("templates", "book", "print.css").read_text("utf-8").strip()

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PAGE_BUDGET = 6 * 1024 * 1024           # bytes a page may weigh (school laptops, file:// from a USB stick)
_PLAIN_MAX = 16 * 1024                  # a recording up to this size is embedded as plain JSON, larger ones gzipped


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
        # the kernel inherits this environment: its kernelspec, and GGVIZ_BOOK=1 (the views add their recordings)
        env = {"JUPYTER_PATH": os.pathsep.join(filter(None, [str(_kernel_dir(pathlib.Path(tmp))),
                                                             os.environ.get("JUPYTER_PATH")])), "GGVIZ_BOOK": "1"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        except CellExecutionError as e:
            raise BookError(f"{path.name}: a cell failed:\n{e}") from e
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return nb


def _view_html(rec: dict, static: str) -> str:
    """A recorded view in the page: its static picture (shown until the script starts it, and in print) and its
    recording."""
    raw = json.dumps(rec, separators=(",", ":"))
    if len(raw) <= _PLAIN_MAX:
        body, enc = raw.replace("</", "<\\/"), "json"          # (JSON allows "\/": no "</script" inside)
    else:
        body, enc = base64.b64encode(gzip.compress(raw.encode("utf-8"), 6, mtime=0)).decode("ascii"), "gzip+base64"
    return (f"<div class='ggv-view' data-ggv-esm='{html.escape(rec['esm'])}'><div class='ggv-static'>{static}</div>"
            f"<script type='application/json' class='ggv-payload' data-ggv data-encoding='{enc}'>{body}</script>"
            "</div>")


def make_static(nb, modules: set | None = None) -> int:
    """Keep each output's static rendering: drop the widget views (and the saved widget state); an output with a
    recording (``BOOK_MIME``) becomes its static picture plus the recording, and the ES modules and stylesheets it
    needs are added to ``modules``. Returns how many views there were (widget views dropped, recordings); raises if one had no static
    rendering to fall back on."""
    dropped = 0
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if BOOK_MIME in data and WIDGET_VIEW not in data:
                dropped += 1                       # a view that displayed only its recording (frames.js views)
            if WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
                dropped += 1
                if not any(str(data.get(m, "")).strip() for m in ("text/html", "image/png", "image/svg+xml")):
                    raise BookError(f"cell {i} displays a widget with no static rendering")
            if BOOK_MIME in data:
                rec = data.pop(BOOK_MIME)
                data["text/html"] = _view_html(rec, str(data.get("text/html", "")))
                if modules is not None:
                    modules.update(x for x in (rec["esm"], rec.get("css")) if x)
    nb.metadata.get("widgets", {}).pop(WIDGET_STATE, None)
    nb.metadata.pop("widgets", None)
    return dropped


def _scripts(modules) -> str:
    """What a page with recorded views carries once: each ES module and stylesheet they use, and the model that
    runs them on their recordings (book_model.js)."""
    if not modules:
        return ""
    out = []
    for name in sorted(modules):
        text = template(name)
        tag = "</style" if name.endswith(".css") else "</script"
        if tag in text.lower():                 # it would end the element that holds it
            raise BookError(f"ggviz/templates/widgets/{name} holds a closing {tag}> tag")
        if name.endswith(".css"):
            out.append(f"<style data-ggv>{text}</style>")
        else:
            out.append(f"<script type='text/plain' data-ggv data-ggv-esm='{html.escape(name)}'>{text}</script>")
    out.append(f"<script data-ggv>{template('book_model.js')}</script>")
    return "\n".join(out)


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
        if "data-ggv" in tag:
            out.append(script)             # ggviz's own (recordings, modules, book_model.js): never fetch anything
            pos = end
        elif "http://" in script or "https://" in script or 'src=""' in tag:
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
            modules: set = set()
            n_views = make_static(nb, modules)
            body, _ = exp.from_notebook_node(nb)
            body = _offline(body)
            j = body.find("</head>")                 # printing: A4 landscape, pictures within the paper (print.css)
            body = body[:j] + f"<style data-ggv-print>{_PRINT_CSS}</style>" + body[j:]
            if modules:
                j = body.rfind("</body>")
                body = body[:j] + _scripts(modules) + body[j:]
            page = out / f"{path.stem}.html"
            page.write_text(body, encoding="utf-8")
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
                     "<p>The notebooks of ggviz, executed on a real model. No kernel and no network needed: the "
                     "steppers step, the graphs pan and zoom, the explorer selects, the tensor, quant-block and arena "
                     "explorers answer an index, the allocator, scheduler and thread views follow their controls, "
                     "from what was recorded when the book was built. What would need a new computation says so "
                     f"where it is.</p><ol>\n{rows}\n</ol></body></html>", encoding="utf-8")
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


def weights(pages) -> str:
    """Each page's weight, and the pages over ``PAGE_BUDGET`` (a page is opened whole: its recordings inside)."""
    sizes = [(p.name, p.stat().st_size) for p in pages]
    lines = [f"  {name:<34} {n / 2**20:6.2f} MiB" + ("  OVER the page budget" if n > PAGE_BUDGET else "")
             for name, n in sizes]
    total = sum(n for _, n in sizes)
    return "\n".join(lines + [f"  {'all pages':<34} {total / 2**20:6.2f} MiB (budget: "
                               f"{PAGE_BUDGET / 2**20:.0f} MiB a page)"])


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
    print(weights(pages))
    print(f"{pages[0]}  ({len(pages) - 1} notebooks, {time.perf_counter() - t0:.0f} s) -- open it in a browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
