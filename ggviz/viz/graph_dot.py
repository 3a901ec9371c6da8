"""A ``ggml_cgraph`` as a Graphviz picture: nodes (computed tensors) as boxes, leafs (constants, inputs) as ellipses.

In the spirit of ``ggml_graph_dump_dot`` (ggml.c), drawn from the engine's own ``gf.nodes`` / ``gf.leafs`` lists:
each node is labelled with its index in ``gf->nodes`` (the order the CPU backend computes them), its name, op and
shape; each leaf with its index in ``gf->leafs``. Edges go from ``src[k]`` to the node that reads it, emitted in
node order then src slot order, and are labelled with the slot ``k`` when a node has more than one source.
"""
from __future__ import annotations

import html
import os

import graphviz

from ..capture.nodes import layer_of
from ..ggml.tensor import op_desc, type_name
from .layout import _GROUPED_EDGE_ATTR, _GROUPED_GRAPH_ATTR, _GROUPED_NODE_ATTR, _dot_program, layered_layout, node_bands

# a fixed palette so the same op gets the same colour in every picture
_PALETTE = ["#e3f2fd", "#fff3e0", "#e8f5e9", "#fce4ec", "#ede7f6", "#e0f7fa", "#fffde7", "#efebe9", "#f1f8e9",
            "#e8eaf6", "#fbe9e7", "#e0f2f1", "#f3e5f5", "#fff8e1"]
_LEAF_COLOR = "#f5f5f5"


def _shape(t) -> str:
    ne = list(t.shape)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return "[" + ", ".join(str(x) for x in ne) + "]"


def _color(key: str, table: dict) -> str:
    if key not in table:
        table[key] = _PALETTE[len(table) % len(_PALETTE)]
    return table[key]


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


