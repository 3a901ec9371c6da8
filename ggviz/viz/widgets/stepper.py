"""DecodeStepper: one ``llama_decode`` of the default model, replayed node by node like a debugger.

The decode runs once, for real, with llama.cpp's eval callback (``cb_eval(tensor, ask)``): asked about every node,
it says yes, so the scheduler computes the graph one node at a time and hands each result over before the next node
runs (and possibly overwrites that memory: the graph allocator reuses buffers in place). Each result is copied then
(a tensor of more than ``copy_limit`` values keeps its statistics and a slice) into a frame of a
``capture.StepperRecord`` (``capture_stepper``), with the graph that ran as a ``capture.GraphRecord``: the panel
and the DAG draw from that record only, so a record loaded from disk (``DecodeStepper.from_record(record)``) steps
and draws the same, with no model and no ``ggml_cgraph``. Stepping is then free: ``step()`` / ``goto(i)`` move
through the recorded nodes, and the views follow: the DAG (the current layer open, the node
outlined), the node's values (statistics and a heatmap), and where its bytes live (buffer, offset, the other nodes
that use the same bytes).
"""
from __future__ import annotations

import json
import time

import numpy as np

from ... import llama
from ...capture.graph import as_cgraph
from ...capture.stepper import StepperRecord, as_rows, capture_stepper
from ...run import load_model
from ._base import (
    VizWidget,
    array_png,
    book_payload,
    colorbar_html,
    esc,
    png_img,
    stepper_pane,
    svg_window,
    value_range,
    wrap_vector,
)
from .graph import GraphView


def faithful_model_params():
    """``llama.model_default_params()`` with extra buffer types off (``use_extra_bufts``, when the engine has it):
    the weights stay in the file's mapping, as a plain CPU build of llama.cpp keeps them."""

    p = llama.model_default_params()
    if hasattr(p, "use_extra_bufts"):
        p.use_extra_bufts = False
    return p


