"""What every ggviz widget shares: plain state first, an ipywidgets view second, a static rendering third.

A widget class here is a plain Python object:

- ``state()`` returns plain data (dicts, lists, numbers) describing exactly what is shown; tests compare it with the
  engine's own objects, and no browser is needed for that;
- ``.widget`` builds (once, lazily) the ipywidgets view; every state change (``select``, ``step``, ``goto`` ...)
  refreshes it if it exists;
- ``to_html()`` returns a self-contained HTML fragment (inline SVG/PNG) of the current state, for reports;
  ``figure()`` returns a matplotlib Figure where the view is a matplotlib drawing.

``SVGCanvas`` is the browser-side piece most views share: an anywidget that shows an SVG, restyles it with a CSS
string (so a highlight moves without re-sending or re-laying-out the picture), pans and zooms it, and reports clicks
on elements whose id starts with the canvas prefix (matplotlib ``gid``s, Graphviz ``id``s). ``StepperPane`` is the
steppers' (a recording stepped through: buttons, slider, keys, play, search, the graph, the panel).

The static book (``ggviz book``) runs those same ES modules without a kernel: a view that can, answers
``book_view()`` with its widget's traits plus the recorded answers to every interaction a student can make
(``book_payload``), and the notebook's output carries that recording under ``BOOK_MIME`` when the kernel runs for
the book (``GGVIZ_BOOK=1``); ggviz/templates/widgets/book_model.js plays the kernel's part in the page.
"""
from __future__ import annotations

import base64
import functools
import html
import importlib.resources
import io
import itertools
import json
import os
import re

import anywidget
import ipywidgets
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import colormaps
import traitlets
from PIL import Image

_uid = itertools.count(1)

# the mime type of a view's recording for the static book (see book_payload); only put in the outputs of a kernel
# that runs for the book (ggviz book sets GGVIZ_BOOK=1), so a live notebook does not pay for it
BOOK_MIME = "application/vnd.ggviz.book+json"


def new_prefix(kind: str = "g") -> str:
    """A document-unique id prefix, so several SVGs on one page never share element ids or CSS rules."""
    return f"ggv{next(_uid)}{kind}-"


def esc(s) -> str:
    return html.escape(str(s), quote=True)


# ---------------------------------------------------------------------------------------------------------- figures

def fig_to_svg(fig, close: bool = True) -> str:
    """A matplotlib Figure as SVG text (text kept as <text>, so it stays small and selectable)."""

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    if close:
        plt.close(fig)
    s = buf.getvalue()
    return s[s.index("<svg"):]          # drop the XML prolog / DOCTYPE: the SVG is inlined into HTML


# Print (#21): a book page prints on A4 landscape (ggviz/templates/book/print.css: 281 mm = 1062 CSS px inside its
# 8 mm margins), where a chart wider than the output column is shrunk to fit it. PRINT_WIDTH_PX is that column (the
# page less the notebook's prompt column and paddings: 911 px in Chromium's print emulation); fig_to_png
# raises every text of a chart that would print under MIN_PRINT_PX to the size that prints at it.
PRINT_WIDTH_PX = 900
MIN_PRINT_PX = 9.0
FONT_PX_KEY = "ggviz:min-font-px"        # the PNG's text chunk: its smallest text, in pixels of the PNG


def _texts(fig):
    return [t for t in fig.findobj(matplotlib.text.Text)
            if t.get_visible() and t.get_text().strip() and t.get_figure() is fig]


