"""The compute graph as a picture you can open up, and ``ggml_visit_parents`` replayed step by step.

- ``GraphView(gf)``: the cgraph (or its ``capture.GraphRecord``) as a Graphviz DAG (boxes = nodes, ellipses =
  leafs) coloured by op, by type or by any per-node attribute (the buffer a tensor lives in, its backend ...). A graph built by llama.cpp's callback
  (names ``<name>-<il>``) starts with every layer collapsed into one box "layer il (36 nodes)"; clicking a box (or
  ``expand(il)``) opens it; ``expand_all()`` opens every layer: the whole 1086-node decode DAG, laid out layer by
  layer (``graph_dot.layered_layout``: one ``dot`` run per distinct layer, the copies stacked) in well under a
  second. Highlights are CSS rules on the cached SVG, so moving them costs no re-layout.
- ``VisitAnimation(events, gf)``: the recorded ``graph.visit`` / ``graph.add`` events of one
  ``ggml_build_forward_expand``: the depth-first walk over ``src[]``, the hash-set lookups that hit (already
  visited) or insert, the DFS stack, and the moment each tensor is appended to ``nodes[]`` or ``leafs[]``.
"""
from __future__ import annotations

import json
import time

import ipywidgets as W
import numpy as np

from ...capture.graph import as_cgraph
from ...ggml import memory
from ...ggml.graph import graph_key
from ...ggml.tensor import op_desc, type_name
from .. import graph_dot as G
from ._base import (
    VizWidget,
    book_payload,
    esc,
    html_table,
    new_prefix,
    on_click,
    stepper_pane,
    svg_canvas,
    svg_window,
)

# Layout options that keep Graphviz fast on big pictures (network-simplex and crossing-minimisation limits).
_FAST = {"nslimit": "2", "nslimit1": "2", "mclimit": "0.2"}


def _sel(prefix, vertices):
    return ", ".join(f"#{prefix}{v}" for v in vertices)


def highlight_css(prefix: str, vertices, rule: str | None = None) -> str:
    """CSS that outlines the given vertices of a picture made with ``id_prefix=prefix``."""
    vertices = list(vertices)
    if not vertices:
        return ""
    # descendant selectors: with a tooltip Graphviz wraps the shape in <g id="a_..."><a>...</a></g>
    sel = ", ".join(f"#{prefix}{v} path, #{prefix}{v} polygon, #{prefix}{v} ellipse" for v in vertices)
    return f"{sel} {{ {rule or 'stroke: #d50000 !important; stroke-width: 5px !important;'} }}"


def node_buffers(gf) -> dict:
    """{node index: the buffer its data lives in} (``memory.resolve``'s label), e.g. ``GraphView(gf,
    color_by=node_buffers(gf))`` to colour the DAG by memory."""

    out = {}
    for i, t in enumerate(gf.nodes):
        try:
            out[i] = memory.resolve(t.data)[2] if t.data else "no data"
        except ValueError:
            out[i] = "outside ggviz buffers"
    return out


def tensor_info(gf, i: int, kind: str = "node") -> dict:
    """Plain data about node (or leaf) ``i`` of ``gf``, read from the tensor struct."""
    t = gf.nodes[i] if kind == "node" else gf.leafs[i]
    return {"kind": kind, "index": i, "name": t.name, "op": op_desc(t), "type": type_name(t.type),
            "ne": list(t.shape), "nb": list(t.strides), "layer": G.layer_of(t.name),
            "src": [s.name for s in t.src if s is not None],
            "view_src": t.view_src.name if t.view_src is not None else None, "view_offs": t.view_offs}