def graph_to_dot(gf, title: str | None = None, color_by: str | None = "op", rankdir: str = "TB"):
    """Return a ``graphviz.Digraph`` of ``gf``: one box per node, one ellipse per leaf, edges src -> dst.

    ``color_by``: "op" (one colour per op), "type" (per tensor type) or None. Graphviz ids are ``node_<i>`` and
    ``leaf_<j>`` (their indices in ``gf.nodes`` / ``gf.leafs``), so a picture can be matched back to the graph.
    """

    if color_by not in ("op", "type", None):
        raise ValueError(f"color_by must be 'op', 'type' or None, got {color_by!r}")
    dot = graphviz.Digraph(name="ggml_cgraph", graph_attr={"rankdir": rankdir, "fontname": "Helvetica",
                                                           "fontsize": "11"},
                           node_attr={"fontname": "Helvetica", "fontsize": "9"},
                           edge_attr={"fontname": "Helvetica", "fontsize": "8", "color": "#616161"})
    if title:
        dot.attr(label=title, labelloc="t")
    colors: dict = {}
    ids = {}
    for j, t in enumerate(gf.leafs):
        ids[t.addr] = f"leaf_{j}"
        label = (f"<<font point-size='8'>leaf {j}</font><br/><b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        fill = _color(type_name(t.type), colors) if color_by == "type" else _LEAF_COLOR
        dot.node(f"leaf_{j}", label=label, shape="ellipse", style="filled", fillcolor=fill)
    for i, t in enumerate(gf.nodes):
        ids[t.addr] = f"node_{i}"
        op = op_desc(t)
        label = (f"<<font point-size='8'>#{i}</font> <b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(op)}<br/>{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        key = op if color_by == "op" else type_name(t.type)
        fill = _color(key, colors) if color_by else "#ffffff"
        dot.node(f"node_{i}", label=label, shape="box", style="rounded,filled", fillcolor=fill)
    n_ext = 0
    for i, t in enumerate(gf.nodes):
        srcs = [(k, s) for k, s in enumerate(t.src) if s is not None]
        for k, s in srcs:
            sid = ids.get(s.addr)
            if sid is None:    # a source outside this graph (e.g. a graph_view): draw it once, dashed
                sid = f"ext_{n_ext}"
                n_ext += 1
                ids[s.addr] = sid
                dot.node(sid, label=f"{s.name or '?'}\n{type_name(s.type)} {_shape(s)}", shape="ellipse",
                         style="dashed")
            attrs = {"label": f"src{k}"} if len(srcs) > 1 else {}
            dot.edge(sid, f"node_{i}", **attrs)
    return dot


def render(gf, path, fmt: str = "svg", title: str | None = None, color_by: str | None = "op") -> str:
    """Draw ``gf`` to ``path`` (the extension is set to ``fmt``); returns the written file's path.

    Needs Graphviz's ``dot`` program on PATH.
    """

    dot = graph_to_dot(gf, title=title, color_by=color_by)
    root, ext = os.path.splitext(str(path))
    if ext.lstrip(".") != fmt:
        root = str(path)
    out = f"{root}.{fmt}"
    data = dot.pipe(format=fmt)
    with open(out, "wb") as f:
        f.write(data)
    return out


# ------------------------------------------------------------------------------------------------------------------
# Layers: llama.cpp's graph callback names a layer's tensors "<name>-<il>"; grouping by that suffix lets a
# 1086-node decode graph be drawn as 30 boxes, with one layer opened up.


# (``layer_of``, the layer in a name, is ``ggviz.capture.nodes``': the recordings number layers the same way)

# op -> fill colour. Fixed, so one op has one colour in every picture (and the collapsed and expanded views agree);
# views/reshapes, which compute nothing, are light grey.
OP_COLORS = {
    "MUL_MAT": "#90caf9", "ADD": "#a5d6a7", "MUL": "#dce775", "RMS_NORM": "#ffe082", "NORM": "#ffe082",
    "ROPE": "#ce93d8", "SOFT_MAX": "#ef9a9a", "GET_ROWS": "#80deea", "SET_ROWS": "#ffab91", "SWIGLU": "#f48fb1",
    "SILU": "#f48fb1", "GELU": "#f48fb1", "CONT": "#bcaaa4", "CPY": "#bcaaa4", "DUP": "#bcaaa4", "SCALE": "#b39ddb",
    # the ops that compute nothing (views) in one grey family, each its own shade
    "RESHAPE": "#ebebeb", "VIEW": "#d2d2d2", "PERMUTE": "#b5b5b5", "TRANSPOSE": "#969696", "SUM_ROWS": "#fff59d",
    "FLASH_ATTN_EXT": "#ef9a9a", "SUB": "#a5d6a7", "DIV": "#dce775", "SQR": "#dce775", "SQRT": "#dce775",
}
_EXTRA_COLORS = ["#b2dfdb", "#f8bbd0", "#d1c4e9", "#ffccbc", "#c8e6c9", "#b3e5fc", "#fff9c4", "#d7ccc8",
                 "#cfd8dc", "#f0f4c3", "#e1bee7", "#ffe0b2"]
BOX_COLOR = "#cfd8dc"


def node_layers(gf) -> list:
    """Per node of ``gf``: its layer (from the name) or None (embeddings, output head).

    A node whose name carries no layer (``node_1073``: llama.cpp's ``ggml_get_rows(cur, inp_out_ids)`` in the last
    layer, which it leaves unnamed) belongs to layer il when it sits among layer il's nodes in the node order and
    every node that reads it is in layer il: drawn inside its layer's box, not as a stray node with edges both ways."""
    layers = [layer_of(t.name) for t in gf.nodes]
    if None not in layers:
        return layers
    span: dict = {}
    for i, il in enumerate(layers):
        if il is not None:
            lo, hi = span.get(il, (i, i))
            span[il] = (min(lo, i), max(hi, i))
    index = {t.addr: i for i, t in enumerate(gf.nodes)}
    users: dict = {}
    for i, t in enumerate(gf.nodes):
        for s in t.src:
            if s is not None and s.addr in index:
                users.setdefault(index[s.addr], set()).add(i)
    out = list(layers)
    for i, il in enumerate(layers):
        if il is not None:
            continue
        got = {layers[j] for j in users.get(i, ())}
        if len(got) == 1 and None not in got:
            cand = got.pop()
            lo, hi = span[cand]
            if lo < i < hi:
                out[i] = cand
    return out


def categorical_colors(values) -> dict:
    """value -> colour for a set of category values (stable: sorted by str)."""
    out = {}
    for v in sorted(set(values), key=lambda x: (x is None, str(x))):
        out[v] = "#f5f5f5" if v is None else _EXTRA_COLORS[len(out) % len(_EXTRA_COLORS)]
    return out


def op_color(op: str, extra: dict | None = None) -> str:
    if op in OP_COLORS:
        return OP_COLORS[op]
    if extra is None:
        return _EXTRA_COLORS[sum(map(ord, op)) % len(_EXTRA_COLORS)]
    if op not in extra:
        extra[op] = _EXTRA_COLORS[len(extra) % len(_EXTRA_COLORS)]
    return extra[op]


def _key_value(attr, i: int, t):
    """Look a node up in a user attribute mapping: by node index, tensor, address or name."""
    if callable(attr):
        return attr(t)
    for k in (i, t.addr, t.name):
        if k in attr:
            return attr[k]
    return attr.get(t, None) if not isinstance(t, (int, str)) else None


class DotInfo(dict):
    """What a grouped picture contains (plain data): counts, and which vertex stands for each node/leaf."""


# "auto" lays a graph out per layer (see ``layered_layout``) from this many drawn vertices on
LAYERED_MIN_VERTICES = 200


def graph_to_dot_grouped(gf, collapse=(), color_by="op", title: str | None = None, rankdir: str = "TB",
                         id_prefix: str = "", highlight=None, edge_labels: bool | None = None,
                         legend: bool = False, hide_leafs: bool = False, layout: str = "auto", fold: bool = False):
    """A ``graphviz.Digraph`` of ``gf`` where the layers in ``collapse`` are drawn as one box each.

    ``fold``: consecutive collapsed layers with the same structure (``layer_signature``: each node's op, type and
    shape, in order) are drawn as one box ``L<first>``, "layers a–b: n identical × k nodes": a 30-layer decode
    graph with layer 0 open reads as layer 0, one box for layers 1–28, layer 29 (it also holds the two unnamed
    GET_ROWS of ``inp_out_ids``, so it is not identical) and the output head.

    ``collapse``: layer indices (``"all"`` for every layer). A collapsed layer's nodes become one box labelled
    ``layer il (n nodes)``; leafs read only by collapsed layers (its weights, cache tensors, shared inputs) are
    folded into the boxes. ``color_by``: "op", "type", None, or a mapping/callable giving each node a category
    (e.g. the buffer it lives in); ``highlight``: a node index (or list) drawn with a thick red outline.
    Vertex names are ``n<i>`` (node i), ``l<j>`` (leaf j), ``L<il>`` (a layer box), ``x<k>`` (a source outside the
    graph); each vertex's SVG id is ``id_prefix`` + its name, so a picture can be restyled and clicked.

    ``layout``: "dot" (Graphviz ``dot`` lays the whole picture out), "layers" (``layered_layout``: every vertex and
    edge positioned here, one ``dot`` run per distinct layer structure; needs every layer open and rankdir "TB")
    or "auto" ("layers" when that applies and the picture has ``LAYERED_MIN_VERTICES`` vertices or more: the
    fully expanded 1086-node decode graph takes ``dot`` 15-20 s, the layered layout well under a second).
    A laid-out picture is a ``PinnedDigraph``: it renders with ``neato -n2`` (positions as given), and its
    DOT source carries ``layout=nop2`` so plain ``dot -Tsvg`` draws it the same way.

    Returns ``(dot, info)``; ``info`` holds ``n_nodes_drawn`` (node boxes + layer boxes), ``n_leafs_drawn``,
    ``boxes`` ({il: number of nodes}), ``vertex_of_node`` (list), ``vertex_of_leaf`` (list), ``colors`` (legend),
    ``n_edges``, ``layout`` ("dot" or "layers") and, for "layers", ``bands`` / ``templates`` (how many bands were
    stacked and how many of them ``dot`` laid out), ``band_order``, ``band_of_vertex`` (None: a shared vertex, in a
    lane) and ``positions`` ({vertex: (x, y, width, height)} in points, Graphviz's y-up coordinates).
    """

    if layout not in ("auto", "dot", "layers"):
        raise ValueError(f"layout must be 'auto', 'dot' or 'layers', got {layout!r}")
    layers = node_layers(gf)
    all_layers = sorted({il for il in layers if il is not None})
    collapse = set(all_layers) if collapse == "all" else {int(x) for x in collapse} & set(all_layers)
    highlight = set() if highlight is None else ({int(highlight)} if isinstance(highlight, (int,)) else
                                                 {int(h) for h in highlight})
    n_visible = sum(1 for il in layers if il not in collapse)
    if edge_labels is None:
        edge_labels = n_visible <= 80

    graph_attr = dict(_GROUPED_GRAPH_ATTR, rankdir=rankdir)
    if title:
        graph_attr.update(label=title, labelloc="t", fontsize="14")

    node_fill, legend_items = _node_fills(gf, color_by)
    if collapse and (isinstance(color_by, str) or color_by is None):
        # collapsed layers are grey boxes: the legend names only the colours of the nodes drawn one by one
        key = (lambda t: op_desc(t)) if color_by == "op" else (lambda t: type_name(t.type))
        drawn = {key(t) for i, t in enumerate(gf.nodes) if layers[i] not in collapse}
        legend_items = {k: c for k, c in legend_items.items() if k in drawn}
    folds = fold_runs(gf, layers, collapse) if fold else {}
    vx = _Vertices(gf, layers, collapse, hide_leafs, {il: run[0] for run in folds.values() for il in run})
    vx.folds = folds
    # the picture as statements, in the order they are written to the DOT source: ("node", name, attrs) and
    # ("edge", src, dst, attrs); both layouts write the same statements
    stmts = _vertex_stmts(gf, vx, node_fill, color_by, highlight, id_prefix)
    n_edges = _edge_stmts(gf, vx, stmts, edge_labels, id_prefix)
    legend_spec = _legend_spec(legend_items, color_by) if legend else None

    # ---- layout: dot for the whole picture, or the layered layout (every layer open, top to bottom)
    n_vertices = sum(1 for st in stmts if st[0] == "node")
    bands = node_bands(layers) if not collapse and rankdir == "TB" and len(all_layers) >= 2 else None
    use_layers = layout == "layers" or (layout == "auto" and n_vertices >= LAYERED_MIN_VERTICES)
    if layout == "layers" and bands is None:
        raise ValueError("layout='layers' needs a graph with at least 2 layers, every layer open and rankdir 'TB'")
    if use_layers and bands is not None and _dot_program() is not None:
        band_of = {vx.node[i]: b for i, b in enumerate(bands)}
        dot, lay = layered_layout(stmts, band_of, graph_attr, legend_spec)
        used = "layers"
    else:
        dot, lay, used = _dot_picture(stmts, graph_attr, legend_spec), {}, "dot"

    info = DotInfo(n_nodes_drawn=sum(1 for v in vx.node if not v.startswith("L")) + len(vx.box_members),
                   n_leafs_drawn=sum(v is not None for v in vx.leaf), boxes=dict(vx.layer_sizes),
                   folds={il0: list(run) for il0, run in folds.items()},
                   collapsed=sorted(collapse), vertex_of_node=vx.node, vertex_of_leaf=vx.leaf,
                   colors=legend_items, n_edges=n_edges, layers=layers, layout=used, **lay)
    return dot, info


def _node_fills(gf, color_by) -> tuple[list, dict]:
    """Each node's fill colour and the legend ({category: colour}): by op, by type, none (white), or by a user
    mapping/callable (one colour per category value, stable across pictures)."""
    extra: dict = {}
    legend_items: dict = {}
    node_fill = []
    if isinstance(color_by, str) or color_by is None:
        if color_by not in ("op", "type", None):
            raise ValueError(f"color_by must be 'op', 'type', None, a mapping or a callable, got {color_by!r}")
        for t in gf.nodes:
            if color_by == "op":
                k = op_desc(t)
                c = op_color(k, extra)
            elif color_by == "type":
                k = type_name(t.type)
                c = op_color(k, extra) if k in OP_COLORS else _color(k, extra)
            else:
                k, c = None, "#ffffff"
            node_fill.append(c)
            if k is not None:
                legend_items[k] = c
    else:
        vals = [_key_value(color_by, i, t) for i, t in enumerate(gf.nodes)]
        cmap = categorical_colors(vals)
        node_fill = [cmap[v] for v in vals]
        legend_items = {str(v): c for v, c in cmap.items()}
    return node_fill, legend_items


def layer_signature(gf, layers, il) -> tuple:
    """What makes two layers draw the same: each node's op, type and shape, in graph order."""
    return tuple((op_desc(t), t.type, tuple(int(x) for x in t.ne))
                 for t, lay in zip(gf.nodes, layers) if lay == il)


def fold_runs(gf, layers, collapse) -> dict:
    """{first layer: [layers]} for each run of 2+ consecutive collapsed layers with one ``layer_signature``."""
    runs, cur, prev_sig = {}, [], None
    for il in sorted({x for x in layers if x is not None}):
        sig = layer_signature(gf, layers, il) if il in collapse else None
        if sig is not None and cur and sig == prev_sig and il == cur[-1] + 1:
            cur.append(il)
        else:
            if len(cur) >= 2:
                runs[cur[0]] = cur
            cur = [il] if sig is not None else []
        prev_sig = sig
    if len(cur) >= 2:
        runs[cur[0]] = cur
    return runs


def describe_picture(info, sep: str = "\n") -> str:
    """The parts of a grouped picture with their real node counts, one per line (``info`` of
    ``graph_to_dot_grouped``): open layers, folded runs, single boxes, the nodes outside every layer, the total."""
    layers, boxes, folds = info["layers"], info["boxes"], info.get("folds", {})
    collapsed = set(info["collapsed"])
    in_fold = {il: il0 for il0, run in folds.items() for il in run}
    parts = []
    for il in sorted({x for x in layers if x is not None}):
        n = sum(1 for x in layers if x == il)
        if il not in collapsed:
            parts.append(f"layer {il} open: {n} nodes")
        elif il in folds:
            run = folds[il]
            parts.append(f"layers {run[0]}–{run[-1]} in one box: {len(run)} identical layers × {n} nodes = "
                         f"{len(run) * n:,}")
        elif il not in in_fold:
            parts.append(f"layer {il} in its own box: {boxes[il]} nodes")
    parts.append(f"outside the layers (embedding, output head): {sum(1 for x in layers if x is None)} nodes")
    parts.append(f"in all: {len(layers):,} nodes")
    return sep.join(parts)


class _Vertices:
    """Which vertex stands for each node and leaf: ``node[i]`` is ``n<i>`` or, in a collapsed layer, its box
    ``L<il>`` (``L<first>`` for a folded run of layers, ``fold_of``); ``leaf[j]`` is ``l<j>`` or None (folded into
    boxes, or hidden); ``addr`` maps a tensor's address to its vertex (sources are found by address: a node's
    ``src`` are tensor objects, not indices)."""

    def __init__(self, gf, layers, collapse, hide_leafs: bool, fold_of: dict | None = None):
        self.node = [None] * gf.n_nodes
        self.leaf = [None] * gf.n_leafs
        self.addr: dict = {}
        self.box_members: dict = {}
        self.layer_sizes: dict = {}
        self.folds: dict = {}
        fold_of = fold_of or {}
        for i, (t, il) in enumerate(zip(gf.nodes, layers)):
            if il in collapse:
                box = fold_of.get(il, il)
                self.node[i] = f"L{box}"
                self.box_members.setdefault(box, []).append(i)
                self.layer_sizes[il] = self.layer_sizes.get(il, 0) + 1
            else:
                self.node[i] = f"n{i}"
            self.addr[t.addr] = self.node[i]
        # leafs: visible when a visible node reads them; folded into the boxes otherwise
        self.leaf_idx = {t.addr: j for j, t in enumerate(gf.leafs)}
        readers: dict = {}
        for i, t in enumerate(gf.nodes):
            for s in t.src:
                if s is not None and s.addr in self.leaf_idx:
                    readers.setdefault(s.addr, set()).add(self.node[i])
        self.box_leafs: dict = {}
        for j, t in enumerate(gf.leafs):
            rd = readers.get(t.addr, set())
            visible = any(not v.startswith("L") for v in rd) or not rd
            if visible and not hide_leafs:
                self.leaf[j] = f"l{j}"
                self.addr[t.addr] = self.leaf[j]
            # a leaf read by a collapsed layer is counted in its box (and not wired to it: shared inputs such as
            # inp_pos would otherwise draw one edge per layer)
            for v in rd:
                if v.startswith("L"):
                    self.box_leafs.setdefault(int(v[1:]), []).append(j)


_HIGHLIGHT = {"penwidth": "4", "color": "#d50000"}


def _vertex_stmts(gf, vx: _Vertices, node_fill, color_by, highlight, id_prefix: str) -> list:
    """The vertex statements: the visible leafs (ellipses) first, then the nodes (rounded boxes) and layer boxes
    (one box3d each, written where its first node would be), in graph order."""
    stmts: list = []
    for j, t in enumerate(gf.leafs):
        if vx.leaf[j] is None:
            continue
        label = (f"<<font point-size='8'>leaf {j}</font><br/><b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        stmts.append(("node", vx.leaf[j], {"label": label, "shape": "ellipse", "style": "filled",
                                           "fillcolor": _LEAF_COLOR, "id": id_prefix + vx.leaf[j],
                                           "tooltip": f"leaf {j}: {t.name}"}))
    emitted_boxes = set()
    for i, t in enumerate(gf.nodes):
        v = vx.node[i]
        if v.startswith("L"):
            il = int(v[1:])
            if il not in emitted_boxes:
                emitted_boxes.add(il)
                stmts.append(("node", v, _box_attrs(gf, vx, il, node_fill, color_by, highlight, id_prefix + v)))
            continue
        op = op_desc(t)
        label = (f"<<font point-size='8'>#{i}</font> <b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(op)}<br/>{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        attrs = {"label": label, "shape": "box", "style": "rounded,filled", "fillcolor": node_fill[i],
                 "id": id_prefix + v, "tooltip": f"node {i}: {t.name} ({op})"}
        if i in highlight:
            attrs.update(_HIGHLIGHT)
        stmts.append(("node", v, attrs))
    return stmts