def _print_fonts(fig, dpi: int) -> float:
    """Raise the fonts of ``fig`` so that, once saved at ``dpi`` with a tight box and shrunk to PRINT_WIDTH_PX if
    wider, no text is under MIN_PRINT_PX; returns the smallest font then, in pixels of the PNG."""
    pad = float(matplotlib.rcParams["savefig.pad_inches"])
    for _ in range(3):                       # larger text widens the tight box a little: converge on it
        # inches; laying it out makes the ticks and legends (their texts exist only from then on)
        tb = fig.get_tightbbox(fig.canvas.get_renderer())
        scale = min(1.0, PRINT_WIDTH_PX / ((tb.width + 2 * pad) * dpi))
        need = MIN_PRINT_PX / scale * 72.0 / dpi                            # points
        small = False
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                for which, ticks in (("major", axis.get_major_ticks()), ("minor", axis.get_minor_ticks())):
                    sizes = [t.label1.get_fontsize() for t in ticks if t.label1.get_visible()]
                    if sizes and min(sizes) < need - 1e-3:   # set_tick_params: new ticks of the axis get it too
                        axis.set_tick_params(which=which, labelsize=need)
                        small = True
        for t in _texts(fig):
            if t.get_fontsize() < need - 1e-3:
                t.set_fontsize(need)
                small = True
        if not small:
            break
    return min((t.get_fontsize() for t in _texts(fig)), default=need) * dpi / 72.0


def fig_to_png(fig, dpi: int = 110, close: bool = True) -> bytes:
    """A matplotlib Figure as PNG bytes (tight box), its fonts raised for print (``_print_fonts``); the smallest
    text size, in pixels of the PNG, is kept in its text chunk FONT_PX_KEY (before the pixels: a test of the printed
    page reads it from the picture's data: URL)."""
    font_px = _print_fonts(fig, dpi)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata={FONT_PX_KEY: f"{font_px:.2f}"})
    if close:
        plt.close(fig)
    return buf.getvalue()


def png_img(png: bytes, style: str = "") -> str:
    return f"<img style='{style}' src='data:image/png;base64,{base64.b64encode(png).decode()}'/>"


def _book_png(fig) -> str:
    """IPython's image/png formatter for a matplotlib Figure in the book's kernels: ``fig_to_png`` (base64)."""
    return base64.b64encode(fig_to_png(fig, close=False)).decode()


def book_figures() -> bool:
    """The notebooks' own matplotlib figures (``plt.show()``, a Figure displayed) go through ``fig_to_png`` in the
    kernels that run for the book (#21): they print at MIN_PRINT_PX or more and carry FONT_PX_KEY, which the book's
    test reads. matplotlib-inline registers its own formatter (``select_figure_formats``, once, when it is imported
    as the backend): it is imported first, so that ours is the one that stays. False where there is no IPython."""
    try:                              # guarded: IPython and matplotlib-inline are there in a kernel, not in every run
        from IPython import get_ipython
        shell = get_ipython()
        if shell is None:
            return False
        if "inline" in str(matplotlib.get_backend()):
            import matplotlib_inline.backend_inline  # noqa: F401
    except ImportError:                              # pragma: no cover
        return False
    shell.display_formatter.formatters["image/png"].for_type(plt.Figure, _book_png)
    return True


def value_range(a, symmetric: bool = True, vmin=None, vmax=None) -> tuple[float, float]:
    """The colour range ``array_png`` uses for ``a``: its finite min/max (symmetric around 0 if asked)."""
    a = np.asarray(a, dtype=np.float64)
    fin = np.isfinite(a)
    if vmin is None or vmax is None:
        if fin.any():
            lo, hi = float(a[fin].min()), float(a[fin].max())
        else:
            lo, hi = 0.0, 1.0
        if symmetric:
            m = max(abs(lo), abs(hi)) or 1.0
            lo, hi = -m, m
        vmin = lo if vmin is None else vmin
        vmax = hi if vmax is None else vmax
    return float(vmin), float(vmax)