class GraphView(VizWidget):
    """A cgraph as a DAG, collapsible per layer, clickable, recolourable.

    ``collapse``: "auto" (every layer collapsed when the graph has layers), "all", or a set of layer indices.
    ``color_by``: "op" | "type" | None | {node index, name or address: value} | callable(tensor) -> value.
    ``fold``: runs of identical collapsed layers drawn as one box (``graph_dot.graph_to_dot_grouped``); a click on
    it opens its first layer. ``max_open``: how many layers ``expand`` keeps open at once (older ones fold again),
    so that clicking around keeps the picture small; ``expand_all`` opens every layer regardless (the layered layout: < 1 s).
    """

    def __init__(self, gf, collapse="auto", color_by="op", title: str | None = None, rankdir: str = "TB",
                 max_open: int = 3, attributes: dict | None = None, max_height: str = "700px", fold: bool = False):
        self.gf = gf = as_cgraph(gf)                 # a GraphRecord draws as the graph it recorded
        self.fold = fold                             # runs of identical collapsed layers as one box (graph_dot)
        self.layers = G.node_layers(gf)
        self.all_layers = sorted({il for il in self.layers if il is not None})
        if collapse in ("auto", "all"):
            self.collapsed = set(self.all_layers) if (collapse == "all" or len(self.all_layers) > 1) else set()
        else:
            self.collapsed = {int(x) for x in collapse} & set(self.all_layers)
        self.color_by = color_by
        self.attributes = dict(attributes or {})      # extra colourings offered in the widget's dropdown
        if not isinstance(color_by, str) and color_by is not None:
            self.attributes.setdefault("attribute", color_by)
        self.title = title
        self.rankdir = rankdir
        self.max_open = max_open
        self.max_height = max_height
        self.prefix = new_prefix("dag")
        self.selected: tuple | None = None          # ("node", i) | ("leaf", j)
        self.highlight: list = []                  # node indices outlined
        self._cache: dict = {}
        self.last_render_s = 0.0

    # ---------------------------------------------------------------- picture
    def _color_key(self):
        cb = self.color_by
        return cb if isinstance(cb, str) or cb is None else ("attr", id(cb))

    def _resolved_color(self):
        cb = self.color_by
        if isinstance(cb, str) and cb in self.attributes:
            return self.attributes[cb]
        return cb

    def layout(self, collapsed=None):
        """(svg, info) for a set of collapsed layers (cached: the same picture is laid out once)."""
        collapsed = frozenset(self.collapsed if collapsed is None else collapsed)
        key = (collapsed, self._color_key())
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        dot, info = G.graph_to_dot_grouped(self.gf, collapse=collapsed, color_by=self._resolved_color(),
                                           title=self.title, rankdir=self.rankdir, id_prefix=self.prefix,
                                           fold=self.fold)
        n_vis = info["n_nodes_drawn"] + info["n_leafs_drawn"]
        if n_vis > 250 and info["layout"] == "dot":      # (a laid-out picture is only drawn: nothing to tune)
            dot.graph_attr.update(_FAST)
        svg = dot.pipe(format="svg").decode("utf-8")
        svg = svg[svg.index("<svg"):]
        self.last_render_s = time.perf_counter() - t0
        info["render_s"] = self.last_render_s
        self._cache[key] = (svg, info)
        return svg, info

    def dot(self, highlight=None, legend: bool = True):
        """The ``graphviz.Digraph`` of the current state, highlight baked in (for PNG/PDF export)."""
        hl = self.highlight if highlight is None else highlight
        return G.graph_to_dot_grouped(self.gf, collapse=self.collapsed, color_by=self._resolved_color(),
                                      title=self.title, rankdir=self.rankdir, highlight=hl, legend=legend,
                                      id_prefix=self.prefix, fold=self.fold)[0]

    def png(self, dpi: int = 96) -> bytes:
        d = self.dot()
        d.graph_attr["dpi"] = str(dpi)
        return d.pipe(format="png")

    def svg(self) -> str:
        return self.layout()[0]

    def vertex(self, i: int, kind: str = "node"):
        info = self.layout()[1]
        return info["vertex_of_node"][i] if kind == "node" else info["vertex_of_leaf"][i]

    def css(self) -> str:
        info = self.layout()[1]
        verts = {info["vertex_of_node"][i] for i in self.highlight}
        if self.selected is not None:
            k, i = self.selected
            v = info["vertex_of_node"][i] if k == "node" else info["vertex_of_leaf"][i]
            if v is not None:
                verts.add(v)
        return highlight_css(self.prefix, sorted(verts))

    def legend_html(self) -> str:
        items = self.layout()[1]["colors"]
        chips = "".join(f"<span style='display:inline-block;margin:1px 6px 1px 0'><span style='display:inline-block;"
                        f"width:12px;height:12px;background:{c};border:1px solid #777;vertical-align:middle'></span> "
                        f"{esc(k)}</span>" for k, c in items.items())
        return f"<div style='font-size:12px'>{chips}</div>"

    # ---------------------------------------------------------------- actions
    def expand(self, il: int):
        """Open layer ``il`` (the oldest open layer closes when more than ``max_open`` would be open)."""
        il = int(il)
        if il in self.collapsed:
            self.collapsed.discard(il)
            opened = [x for x in self.all_layers if x not in self.collapsed]
            if self.max_open and len(opened) > self.max_open:
                self._open_order = [x for x in getattr(self, "_open_order", []) if x in opened and x != il]
                while len(opened) > self.max_open and self._open_order:
                    self.collapsed.add(self._open_order.pop(0))
                    opened = [x for x in self.all_layers if x not in self.collapsed]
            self._open_order = [x for x in getattr(self, "_open_order", []) if x != il] + [il]
        self._changed()

    def collapse(self, il: int):
        self.collapsed.add(int(il))
        self._changed()

    def collapse_all(self):
        self.collapsed = set(self.all_layers)
        self._changed()

    def expand_all(self):
        """Open every layer: the whole graph, node by node. With every layer open the picture is laid out per layer
        (``graph_dot.layered_layout``): ~0.5 s for the 1086-node decode graph, where ``dot`` needs 15-20 s."""
        self.collapsed = set()
        self._changed()

    def set_color_by(self, color_by):
        self.color_by = color_by
        self._changed()

    def select(self, what, kind: str = "node"):
        """Select a node by index or name (or a leaf with ``kind="leaf"``): outline it, opening its layer."""
        if isinstance(what, str):
            names = [t.name for t in (self.gf.nodes if kind == "node" else self.gf.leafs)]
            if what not in names:
                raise KeyError(f"no {kind} named {what!r} in the graph")
            what = names.index(what)
        i = int(what)
        n = self.gf.n_nodes if kind == "node" else self.gf.n_leafs
        if not 0 <= i < n:
            raise IndexError(f"{kind} {i} out of range ({n})")
        self.selected = (kind, i)
        if kind == "node" and self.layers[i] in self.collapsed:
            self.expand(self.layers[i])
        self._changed()
        return self

    def click(self, vertex: str):
        """What a click on SVG vertex ``vertex`` does: a layer box opens, a node/leaf is selected."""
        if vertex.startswith("L"):
            self.expand(int(vertex[1:]))
        elif vertex.startswith("n"):
            self.select(int(vertex[1:]))
        elif vertex.startswith("l"):
            self.select(int(vertex[1:]), kind="leaf")

    # ---------------------------------------------------------------- state
    def state(self) -> dict:
        svg, info = self.layout()
        st = {"n_nodes": self.gf.n_nodes, "n_leafs": self.gf.n_leafs, "collapsed": sorted(self.collapsed),
              "open": [x for x in self.all_layers if x not in self.collapsed],
              "n_nodes_drawn": info["n_nodes_drawn"], "n_leafs_drawn": info["n_leafs_drawn"],
              "boxes": dict(info["boxes"]), "n_edges": info["n_edges"], "colors": dict(info["colors"]),
              "render_s": info["render_s"], "highlight": list(self.highlight), "selected": None}
        if self.selected is not None:
            st["selected"] = tensor_info(self.gf, self.selected[1], self.selected[0])
            st["selected"]["vertex"] = self.vertex(self.selected[1], self.selected[0])
        return st

    def info_html(self) -> str:
        if self.selected is None:
            return "<i>click a node (box) or leaf (ellipse); click a layer box to open it</i>"
        d = tensor_info(self.gf, self.selected[1], self.selected[0])
        return html_table([{"field": k, "value": v} for k, v in d.items()], title=f"{d['kind']} {d['index']}")

    def to_html(self) -> str:
        svg = self.svg()
        return (f"<div>{self.legend_html()}<style>{self.css()}</style>"
                f"<div style='overflow:auto;max-height:{self.max_height}'>{svg}</div></div>")

    # ---------------------------------------------------------------- widget
    def _build(self):

        self._canvas = svg_canvas(prefix=self.prefix, max_height=self.max_height)
        on_click(self._canvas, self.click)
        opts = ["op", "type"] + list(self.attributes)
        cur = self.color_by if isinstance(self.color_by, str) else "attribute"
        self._w_color = W.Dropdown(options=opts, value=cur if cur in opts else "op", description="colour by",
                                   layout=W.Layout(width="220px"))
        self._w_color.observe(lambda ch: self.set_color_by(ch["new"]), "value")
        b_coll = W.Button(description="collapse all layers", layout=W.Layout(width="160px"))
        b_coll.on_click(lambda _: self.collapse_all())
        b_open = W.Button(description="open all layers", layout=W.Layout(width="140px"))
        b_open.on_click(lambda _: self.expand_all())
        self._w_node = W.BoundedIntText(value=0, min=0, max=max(0, self.gf.n_nodes - 1), description="node #",
                                        layout=W.Layout(width="160px"))
        self._w_node.observe(lambda ch: self.select(ch["new"]), "value")
        self._w_legend = W.HTML()
        self._w_status = W.HTML()
        top = W.HBox([self._w_color, b_coll, b_open, self._w_node, self._w_status])
        return W.VBox([top, self._w_legend, self._canvas])

    def focus(self) -> str:
        """The element the picture opens on: the selection, else the first node of the first open layer (the part
        being taught), else nothing (the top)."""
        info = self.layout()[1]
        if self.selected is not None:
            return self.prefix + (self.vertex(self.selected[1], self.selected[0]) or "")
        opened = [x for x in self.all_layers if x not in self.collapsed]
        if opened and len(opened) < len(self.all_layers):
            first = next((i for i, il in enumerate(self.layers) if il == opened[0]), None)
            if first is not None and info["vertex_of_node"][first]:
                return self.prefix + info["vertex_of_node"][first]
        return ""

    def _refresh(self):
        svg, info = self.layout()
        if self._canvas.svg != svg:
            self._canvas.svg = svg
        self._canvas.css = self.css()
        self._canvas.focus = self.focus()
        self._w_legend.value = self.legend_html()
        self._canvas.info = self.info_html()

    def book_view(self) -> dict:
        """The picture as it is (the layers open now), pannable and zoomable; a click on a node or leaf selects it
        (outline and its table, recorded for every vertex drawn); a layer box says that opening it needs a kernel
        (a new layout). Records embedded: ``tensor_info`` of each drawn node and leaf, the SVG."""
        svg, info = self.layout()
        sel = self.selected
        css, infos = {}, {}
        opened = [x for x in self.all_layers if x not in self.collapsed]
        try:
            for kind, verts in (("node", info["vertex_of_node"]), ("leaf", info["vertex_of_leaf"])):
                for i, v in enumerate(verts):
                    if v is None or v in css or v.startswith("L"):
                        continue
                    self.selected = (kind, i)
                    css[v], infos[v] = self.css(), self.info_html()
        finally:
            self.selected = sel
        folds = info.get("folds", {})
        folded = {x for run in folds.values() for x in run[1:]}
        for il in self.all_layers:
            if il in self.collapsed and il not in folded:
                what = f"layer {il}" if il not in folds else f"layers {folds[il][0]}–{folds[il][-1]} (identical)"
                css[f"L{il}"] = highlight_css(self.prefix, [f"L{il}"])
                infos[f"L{il}"] = (f"<div style='max-width:320px'><b>{what}</b> collapsed here. Opening it lays "
                                   f"the graph out again (Graphviz), which needs a kernel: in a live notebook, click "
                                   f"the box or call <code>view.expand({il})</code>. This page shows "
                                   + (f"layer {', '.join(map(str, opened))} open" if opened else "every layer "
                                      "collapsed") + ".</div>")
        legend = self.legend_html()
        state = dict(svg=svg, css=self.css(), prefix=self.prefix, focus=self.focus(), info=self.info_html(),
                     clicked="", n_clicks=0, max_height=self.max_height, max_width="none", fit_width=False)
        state["info"] = legend + state["info"]
        return book_payload("svg_canvas.js", state, [
            {"on": "clicked", "set": "css", "values": css},
            {"on": "clicked", "set": "info", "values": {k: legend + v for k, v in infos.items()}}])
        self._w_status.value = (f"<span style='font-size:12px'>{info['n_nodes_drawn']} node boxes, "
                                f"{info['n_leafs_drawn']} leafs, layout ({info['layout']}) "
                                f"{info['render_s'] * 1e3:.0f} ms</span>")