def _box_attrs(gf, vx: _Vertices, il: int, node_fill, color_by, highlight, vid: str) -> dict:
    """A collapsed layer's box: its node range, first and last names, how many leafs it folds in. Grey, unless a
    user colouring gives all its nodes one colour (e.g. every node of the layer on one device)."""
    mem = vx.box_members[il]
    nl = len(set(vx.box_leafs.get(il, ())))
    run = vx.folds.get(il)
    head = (f"layer {il} ({len(mem)} nodes)" if run is None else
            f"layers {run[0]}–{run[-1]}: {len(run)} identical × {len(mem) // len(run)} nodes = {len(mem):,}")
    label = (f"<<b>{head}</b><br/><font point-size='9'>#{mem[0]}–#{mem[-1]}: "
             f"{_esc(gf.nodes[mem[0]].name)} … {_esc(gf.nodes[mem[-1]].name)}"
             + (f"<br/>+ {nl} leafs (weights, cache, inputs)" if nl else "") + "</font>>")
    fills = {node_fill[k] for k in mem}
    fill = fills.pop() if len(fills) == 1 and not (isinstance(color_by, str) or color_by is None) else BOX_COLOR
    attrs = {"label": label, "shape": "box3d", "style": "filled", "fillcolor": fill, "id": vid,
             "margin": "0.2,0.1", "tooltip": (f"layer {il}" if run is None else f"layers {run[0]}-{run[-1]}")
             + f": nodes {mem[0]}..{mem[-1]}"}
    if highlight & set(mem):
        attrs.update(_HIGHLIGHT)
    return attrs