def wrap_vector(a, max_cols: int = 256):
    """A 2-D array that is one long row or column (a [49152] logits vector would draw as a one-pixel strip) as a
    grid of rows of ``w`` values (a power of two, at most ``max_cols``), read left to right, top to bottom.
    Returns ``(grid, blank, w)``: ``blank`` marks the padding after the last value (None if there is none); an
    array that is not a long vector comes back as ``(a, None, None)``."""
    a = np.asarray(a)
    if a.ndim != 2 or min(a.shape) != 1 or a.size <= 96:
        return a, None, None
    v = a.reshape(-1)
    n = v.size
    w = int(min(max_cols, max(64, 2 ** int(np.ceil(np.log2(np.sqrt(2.0 * n)))))))
    rows = -(-n // w)
    grid = np.zeros(rows * w, dtype=np.float64)
    grid[:n] = v
    blank = None
    if rows * w > n:
        blank = np.zeros(rows * w, dtype=bool)
        blank[n:] = True
        blank = blank.reshape(rows, w)
    return grid.reshape(rows, w), blank, w


@functools.lru_cache(maxsize=None)
def _colormap(name: str):
    """matplotlib's colormap ``name``, made once: ``colormaps[name]`` hands out a fresh copy that builds its lookup
    table again on first use (1.3 ms a call: most of a stepper frame's cost)."""
    return colormaps[name]


def colorbar_html(vmin: float, vmax: float, cmap: str = "RdBu_r", label: str = "", width: int = 220) -> str:
    """A colour bar for an ``array_png`` picture: the colormap as a CSS gradient, with its ends (and 0 where it is
    inside the range) written under it."""
    stops = ", ".join(matplotlib.colors.to_hex(_colormap(cmap)(x)) + f" {100 * x:.0f}%" for x in np.linspace(0, 1, 9))
    zero = ""
    if vmin < 0 < vmax:
        zx = (0 - vmin) / (vmax - vmin) * 100
        zero = f"<span style='position:absolute;left:{zx:.1f}%;transform:translateX(-50%)'>0</span>"
    return (f"<div style='display:inline-block;font-size:10px;font-family:sans-serif;margin:2px 0'>"
            f"<div style='width:{width}px;height:10px;border:1px solid #9e9e9e;background:linear-gradient(to right, "
            f"{stops})'></div><div style='position:relative;width:{width}px;height:12px'>"
            f"<span style='position:absolute;left:0'>{vmin:.3g}</span>{zero}"
            f"<span style='position:absolute;right:0'>{vmax:.3g}</span></div>"
            + (f"<div>{esc(label)}</div>" if label else "") + "</div>")


def array_png(a, cmap: str = "RdBu_r", vmin=None, vmax=None, scale: int = 1, symmetric: bool = True,
              yscale: int | None = None, blank=None, levels: int | None = None) -> bytes:
    """A 2-D array as a PNG, one pixel block per value: fast (no matplotlib figure), for per-step updates.

    Non-finite values are drawn black (-inf) / magenta (+inf, NaN); cells where ``blank`` is True white (padding).
    The colour range is ``value_range(a, symmetric, vmin, vmax)`` (``colorbar_html`` draws its legend).
    ``levels``: a palette PNG of that many colours (1 byte a pixel: the static book records one per step).
    """

    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    a = a.reshape(a.shape[0], -1) if a.ndim == 2 else a.reshape(-1, a.shape[-1])
    fin = np.isfinite(a)
    if blank is not None:
        fin = fin & ~np.asarray(blank, bool).reshape(a.shape)
    vmin, vmax = value_range(np.where(fin, a, np.nan), symmetric, vmin, vmax)
    span = (vmax - vmin) or 1.0
    norm = np.clip((np.where(fin, a, vmin) - vmin) / span, 0.0, 1.0)
    rgba = (_colormap(cmap)(norm) * 255).astype(np.uint8)
    rgba[np.isneginf(a)] = (0, 0, 0, 255)
    rgba[np.isposinf(a) | np.isnan(a)] = (255, 0, 255, 255)
    if blank is not None:
        rgba[np.asarray(blank, bool).reshape(a.shape)] = (255, 255, 255, 255)
    img = Image.fromarray(rgba, "RGBA")
    if levels:
        img = img.convert("RGB").quantize(colors=levels, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    ys = scale if yscale is None else yscale
    if scale > 1 or ys > 1:
        img = img.resize((img.width * scale, img.height * ys), Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def svg_element_center(svg: str, elem_id: str):
    """Centre (x, y) of element ``elem_id`` of a Graphviz SVG, in the SVG's viewBox coordinates (None if absent)."""
    gid = re.escape(elem_id).replace("\\-", "(?:-|&#45;)")
    m = re.search(r'<g id="' + gid + r'" class="node">(.*?)</g>\s*(?:</g>\s*)?(?:<!--|</g>|<g id=)', svg, re.S)
    if not m:
        return None
    body = m.group(1)
    xs, ys = [], []
    for pts in re.findall(r'\s(?:points|d)="([^"]+)"', body):
        nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", pts)]
        xs += nums[0::2]
        ys += nums[1::2]
    for cx, cy in re.findall(r'<ellipse[^>]*cx="([-\d.]+)" cy="([-\d.]+)"', body):
        xs.append(float(cx))
        ys.append(float(cy))
    if not xs:
        return None
    t = re.search(r'<g id="graph0" class="graph" transform="scale\(([\d.]+) ([\d.]+)\) rotate\(0\) '
                  r'translate\(([-\d.]+) ([-\d.]+)\)"', svg)
    sx, sy, tx, ty = (float(v) for v in t.groups()) if t else (1.0, 1.0, 0.0, 0.0)
    cx, cy = (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2
    return (cx + tx) * sx, (cy + ty) * sy


def svg_window(svg: str, elem_id: str, width: float = 760, height: float = 620) -> str:
    """The SVG cropped (through its viewBox) to a ``width`` x ``height`` pt window centred on ``elem_id``: a static
    picture zoomed onto one node of a big graph, at its natural size."""
    c = svg_element_center(svg, elem_id)
    m = re.search(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"\s+viewBox="([-\d. ]+)"', svg)
    if c is None or m is None:
        return svg
    vb = [float(v) for v in m.group(3).split()]
    W, H = vb[2], vb[3]
    w, h = min(width, W), min(height, H)
    x0 = min(max(c[0] - w / 2, 0.0), W - w)
    y0 = min(max(c[1] - h / 2, 0.0), H - h)
    head = f'<svg width="{w:.0f}pt" height="{h:.0f}pt" viewBox="{x0:.2f} {y0:.2f} {w:.2f} {h:.2f}"'
    return svg[:m.start()] + head + svg[m.end():]


def html_table(rows, columns=None, title=None, max_rows: int = 400) -> str:
    """A compact HTML table of row dicts (or of a ggviz ``Table``, which keeps its own formats)."""
    if hasattr(rows, "_repr_html_") and hasattr(rows, "columns"):
        return rows._repr_html_()
    rows = list(rows)
    if columns is None:
        columns = list(rows[0].keys()) if rows else []
    head = "".join(f"<th style='text-align:left;padding:1px 8px'>{esc(c)}</th>" for c in columns)
    body = []
    for r in rows[:max_rows]:
        body.append("<tr>" + "".join(f"<td style='text-align:left;font-family:monospace;padding:1px 8px'>"
                                     f"{esc(_cell(r.get(c)))}</td>"
                                     for c in columns) + "</tr>")
    more = (f"<tr><td colspan={len(columns)}>… {len(rows) - max_rows} more rows</td></tr>"
            if len(rows) > max_rows else "")
    cap = f"<caption style='text-align:left'><b>{esc(title)}</b></caption>" if title else ""
    return (f"<table style='border-collapse:collapse'>{cap}<thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}{more}</tbody></table>")


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_cell(x) for x in v) + "]"
    if isinstance(v, np.ndarray):
        return np.array2string(v, threshold=24, max_line_width=120)
    return str(v)


def pre(text: str) -> str:
    return f"<pre style='font-size:11px;line-height:1.25;margin:2px 0'>{esc(text)}</pre>"


# ---------------------------------------------------------------------------------------------------------- canvas

def template(name: str) -> str:
    """A widget's ES module or stylesheet, ``ggviz/templates/widgets/<name>``: the browser code lives in .js/.css
    files (linted, highlighted, diffed as what they are), read from the installed package, so the live widget
    (anywidget ``_esm``/``_css``) and the pages that embed its state carry the one copy."""
    return importlib.resources.files("ggviz").joinpath("templates", "widgets", name).read_text(encoding="utf-8")


_canvas_cls = None


def svg_canvas(svg: str = "", prefix: str = "", css: str = "", max_height: str = "600px", fit_width: bool = False,
               max_width: str = "none"):
    """An ``SVGCanvas`` widget (anywidget) or, if anywidget is missing, an ``ipywidgets.HTML`` stand-in."""
    global _canvas_cls
    if _canvas_cls is None:
        try:
            import anywidget
            import traitlets

            class SVGCanvas(anywidget.AnyWidget):
                """Shows ``svg``; ``css`` restyles it; a click on an element with id ``prefix + key`` sets
                ``clicked = key`` (and bumps ``n_clicks``); ``focus`` (an element id) is scrolled into view;
                ``info`` (HTML) is shown beside the picture."""
                _esm = template("svg_canvas.js")
                svg = traitlets.Unicode("").tag(sync=True)
                css = traitlets.Unicode("").tag(sync=True)
                prefix = traitlets.Unicode("").tag(sync=True)
                clicked = traitlets.Unicode("").tag(sync=True)
                n_clicks = traitlets.Int(0).tag(sync=True)
                focus = traitlets.Unicode("").tag(sync=True)
                info = traitlets.Unicode("").tag(sync=True)
                max_height = traitlets.Unicode("600px").tag(sync=True)
                max_width = traitlets.Unicode("none").tag(sync=True)
                fit_width = traitlets.Bool(False).tag(sync=True)

            _canvas_cls = SVGCanvas
        except ImportError:      # pragma: no cover - anywidget is a dependency
            _canvas_cls = False
    if _canvas_cls:
        return _canvas_cls(svg=svg, prefix=prefix, css=css, max_height=max_height, fit_width=fit_width,
                           max_width=max_width)
    class _HTMLCanvas(ipywidgets.HTML):      # pragma: no cover
        def __init__(self, **kw):
            self._svg, self._css = kw.get("svg", ""), kw.get("css", "")
            super().__init__(value=self._compose())

        def _compose(self):
            return f"<style>{self._css}</style><div style='overflow:auto;max-height:600px'>{self._svg}</div>"

    return _HTMLCanvas(svg=svg, css=css)


class StepperPane(anywidget.AnyWidget):
    """A recording stepped through (ES module stepper.js): the browser sets ``pos``; the owner answers with
    ``frame`` (JSON: ``{css, focus, panel, mem}``) and ``svg``. See stepper.js for the other traits."""
    _esm = template("stepper.js")
    header = traitlets.Unicode("").tag(sync=True)
    label = traitlets.Unicode("step").tag(sync=True)
    n = traitlets.Int(1).tag(sync=True)
    pos = traitlets.Int(0).tag(sync=True)
    names = traitlets.Unicode("").tag(sync=True)
    clicks = traitlets.Unicode("").tag(sync=True)
    nodes = traitlets.Unicode("").tag(sync=True)
    prefix = traitlets.Unicode("").tag(sync=True)
    svg = traitlets.Unicode("").tag(sync=True)
    frame = traitlets.Unicode("").tag(sync=True)
    play = traitlets.Bool(False).tag(sync=True)
    max_height = traitlets.Unicode("640px").tag(sync=True)
    max_width = traitlets.Unicode("720px").tag(sync=True)


def stepper_pane(**traits) -> StepperPane:
    return StepperPane(**traits)


def pane_state(w) -> dict:
    """The synced traits a widget class of ours defines (not ipywidgets' layout and bookkeeping): its model."""
    # (anywidget makes a subclass per instance: the traits are those the AnyWidget base does not have)
    own = set(w.trait_names(sync=True)) - set(anywidget.AnyWidget.class_trait_names(sync=True))
    return {k: getattr(w, k) for k in sorted(own) if not k.startswith("_")}


def book_payload(esm: str, state: dict, tables=(), css: str | None = None) -> dict:
    """A view's recording for the static book: the ES module (a file of ggviz/templates/widgets/) that draws it,
    its traits, and ``tables``: ``{"on": trait, "set": trait, "values": list | dict, "pick": list | None,
    "missing": value}`` -- when the page sets and saves ``on``, ``set`` becomes ``values[pick[v] if pick else v]``
    (``missing`` where there is no entry). Plain JSON; book_model.js reads it."""
    for t in tables:
        if set(t) - {"on", "set", "values", "pick", "missing"} or not {"on", "set", "values"} <= set(t):
            raise ValueError(f"a book table has the keys on, set, values (pick, missing): got {sorted(t)}")
    template(esm)                                       # fails here, not in the page, if the module is missing
    return {"esm": esm, "css": css, "state": dict(state), "tables": list(tables)}


def on_click(canvas, fn) -> None:
    """Call ``fn(key)`` whenever the canvas reports a click (also on a repeated click of the same element)."""
    if hasattr(canvas, "n_clicks"):
        canvas.observe(lambda ch: fn(canvas.clicked), "n_clicks")


# ---------------------------------------------------------------------------------------------------------- base

class VizWidget:
    """Base of the ggviz widgets: lazy ``.widget``, ``state()``, ``to_html()``, Jupyter display of the widget."""

    _widget = None

    @property
    def widget(self):
        if self._widget is None:
            self._widget = self._build()
            self._refresh()
        return self._widget

    def _build(self):             # pragma: no cover - abstract
        raise NotImplementedError

    def _refresh(self):
        """Push the current state into the widget's children (only if the widget was built)."""

    _in_refresh = False

    def _changed(self):
        # a refresh that moves a control (slider, dropdown) triggers its observer, which calls back here with the
        # state already current: ignore that echo instead of drawing twice
        if self._widget is not None and not self._in_refresh:
            self._in_refresh = True
            try:
                self._refresh()
            finally:
                self._in_refresh = False

    def state(self) -> dict:      # pragma: no cover - abstract
        raise NotImplementedError

    def to_html(self) -> str:     # pragma: no cover - abstract
        raise NotImplementedError

    def book_view(self) -> dict | None:
        """The view's recording for the static book (``book_payload``), or None where the book shows ``to_html``
        only (the view then needs a kernel to answer)."""
        return None

    def _repr_mimebundle_(self, include=None, exclude=None):
        """The live widget view and, beside it, the static rendering (``to_html``): a live kernel shows the widget
        (Jupyter prefers the widget mime type), and an executed notebook keeps a figure that GitHub, nbviewer,
        nbconvert's HTML and printed handouts can show without a kernel."""
        data = {}
        rec = self.book_view() if os.environ.get("GGVIZ_BOOK") == "1" else None
        if rec is not None and rec["esm"] == "frames.js":
            # the book (which drops the live widget) shows the recording's first frame as the static picture: the
            # view's drawing is made once, for the recording, instead of three times (widget, static, recording)
            html = frames_static(rec)
        else:
            w = self.widget
            if hasattr(w, "_repr_mimebundle_"):
                live = w._repr_mimebundle_(include=include, exclude=exclude)
                data.update((live[0] if isinstance(live, tuple) else live) or {})    # (data, metadata) or data
            html = self.to_html()
        # the wrapper names the view, so a test finds which view a notebook cell (and the book's page) displays
        data["text/html"] = f"<div class='ggv-out' data-ggv-view='{type(self).__name__}'>{html}</div>"
        if rec is not None:
            data[BOOK_MIME] = json.loads(json.dumps(rec))      # plain JSON (fails here on a stray object)
        return data


# ---------------------------------------------------------------------------------------------------------- frames

class FramesPane(anywidget.AnyWidget):
    """A view whose controls pick one frame of a recording (ES module frames.js): the browser sets ``key`` (the
    controls' values joined by ","); the owner answers with ``picture``, ``cursor`` and ``info``."""
    _esm = template("frames.js")
    header = traitlets.Unicode("").tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)
    foot = traitlets.Unicode("").tag(sync=True)
    controls = traitlets.Unicode("[]").tag(sync=True)
    key = traitlets.Unicode("").tag(sync=True)
    picture = traitlets.Unicode("").tag(sync=True)
    cursor = traitlets.Unicode("").tag(sync=True)
    css = traitlets.Unicode("").tag(sync=True)
    info = traitlets.Unicode("").tag(sync=True)
    detail = traitlets.Unicode("").tag(sync=True)
    prefix = traitlets.Unicode("").tag(sync=True)
    clickmap = traitlets.Unicode("{}").tag(sync=True)


NOT_RECORDED = ("<i style='color:#5d4037'>this choice was not recorded when the book was built: run the notebook "
                "(a kernel) to see it</i>")


def frames_book(controls: list, keys, frame, header: str = "", note: str = "", prefix: str = "",
                clickmap: dict | None = None, foot: str = "") -> dict:
    """The book recording of a FramesPane view: ``controls`` (frames.js's list, each ``value`` the current one),
    ``keys``: every key to record (tuples of control values), ``frame(key) -> {"picture", "cursor", "css",
    "info", "detail", "foot"}`` (``detail``: a second part under the info, e.g. what one control alone decides;
    ``foot``: the part over the info, ``foot`` where the frame has none) (``cursor``: a list of boxes in % of the picture, or None); ``prefix``, ``clickmap``: clicks on the
    picture (see frames.js). Each part is stored once per distinct value (a chart
    drawn once and only its cursor moving costs one picture), keyed through ``pick``."""
    parts = {k: ([], {}, {}) for k in ("picture", "cursor", "css", "info", "detail", "foot")}
    cur = ",".join(str(c["value"]) for c in controls)
    first = None
    for k in keys:
        ks = ",".join(str(x) for x in k)
        fr = frame(k)
        fr = dict(fr, cursor=json.dumps(fr.get("cursor") or [], separators=(",", ":")), foot=fr.get("foot", foot))
        if ks == cur or first is None:
            first = fr
        for name, (uniq, seen, pick) in parts.items():
            v = fr.get(name) or ""
            if v not in seen:
                seen[v] = len(uniq)
                uniq.append(v)
            pick[ks] = seen[v]
    if first is None:
        raise ValueError("frames_book: no key to record")
    state = dict(header=header, note=note, foot=first["foot"], controls=json.dumps(controls), key=cur,
                 picture=first.get("picture") or "", cursor=first["cursor"], css=first.get("css") or "",
                 info=first.get("info") or "", detail=first.get("detail") or "", prefix=prefix, clickmap=json.dumps(clickmap or {}))
    missing = {"info": NOT_RECORDED, "cursor": "[]"}          # (a key not recorded keeps the picture shown)
    return book_payload("frames.js", state, [
        dict({"on": "key", "set": name, "values": uniq, "pick": pick},
             **({"missing": missing[name]} if name in missing else {}))
        for name, (uniq, _seen, pick) in parts.items()
        if name != "foot" or len(uniq) > 1])              # (a foot the same for every key: the state holds it)


def frames_static(rec: dict) -> str:
    """A frames.js recording's current frame as plain HTML (the page before its script starts, and its print): the
    header, the note, the picture with its cursor boxes and style, the foot and the info."""
    st = rec["state"]
    boxes = "".join(f"<div style='position:absolute;left:{b['l']}%;top:{b['t']}%;width:{b['w']}%;height:{b['h']}%;"
                    f"background:rgba(255,241,118,0.35);outline:1.5px solid #f9a825'></div>"
                    for b in json.loads(st.get("cursor") or "[]"))
    note = f"<div style='color:#5d4037;font:12px sans-serif'>{st['note']}</div>" if st.get("note") else ""
    return (f"<div style='font:12px sans-serif'>{st.get('header') or ''}</div>{note}"
            + (f"<style>{st['css']}</style>" if st.get("css") else "")
            + f"<div style='position:relative;display:inline-block;max-width:100%'>{st.get('picture') or ''}{boxes}</div>"
            + f"<div>{st.get('foot') or ''}</div><div>{st.get('info') or ''}</div><div>{st.get('detail') or ''}</div>")


def quiet(view):
    """A context in which ``view``'s state may be moved through its frames without redrawing its live widget."""
    class _Quiet:
        def __enter__(self):
            self.was = view._in_refresh
            view._in_refresh = True

        def __exit__(self, *exc):
            view._in_refresh = self.was
    return _Quiet()


def chart_with_cursor(fig, ax_top, ax_bottom=None, dpi: int = 100):
    """A matplotlib chart drawn once for the book, and where its data positions land on the PNG: returns
    ``(img_html, box)``; ``box(x0, x1)`` is the frames.js cursor ({l, t, w, h} in % of the picture) over data
    x0..x1 of ``ax_top``, from its top to the bottom of ``ax_bottom`` (same x axis); ``box(x0, x1, y0, y1, ax)``
    one data rectangle of ``ax`` (one of the figure's axes). The PNG is saved as ``fig_to_png`` does
    (``bbox_inches="tight"``), so the mapping follows the tight box and its padding."""
    png = fig_to_png(fig, dpi=dpi, close=False)           # draws it (the positions below are those it drew)
    try:
        tb = fig.get_tightbbox(fig.canvas.get_renderer())        # inches
        pad = float(matplotlib.rcParams["savefig.pad_inches"])
        left, top_in, width, height = tb.x0 - pad, tb.y1 + pad, tb.width + 2 * pad, tb.height + 2 * pad
        ax_bottom = ax_bottom or ax_top
        y_top = ax_top.get_window_extent().y1 / fig.dpi
        y_bot = ax_bottom.get_window_extent().y0 / fig.dpi
        trans = {id(a): a.transData.frozen() for a in fig.axes}
    finally:
        plt.close(fig)
    dpi_f = fig.dpi

    def box(x0, x1, y0=None, y1=None, ax=None):
        t = trans[id(ax if ax is not None else ax_top)]
        (a, ya), (b, yb) = t.transform([(x0, 0 if y0 is None else y0), (x1, 0 if y1 is None else y1)]) / dpi_f
        lo, hi = sorted((a, b))
        if hi - lo < 0.004 * width:                 # a node of a few µs: still a visible mark
            lo, hi = (lo + hi) / 2 - 0.002 * width, (lo + hi) / 2 + 0.002 * width
        top, bot = (y_top, y_bot) if y0 is None else (max(ya, yb), min(ya, yb))
        return {"l": round(100 * (lo - left) / width, 3), "t": round(100 * (top_in - top) / height, 3),
                "w": round(100 * (hi - lo) / width, 3), "h": round(100 * (top - bot) / height, 3)}

    return png_img(png, "max-width:100%;display:block"), box


if os.environ.get("GGVIZ_BOOK") == "1":          # a kernel that runs for the book: see book_figures
    book_figures()