# ------------------------------------------------------------------------------------------------------------------

class VisitAnimation(VizWidget):
    """``ggml_visit_parents`` replayed from recorded events.

    ``events``: a ``trace.Recorder`` (or list of event dicts) holding the ``graph.visit``/``graph.add`` events of a
    graph build; ``gf``: that graph (its final ``nodes``/``leafs``, used to draw it; the events alone define the
    order). Step ``k`` shows event ``k``: a *visit* (new: the tensor's address is inserted into the visited hash set
    at ``hash_pos`` and the walk descends into its ``src[]``; hit: it was already there, nothing is added) or an
    *add* (all sources done: appended to ``nodes[]``, or to ``leafs[]`` if it is not computed).
    """

    def __init__(self, events, gf, graph_id: int | None = None, max_height: str = "650px"):
        evs = events.events if hasattr(events, "events") else list(events)
        gid = graph_key(gf) if graph_id is None else graph_id
        self.events = [e for e in evs if e["kind"] in ("graph.visit", "graph.add") and e.get("graph") == gid]
        if not self.events:
            raise ValueError("no graph.visit/graph.add events of this graph were recorded (record the build with "
                             "ggviz.trace.Recorder)")
        self.gf = gf
        self.hash_size = int(gf.visited_hash_set.size)
        self.view = GraphView(gf, collapse="auto", max_height=max_height)
        addrs = [t.addr for t in gf.nodes] + [t.addr for t in gf.leafs]
        self._vid = {a: k for k, a in enumerate(addrs)}         # tensor -> vertex slot (nodes, then leafs)
        n = len(addrs)
        big = np.iinfo(np.int64).max
        self.first_visit = np.full(n, big, dtype=np.int64)
        self.added_at = np.full(n, big, dtype=np.int64)
        self.slot = np.full(n, -1, dtype=np.int64)
        self.kind = np.array(["node"] * gf.n_nodes + ["leaf"] * gf.n_leafs)
        self.n_hits = np.zeros(len(self.events), dtype=np.int64)
        hits = 0
        for k, e in enumerate(self.events):
            v = self._vid.get(e["addr"])
            if e["kind"] == "graph.visit":
                if e["hit"]:
                    hits += 1
                elif v is not None and self.first_visit[v] == big:
                    self.first_visit[v] = k
                    self.slot[v] = e["hash_pos"]
            elif v is not None:
                self.added_at[v] = k
            self.n_hits[k] = hits
        self.pos = 0

    @property
    def n_steps(self) -> int:
        return len(self.events)

    def goto(self, k: int):
        self.pos = int(np.clip(k, 0, self.n_steps - 1))
        self._changed()
        return self

    def step(self, n: int = 1):
        return self.goto(self.pos + n)

    def _tensor(self, v: int):
        return self.gf.nodes[v] if v < self.gf.n_nodes else self.gf.leafs[v - self.gf.n_nodes]

    def state(self, k: int | None = None) -> dict:
        """What step ``k`` (default: the current one) shows, as plain data."""
        k = self.pos if k is None else int(k)
        e = self.events[k]
        v = self._vid.get(e["addr"])
        visited = self.first_visit <= k
        added = self.added_at <= k
        on_stack = visited & ~added
        stack = sorted(np.nonzero(on_stack)[0], key=lambda x: self.first_visit[x])
        nodes_done = int(np.sum(added[:self.gf.n_nodes]))
        leafs_done = int(np.sum(added[self.gf.n_nodes:]))
        if e["kind"] == "graph.visit":
            action = "hit" if e["hit"] else "insert"
            text = (f"visit {e['name']!r}: already in the hash set (slot {e['hash_pos']}) - nothing to do"
                    if e["hit"] else f"visit {e['name']!r}: new, inserted at hash slot {e['hash_pos']}; "
                                     f"now visiting its src[]")
        else:
            action = "append_" + e["kind_"]
            text = f"all sources of {e['name']!r} done: {e['kind_']}s[{e['index']}] = {e['name']!r}"
        return {"step": k, "n_steps": self.n_steps, "event": {x: e[x] for x in e if x not in ("t",)},
                "action": action, "text": text, "tensor": v, "name": e["name"], "hash_pos": int(e["hash_pos"]),
                "stack": [self._tensor(x).name for x in stack], "n_nodes": nodes_done, "n_leafs": leafs_done,
                "nodes_tail": [t.name for t in self.gf.nodes[max(0, nodes_done - 8):nodes_done]],
                "leafs_tail": [t.name for t in self.gf.leafs[max(0, leafs_done - 8):leafs_done]],
                "hash_used": int(np.sum(visited)), "hash_size": self.hash_size, "n_hits": int(self.n_hits[k]),
                "layer": G.layer_of(e["name"]) if v is not None and v < self.gf.n_nodes else
                self._leaf_layer(v)}

    def _leaf_layer(self, v):
        if v is None:
            return None
        if not hasattr(self, "_leaf_layers"):
            # a leaf is drawn next to the first node that reads it
            first: dict = {}
            for i, n in enumerate(self.gf.nodes):
                for s in n.src:
                    if s is not None and s.addr not in first:
                        first[s.addr] = self.view.layers[i]
            self._leaf_layers = first
        return self._leaf_layers.get(self._tensor(v).addr)

    def _sync_view(self, st):
        il = st["layer"]
        want = set(self.view.all_layers) - ({il} if il is not None else set())
        if want != self.view.collapsed:
            self.view.collapsed = want

    def css(self, st=None) -> str:
        """Status of every drawn vertex at the current step, as CSS on the cached layout."""
        st = st or self.state()
        self._sync_view(st)
        info = self.view.layout()[1]
        k = st["step"]
        verts = list(info["vertex_of_node"]) + list(info["vertex_of_leaf"])
        visited = self.first_visit <= k
        added = self.added_at <= k
        groups = {"todo": [], "stack": [], "done": []}
        box_state: dict = {}
        for x, vert in enumerate(verts):
            if vert is None:
                continue
            s = "done" if added[x] else ("stack" if visited[x] else "todo")
            if vert.startswith("L"):
                box_state.setdefault(vert, set()).add(s)
                continue
            groups[s].append(vert)
        for vert, ss in box_state.items():
            groups["done" if ss == {"done"} else ("todo" if ss == {"todo"} else "stack")].append(vert)
        p = self.view.prefix
        css = []
        if groups["todo"]:
            css.append(f"{_sel(p, groups['todo'])} {{ opacity: 0.25; }}")
        # "#i" / "leaf j" (the small text of a vertex's label) is the index the tensor gets when it is appended:
        # hidden until then, so no step shows a position the walk has not assigned yet
        unplaced = [v for v in groups["todo"] + groups["stack"] if not v.startswith("L")]
        if unplaced:
            css.append(", ".join(f"#{p}{v} text[font-size='8.00']" for v in unplaced) + " { visibility: hidden; }")
        if groups["stack"]:
            css.append(highlight_css(p, groups["stack"], "stroke: #f9a825 !important; stroke-width: 4px !important;"
                                     " stroke-dasharray: 6 3;"))
        cur = verts[st["tensor"]] if st["tensor"] is not None else None
        if cur:
            rule = ("stroke: #ff6d00 !important; stroke-width: 6px !important; stroke-dasharray: none;"
                    if st["action"] == "hit" else
                    "stroke: #d50000 !important; stroke-width: 6px !important; stroke-dasharray: none;")
            css.append(highlight_css(p, [cur], rule))
        return "\n".join(css)

    def hash_table(self, st=None, max_rows: int = 12) -> str:
        """The visited hash set's used slots at step ``st``: slot -> tensor, in slot order (the set has thousands of
        slots and a handful used: a picture of all of them shows specks), the current one red."""
        st = st or self.state()
        k = st["step"]
        used = sorted((int(self.slot[v]), v) for v in np.nonzero((self.first_visit <= k) & (self.slot >= 0))[0])
        if len(used) > max_rows:               # the slots nearest the current one
            at = next((i for i, (sl, _) in enumerate(used) if sl >= st["hash_pos"]), len(used) - 1)
            lo = max(0, min(at - max_rows // 2, len(used) - max_rows))
            shown, cut = used[lo:lo + max_rows], (lo, len(used) - lo - max_rows)
        else:
            shown, cut = used, (0, 0)
        rows = []
        for sl, v in shown:
            cur = sl == st["hash_pos"]
            style = " style='color:#d50000;font-weight:bold'" if cur else ""
            rows.append(f"<tr{style}><td style='text-align:right;padding:0 8px'>{sl}</td>"
                        f"<td style='padding:0 8px'><code>{esc(self._tensor(v).name)}</code></td></tr>")
        more = [f"<tr><td colspan=2 style='padding:0 8px'>… {n} more used slots</td></tr>" if n else ""
                for n in cut]
        return ("<table style='border-collapse:collapse;font-size:12px'><thead><tr><th style='padding:0 8px'>slot"
                "</th><th style='text-align:left;padding:0 8px'>tensor</th></tr></thead><tbody>"
                + more[0] + "".join(rows) + more[1] + "</tbody></table>")

    def panel_html(self, st=None) -> str:
        st = st or self.state()
        color = {"hit": "#ff6d00", "insert": "#d50000"}.get(st["action"], "#2e7d32")
        stack = " → ".join(esc(s) for s in st["stack"][-12:])
        if len(st["stack"]) > 12:
            stack = "… → " + stack
        return (f"<div style='font-size:14px;max-width:460px'>"
                f"<b>event {st['step']} / {st['n_steps'] - 1}</b><br/>"     # as the stepper's header counts
                f"<span style='color:{color};font-weight:bold'>{esc(st['text'])}</span><br/><br/>"
                f"<b>DFS stack</b> (visited, sources not finished; depth {len(st['stack'])}):<br/>"
                f"<code>{stack or '(empty)'}</code><br/><br/>"
                f"<b>nodes[]</b> n_nodes = {st['n_nodes']}: <code>… {esc(', '.join(st['nodes_tail']))}</code><br/>"
                f"<b>leafs[]</b> n_leafs = {st['n_leafs']}: <code>… {esc(', '.join(st['leafs_tail']))}</code>"
                f"<br/><br/><b>visited hash set</b>: {st['hash_used']} of {st['hash_size']} slots used (a tensor's "
                f"slot: its address hashed, modulo {st['hash_size']}), {st['n_hits']} hits so far (red: slot "
                f"{st['hash_pos']})<br/>{self.hash_table(st)}<br/>"
                f"<span style='font-size:11px'>faded: not visited yet · dashed amber: on the DFS stack · red: this "
                f"step (orange: a hash hit)</span></div>")

    def to_html(self, window=(560, 500)) -> str:
        """The current step as static HTML: the DAG cropped to a window around the visited tensor, the panel."""
        st = self.state()
        css = self.css(st)
        svg = self.view.svg()
        verts = list(self.view.layout()[1]["vertex_of_node"]) + list(self.view.layout()[1]["vertex_of_leaf"])
        v = verts[st["tensor"]] if st["tensor"] is not None else None
        if window and v:
            svg = svg_window(svg, self.view.prefix + v, *window)
        return (f"<div style='display:flex;gap:12px;align-items:flex-start'><div><style>{css}</style>{svg}</div>"
                f"{self.panel_html(st)}</div>")

    def frame(self, st=None) -> dict:
        """What the browser shows at step ``st``: the vertices' CSS, the vertex to scroll to, the panel."""
        st = st or self.state()
        css = self.css(st)
        focus = ""
        if st["tensor"] is not None:
            info = self.view.layout()[1]
            v = (list(info["vertex_of_node"]) + list(info["vertex_of_leaf"]))[st["tensor"]]
            focus = self.view.prefix + v if v else ""
        return {"css": css, "focus": focus, "panel": self.panel_html(st)}

    def _pane_traits(self) -> dict:
        return dict(label="event", n=self.n_steps, pos=self.pos, play=True,
                    names=json.dumps([e["name"] for e in self.events]), prefix=self.view.prefix,
                    max_height=self.view.max_height, max_width="720px", frame=json.dumps(self.frame()),
                    svg=self.view.svg())

    def _build(self):
        self._pane = stepper_pane(**self._pane_traits())
        self._pane.observe(lambda ch: ch["new"] != self.pos and self.goto(ch["new"]), "pos")
        return self._pane

    def _refresh(self):
        frame = json.dumps(self.frame())            # (syncs the open layer first)
        svg = self.view.svg()
        if self._pane.svg != svg:
            self._pane.svg = svg
        self._pane.frame = frame
        if self._pane.pos != self.pos:
            self._pane.pos = self.pos

    def book_view(self) -> dict:
        """Every event's frame and picture, so the book plays the whole walk with no kernel. Records embedded:
        the ``graph.visit`` / ``graph.add`` events replayed (per step: the CSS of every vertex, the panel)."""
        svgs, pick, frames = {}, [], []
        for k in range(self.n_steps):
            f = self.frame(self.state(k))
            pick.append(svgs.setdefault(self.view.svg(), len(svgs)))
            frames.append(json.dumps(f))
        self._sync_view(self.state())
        svgs = list(svgs)
        state = dict(self._pane_traits())
        state.update(svg=svgs[pick[self.pos]], frame=frames[self.pos])
        return book_payload("stepper.js", state, [{"on": "pos", "set": "svg", "pick": pick, "values": svgs},
                                                  {"on": "pos", "set": "frame", "values": frames}])