def _edge_stmts(gf, vx: _Vertices, stmts: list, edge_labels: bool, id_prefix: str) -> int:
    """Append the edges (node order, then src slot order, as ggml_graph_dump_dot) to ``stmts``, and a dashed
    ellipse ``x<k>`` for each source that is neither a node nor a leaf of ``gf`` (a tensor of another graph).
    Between boxes an edge is drawn once (thick); a leaf read by a box is counted in its label, not wired.
    Returns the number of edges."""
    seen = set()
    n_ext = 0
    for i, t in enumerate(gf.nodes):
        dst = vx.node[i]
        srcs = [(k, s) for k, s in enumerate(t.src) if s is not None]
        for k, s in srcs:
            if s.addr in vx.leaf_idx and dst.startswith("L"):
                continue                     # counted in the box's label
            src = vx.addr.get(s.addr)
            if src is None:
                if s.addr in vx.leaf_idx:    # a hidden leaf
                    continue
                src = f"x{n_ext}"
                n_ext += 1
                vx.addr[s.addr] = src
                stmts.append(("node", src, {"label": f"{s.name or '?'}\n{type_name(s.type)} {_shape(s)}",
                                            "shape": "ellipse", "style": "dashed", "id": id_prefix + src}))
            if src == dst:
                continue
            boxed = src.startswith("L") or dst.startswith("L")
            key = (src, dst) if boxed else (src, dst, k)
            if key in seen:
                continue
            seen.add(key)
            attrs = {"label": f"src{k}"} if (edge_labels and len(srcs) > 1 and not boxed) else {}
            if boxed:
                attrs["penwidth"] = "2"
            stmts.append(("edge", src, dst, attrs))
    return len(seen)