class DecodeStepper(VizWidget):
    """Step through the nodes of one decode.

    ``prompt`` (or ``tokens``): what is decoded (one ubatch); given ``tokens``, they are decoded as they are and
    the header shows them detokenized (``text``), whatever ``prompt`` says; ``model``: a loaded model (default: the
    default model, loaded with ``faithful_model_params()``); ``extra_cb``: another eval callback to call with every
    result as well (tests use it to check that the stepper shows exactly what the callback saw).
    """

    DEFAULT_PROMPT = "The capital of France is"

    def __init__(self, prompt: str | None = None, model=None, tokens=None, n_threads: int = 2,
                 n_ctx: int = 256, copy_limit: int = 65536, slice_rows: int = 16, slice_cols: int = 2048,
                 extra_cb=None, max_height: str = "640px"):

        if model is None:
            p = faithful_model_params()
            kw = {"use_extra_bufts": False} if hasattr(p, "use_extra_bufts") else {}
            model = load_model(**kw)
        self.model = model
        self.vocab = llama.model_get_vocab(model)
        if tokens is None:
            prompt = self.DEFAULT_PROMPT if prompt is None else prompt
            tokens = llama.tokenize(self.vocab, prompt, add_special=True, parse_special=True)
        self.copy_limit, self.slice_rows, self.slice_cols = copy_limit, slice_rows, slice_cols
        rec, self.ctx, self.graph_result = capture_stepper(model, tokens, prompt, n_threads, n_ctx, copy_limit,
                                                           slice_rows, slice_cols, extra_cb)
        self._show(rec, rec.graph, max_height)

    @classmethod
    def from_record(cls, record: StepperRecord, gf=None, max_height: str = "640px") -> DecodeStepper:
        """A stepper over a ``capture.StepperRecord`` (e.g. one loaded from disk), its DAG drawn from the record's
        graph (``gf``: another graph to draw instead, a cgraph or a ``GraphRecord``); nothing is decoded."""
        gf = getattr(record, "graph", None) if gf is None else gf
        if gf is None:
            raise ValueError("the stepper record holds no graph (saved before records kept it): pass the graph "
                             "it ran as gf")
        self = cls.__new__(cls)
        self.model = self.vocab = self.ctx = self.graph_result = None
        self._show(record, gf, max_height)
        return self

    def _show(self, record: StepperRecord, gf, max_height: str):
        """What the stepper shows: the record's frames (all the panel reads) beside the graph's DAG."""
        gf = as_cgraph(gf)
        if len(record.frames) != gf.n_nodes:
            raise ValueError(f"the record has {len(record.frames)} frames for a graph of {gf.n_nodes} nodes")
        self.record = record
        self.tokens, self.text, self.prompt = record.tokens, record.text, record.prompt
        self.records, self.logits, self.decode_s = record.frames, record.logits, record.decode_s
        self.gf = gf
        self.view = GraphView(gf, collapse="auto", max_open=1, max_height=max_height)
        self.pos = 0
        self.last_step_ms = 0.0
        self.step_ms: list[float] = []
        self._sync_graph()

    # ---------------------------------------------------------------- navigation
    @property
    def n_steps(self) -> int:
        return len(self.records)

    def goto(self, i):
        """Go to node ``i`` (index or name; a name goes to its first node)."""
        t0 = time.perf_counter()
        if isinstance(i, str):
            names = [r["name"] for r in self.records]
            if i not in names:
                raise KeyError(f"no node named {i!r}")
            i = names.index(i)
        self.pos = int(np.clip(int(i), 0, self.n_steps - 1))
        self._sync_graph()
        self._changed()
        self.last_step_ms = (time.perf_counter() - t0) * 1e3
        self.step_ms.append(self.last_step_ms)
        return self

    def step(self, n: int = 1):
        return self.goto(self.pos + n)

    def back(self, n: int = 1):
        return self.goto(self.pos - n)

    def _sync_graph(self):
        il = self.records[self.pos]["layer"]
        v = self.view
        want = set(v.all_layers) - ({il} if il is not None else set())
        v.collapsed = want
        v.highlight = [self.pos]

    # ---------------------------------------------------------------- data
    def values(self, i: int | None = None) -> np.ndarray:
        """What was recorded for node ``i``: all values (ne3, ne2, ne1, ne0), or the slice (rows x ne0) kept for a
        big tensor."""
        r = self.records[self.pos if i is None else i]
        return r["values"] if r["full"] else r["slice"]

    def sharing(self, i: int | None = None) -> list:
        """Other nodes whose bytes overlap node ``i``'s (same buffer): in-place ops, views, and memory the
        allocator handed out again after its previous owner's last use."""
        r = self.records[self.pos if i is None else i]
        if r["offset"] is None:
            return []
        a, b = r["offset"], r["offset"] + r["nbytes"]
        out = []
        for q in self.records:
            if q is r or q["buffer_base"] != r["buffer_base"] or q["offset"] is None:
                continue
            if q["offset"] < b and a < q["offset"] + q["nbytes"]:
                out.append({"index": q["index"], "name": q["name"], "op": q["op"], "offset": q["offset"],
                            "nbytes": q["nbytes"], "view": q["view_src"] is not None})
        return out

    def state(self) -> dict:
        r = self.records[self.pos]
        info = self.view.layout()[1]
        return {"index": self.pos, "n_nodes": self.n_steps, "name": r["name"], "op": r["op"], "type": r["type"],
                "ne": r["ne"], "nb": r["nb"], "layer": r["layer"], "src": r["src"], "view_src": r["view_src"],
                "buffer": r["buffer"], "offset": r["offset"], "nbytes": r["nbytes"], "buffer_size": r["buffer_size"],
                "stats": r["stats"], "full": r["full"], "open_layers": [x for x in self.view.all_layers
                                                                         if x not in self.view.collapsed],
                "vertex": info["vertex_of_node"][self.pos], "n_nodes_drawn": info["n_nodes_drawn"],
                "n_sharing": len(self.sharing()), "tokens": list(self.tokens), "text": self.text}

    # ---------------------------------------------------------------- rendering
    def _heatmap(self, i: int | None, max_rows: int, max_cols: int):
        v = as_rows(np.asarray(self.values(i)))
        grid, blank, w = wrap_vector(v)
        if w is None:
            grid = v[:max_rows, :max_cols]
        fin = np.isfinite(grid) if blank is None else np.isfinite(grid) & ~blank
        nonneg = bool(fin.any() and np.min(grid[fin]) >= 0)
        cmap = "viridis" if nonneg else "RdBu_r"
        lo, hi = value_range(np.where(fin, grid, np.nan), symmetric=not nonneg)
        return grid, blank, w, cmap, lo, hi, v.size

    def heatmap_png(self, i: int | None = None, max_rows: int = 48, max_cols: int = 512, small: bool = False) -> bytes:
        """The recorded values as an image: rows = ne[1..3], columns = ne[0] (diverging colours around 0, or
        viridis when no value is negative, e.g. a softmax); one long row or column (the logits) wrapped into a
        grid (``wrap_vector``) instead of a one-pixel strip. ``small``: the static book's (the first 8 x 128
        values, 64 colours: it records one per node)."""
        grid, blank, w, cmap, lo, hi, n = self._heatmap(i, 1 << 30 if small else max_rows,
                                                        1 << 30 if small else max_cols)
        if small:
            grid = grid[:8, :128]
            blank = blank[:8, :128] if blank is not None else None
            return array_png(grid, cmap=cmap, vmin=lo, vmax=hi, blank=blank, levels=64)
        xs = max(1, min(8, 640 // max(grid.shape[1], 1)))
        ys = max(1, min(24, 240 // max(grid.shape[0], 1))) if w is None else xs     # rows at least a few px tall
        return array_png(grid, cmap=cmap, vmin=lo, vmax=hi, scale=xs, yscale=ys, blank=blank)

    def heatmap_html(self, i: int | None = None, small: bool = False) -> str:
        """The heatmap with its colour bar (and, for a wrapped vector, how it was wrapped)."""
        big = 1 << 30                                 # small: the whole recording's shape (only 8 x 128 drawn)
        grid, blank, w, cmap, lo, hi, n = self._heatmap(i, big if small else 48, big if small else 512)
        note = (f"{n} values wrapped into rows of {w} (read left to right, top to bottom)" if w is not None else "")
        if small:
            r, c = min(grid.shape[0], 8), min(grid.shape[1], 128)
            cut = "" if (r, c) == grid.shape else f"; the first {r}×{c} of {grid.shape[0]}×{grid.shape[1]} drawn"
            xs = max(1, min(8, 512 // c))
            ys = max(2, min(24, 96 // r))
            img = png_img(self.heatmap_png(i, small=True),
                          f"width:{c * xs}px;height:{r * ys}px;image-rendering:pixelated")
            return img + "<br/>" + colorbar_html(lo, hi, cmap, label=(note + cut).lstrip("; "))
        return (png_img(self.heatmap_png(i), "max-width:660px") + "<br/>"
                + colorbar_html(lo, hi, cmap, label=note))

    def memory_svg(self, i: int | None = None, width: int = 640) -> str:
        """The buffer holding node ``i`` as a bar: its bytes red, the other nodes' spans in that buffer grey."""
        r = self.records[self.pos if i is None else i]
        if r["offset"] is None or not r["buffer_size"]:
            return "<i>not in a registered buffer</i>"
        size = r["buffer_size"]
        sx = width / size
        spans = []
        for q in self.records:
            if q["buffer_base"] == r["buffer_base"] and q["offset"] is not None and q is not r:
                spans.append(f"<rect x='{q['offset'] * sx:.2f}' y='14' width='{max(q['nbytes'] * sx, 0.5):.2f}' "
                             f"height='22' fill='#b0bec5' fill-opacity='0.35'/>")
        x, w = r["offset"] * sx, max(r["nbytes"] * sx, 1.5)
        return (f"<svg width='{width + 10}' height='58' xmlns='http://www.w3.org/2000/svg' "
                f"style='font-family:sans-serif;font-size:11px'>"
                f"<rect x='0' y='14' width='{width}' height='22' fill='#f5f5f5' stroke='#616161'/>{''.join(spans)}"
                f"<rect x='{x:.2f}' y='10' width='{w:.2f}' height='30' fill='#e53935' stroke='#b71c1c'/>"
                f"<text x='0' y='10'>{esc(r['buffer'])}: {size} bytes</text>"
                f"<text x='0' y='52'>this node: bytes {r['offset']}..{r['offset'] + r['nbytes']} "
                f"({r['nbytes']} bytes); grey: other nodes of this graph in the same buffer</text></svg>")

    def panel_head_html(self, small: bool = False) -> str:
        """The panel above the memory bar: the node, its values (statistics and the heatmap)."""
        r = st = self.records[self.pos]        # (its record: state() would also scan every node for sharers)
        s = st["stats"]
        stat = ("all non-finite" if s["min"] is None else
                f"min {s['min']:.4g} · max {s['max']:.4g} · mean {s['mean']:.4g} · std {s['std']:.4g}"
                + (f" · {s['n_nonfinite']} non-finite" if s["n_nonfinite"] else ""))
        kept = ("all values recorded" if r["full"] else
                f"big tensor: statistics + the first {r['slice'].shape[0]}×{r['slice'].shape[1]} of "
                f"{r['slice_of'][0]}×{r['slice_of'][1]} recorded")
        src_links = ", ".join(esc(x) for x in st["src"])
        return (f"<div class='ggv-st-node' style='font-size:18px'><b>node #{st['index']} / {self.n_steps - 1}: "
                f"{esc(st['name'])}</b> = {esc(st['op'])}({src_links})</div>"
                f"{esc(st['type'])} ne={st['ne']} nb={st['nb']}"
                + (f" — view of {esc(st['view_src'])}" if st["view_src"] else "") +
                f"<br/><b>values</b>: {stat}<br/><span style='font-size:11px'>{kept}; heatmap rows = ne[1..3], "
                f"columns = ne[0] (blue &lt; 0 &lt; red; viridis if none &lt; 0)</span><br/>"
                f"{self.heatmap_html(small=small)}<br/>")

    def panel_html(self) -> str:
        share = self.sharing()
        share_txt = (", ".join(f"#{q['index']} {esc(q['name'])}" for q in share[:10])
                     + (" …" if len(share) > 10 else ""))
        return (f"<div style='font-size:14px;max-width:680px'>{self.panel_head_html()}"
                f"<b>memory</b>: {self.memory_svg()}<br/>"
                + (f"<b>same bytes also used by</b>: {share_txt}" if share else "") + "</div>")

    def to_html(self, window=(560, 500)) -> str:
        """The current step as static HTML: the DAG cropped to a window around the node, and the panel."""
        css = self.view.css()
        vert = self.view.prefix + self.view.layout()[1]["vertex_of_node"][self.pos]
        svg = svg_window(self.view.svg(), vert, *window) if window else self.view.svg()
        return (f"<div style='display:flex;gap:14px;align-items:flex-start'><div><style>{css}</style>{svg}</div>"
                f"{self.panel_html()}</div>")

    def header_html(self) -> str:
        """The line above the stepper: what was decoded -- the tokens detokenized, and their ids."""
        ids = ", ".join(str(t) for t in self.tokens[:32]) + (", …" if len(self.tokens) > 32 else "")
        return (f"<b>decode of {len(self.tokens)} tokens</b> <code>{esc(repr(self.text))}</code> "
                f"<span style='font-size:11px'>tokens: [{ids}]</span> — "
                f"{self.n_steps} nodes recorded in {self.decode_s:.1f} s")

    # ---------------------------------------------------------------- the browser side (stepper.js)
    def nodes_json(self) -> str:
        """The node table the browser draws the memory bar and the sharers from: {"buffers": [{label, size}],
        "nodes": [[name, buffer index | null, offset, nbytes], ...]} (node order)."""
        bufs, rows = {}, []
        for r in self.records:
            if r["offset"] is None:
                rows.append([r["name"], None, 0, r["nbytes"]])
                continue
            b = bufs.setdefault(r["buffer_base"], (len(bufs), {"label": r["buffer"], "size": r["buffer_size"]}))
            rows.append([r["name"], b[0], r["offset"], r["nbytes"]])
        return json.dumps({"buffers": [v[1] for v in sorted(bufs.values(), key=lambda x: x[0])], "nodes": rows})

    def frame(self, small: bool = False) -> dict:
        """What the browser shows at the current node: the graph's CSS, the vertex to scroll to, the panel."""
        focus = self.view.prefix + self.view.layout()[1]["vertex_of_node"][self.pos]
        return {"css": self.view.css(), "focus": focus, "mem": True,
                "panel": f"<div style='font-size:14px;max-width:680px'>{self.panel_head_html(small=small)}</div>"}

    def _pane_traits(self) -> dict:
        clicks = {}
        for r in self.records:
            if r["layer"] is not None:
                clicks.setdefault(f"L{r['layer']}", r["index"])        # a layer box: its first node
        return dict(header=self.header_html(), label="node", n=self.n_steps, pos=self.pos,
                    names=json.dumps([r["name"] for r in self.records]), clicks=json.dumps(clicks),
                    nodes=self.nodes_json(), prefix=self.view.prefix, max_height=self.view.max_height,
                    max_width="720px", svg=self.view.svg(), frame=json.dumps(self.frame()))

    def _build(self):
        self._pane = stepper_pane(**self._pane_traits())
        self._pane.observe(lambda ch: ch["new"] != self.pos and self.goto(ch["new"]), "pos")
        return self._pane

    def _refresh(self):
        svg = self.view.svg()
        if self._pane.svg != svg:
            self._pane.svg = svg
        self._pane.frame = json.dumps(self.frame())
        if self._pane.pos != self.pos:
            self._pane.pos = self.pos

    def book_view(self) -> dict:
        """Every node's frame (a small heatmap: 8 x 128 values of the recording) and every picture (one per open
        layer), so the book steps through the whole decode with no kernel. Records embedded: this stepper's
        ``records`` (name, op, type, ne, nb, stats, buffer, offset, bytes), one frame per node."""
        here = self.pos
        svgs, pick, frames = {}, [], []
        try:
            for i in range(self.n_steps):
                self.pos = i
                self._sync_graph()
                pick.append(svgs.setdefault(self.view.svg(), len(svgs)))
                frames.append(json.dumps(self.frame(small=True)))
        finally:
            self.pos = here
            self._sync_graph()
        state = dict(self._pane_traits())
        svgs = list(svgs)                               # (a dict keeps the order of insertion)
        state.update(svg=svgs[pick[here]], frame=frames[here])
        return book_payload("stepper.js", state, [{"on": "pos", "set": "svg", "pick": pick, "values": svgs},
                                                  {"on": "pos", "set": "frame", "values": frames}])