def _legend_spec(legend_items: dict, color_by):
    """The legend: (cluster attributes, node attributes) of a dashed cluster holding one HTML table, colour swatch
    and category per row; None when nothing is coloured."""
    if not legend_items:
        return None
    rows = "".join(f"<tr><td bgcolor='{c}' width='18'> </td><td align='left'>{_esc(str(k))}</td></tr>"
                   for k, c in legend_items.items())
    return ({"label": "colour = " + (color_by if isinstance(color_by, str) else "attribute"),
             "fontsize": "10", "style": "dashed", "color": "#9e9e9e"},
            {"label": f"<<table border='0' cellspacing='2' cellpadding='2'>{rows}</table>>",
             "shape": "plaintext", "fontsize": "10"})


def _dot_picture(stmts, graph_attr: dict, legend_spec):
    """The statements as a plain ``graphviz.Digraph``: Graphviz ``dot`` lays the whole picture out."""
    dot = graphviz.Digraph(name="ggml_cgraph", graph_attr=graph_attr, node_attr=_GROUPED_NODE_ATTR,
                           edge_attr=_GROUPED_EDGE_ATTR)
    for st in stmts:
        if st[0] == "node":
            dot.node(st[1], **st[2])
        else:
            dot.edge(st[1], st[2], **st[3])
    if legend_spec is not None:
        with dot.subgraph(name="cluster_legend") as lg:
            lg.attr(**legend_spec[0])
            lg.node("legend", **legend_spec[1])
    return dot

