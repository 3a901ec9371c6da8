"""A ``ggml_cgraph`` as a Graphviz picture: nodes (computed tensors) as boxes, leafs (constants, inputs) as ellipses.

In the spirit of ``ggml_graph_dump_dot`` (ggml.c), drawn from the engine's own ``gf.nodes`` / ``gf.leafs`` lists:
each node is labelled with its index in ``gf->nodes`` (the order the CPU backend computes them), its name, op and
shape; each leaf with its index in ``gf->leafs``. Edges go from ``src[k]`` to the node that reads it, emitted in
node order then src slot order, and are labelled with the slot ``k`` when a node has more than one source.
"""
from __future__ import annotations

import html
import json
import os
import re as _re
import shutil
import subprocess

import graphviz

from ..capture.nodes import layer_of
from ..ggml.tensor import op_desc, type_name

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


# Graphviz settings shared by the grouped pictures (and the per-layer templates of the layered layout)
_GROUPED_GRAPH_ATTR = {"rankdir": "TB", "fontname": "Helvetica", "fontsize": "12", "nodesep": "0.25", "ranksep": "0.35"}
_GROUPED_NODE_ATTR = {"fontname": "Helvetica", "fontsize": "10", "margin": "0.08,0.04"}
_GROUPED_EDGE_ATTR = {"fontname": "Helvetica", "fontsize": "8", "color": "#616161", "arrowsize": "0.6"}

# "auto" lays a graph out per layer (see ``layered_layout``) from this many drawn vertices on
LAYERED_MIN_VERTICES = 200


def graph_to_dot_grouped(gf, collapse=(), color_by="op", title: str | None = None, rankdir: str = "TB",
                         id_prefix: str = "", highlight=None, edge_labels: bool | None = None,
                         legend: bool = False, hide_leafs: bool = False, layout: str = "auto"):
    """A ``graphviz.Digraph`` of ``gf`` where the layers in ``collapse`` are drawn as one box each.

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

    # ---- fill colours
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

    # ---- vertices
    vert_node = [None] * gf.n_nodes
    vert_leaf = [None] * gf.n_leafs
    addr_vert: dict = {}
    box_members: dict = {}
    for i, (t, il) in enumerate(zip(gf.nodes, layers)):
        if il in collapse:
            vert_node[i] = f"L{il}"
            box_members.setdefault(il, []).append(i)
        else:
            vert_node[i] = f"n{i}"
        addr_vert[t.addr] = vert_node[i]

    # leafs: visible when a visible node reads them; folded into the boxes otherwise
    leaf_idx = {t.addr: j for j, t in enumerate(gf.leafs)}
    readers: dict = {}
    for i, t in enumerate(gf.nodes):
        for s in t.src:
            if s is not None and s.addr in leaf_idx:
                readers.setdefault(s.addr, set()).add(vert_node[i])
    box_leafs: dict = {}
    for j, t in enumerate(gf.leafs):
        rd = readers.get(t.addr, set())
        visible = any(not v.startswith("L") for v in rd) or not rd
        if visible and not hide_leafs:
            vert_leaf[j] = f"l{j}"
            addr_vert[t.addr] = vert_leaf[j]
        # a leaf read by a collapsed layer is counted in its box (and not wired to it: shared inputs such as
        # inp_pos would otherwise draw one edge per layer)
        for v in rd:
            if v.startswith("L"):
                box_leafs.setdefault(int(v[1:]), []).append(j)

    def vid(name):
        return f"{id_prefix}{name}"

    # the picture as statements, in the order they are written to the DOT source: ("node", name, attrs) and
    # ("edge", src, dst, attrs)
    stmts: list = []
    hl = {"penwidth": "4", "color": "#d50000"}
    for j, t in enumerate(gf.leafs):
        if vert_leaf[j] is None:
            continue
        label = (f"<<font point-size='8'>leaf {j}</font><br/><b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        stmts.append(("node", vert_leaf[j], {"label": label, "shape": "ellipse", "style": "filled",
                                             "fillcolor": _LEAF_COLOR, "id": vid(vert_leaf[j]),
                                             "tooltip": f"leaf {j}: {t.name}"}))
    emitted_boxes = set()
    for i, t in enumerate(gf.nodes):
        v = vert_node[i]
        if v.startswith("L"):
            il = int(v[1:])
            if il in emitted_boxes:
                continue
            emitted_boxes.add(il)
            mem = box_members[il]
            nl = len(set(box_leafs.get(il, ())))
            label = (f"<<b>layer {il} ({len(mem)} nodes)</b><br/><font point-size='9'>#{mem[0]}–#{mem[-1]}: "
                     f"{_esc(gf.nodes[mem[0]].name)} … {_esc(gf.nodes[mem[-1]].name)}"
                     + (f"<br/>+ {nl} leafs (weights, cache, inputs)" if nl else "") + "</font>>")
            fills = {node_fill[k] for k in mem}
            fill = fills.pop() if len(fills) == 1 and not (isinstance(color_by, str) or color_by is None) else BOX_COLOR
            attrs = {"label": label, "shape": "box3d", "style": "filled", "fillcolor": fill, "id": vid(v),
                     "margin": "0.2,0.1", "tooltip": f"layer {il}: nodes {mem[0]}..{mem[-1]}"}
            if highlight & set(mem):
                attrs.update(hl)
            stmts.append(("node", v, attrs))
            continue
        op = op_desc(t)
        label = (f"<<font point-size='8'>#{i}</font> <b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(op)}<br/>{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        attrs = {"label": label, "shape": "box", "style": "rounded,filled", "fillcolor": node_fill[i], "id": vid(v),
                 "tooltip": f"node {i}: {t.name} ({op})"}
        if i in highlight:
            attrs.update(hl)
        stmts.append(("node", v, attrs))

    # ---- edges (deduplicated between boxes)
    seen = set()
    n_ext = 0
    for i, t in enumerate(gf.nodes):
        dst = vert_node[i]
        srcs = [(k, s) for k, s in enumerate(t.src) if s is not None]
        for k, s in srcs:
            if s.addr in leaf_idx and dst.startswith("L"):
                continue                     # counted in the box's label
            src = addr_vert.get(s.addr)
            if src is None:
                if s.addr in leaf_idx:       # a hidden leaf
                    continue
                src = f"x{n_ext}"
                n_ext += 1
                addr_vert[s.addr] = src
                stmts.append(("node", src, {"label": f"{s.name or '?'}\n{type_name(s.type)} {_shape(s)}",
                                            "shape": "ellipse", "style": "dashed", "id": vid(src)}))
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

    legend_spec = None
    if legend and legend_items:
        rows = "".join(f"<tr><td bgcolor='{c}' width='18'> </td><td align='left'>{_esc(str(k))}</td></tr>"
                       for k, c in legend_items.items())
        legend_spec = ({"label": "colour = " + (color_by if isinstance(color_by, str) else "attribute"),
                        "fontsize": "10", "style": "dashed", "color": "#9e9e9e"},
                       {"label": f"<<table border='0' cellspacing='2' cellpadding='2'>{rows}</table>>",
                        "shape": "plaintext", "fontsize": "10"})

    # ---- layout: dot for the whole picture, or the layered layout (every layer open, top to bottom)
    n_vertices = sum(1 for st in stmts if st[0] == "node")
    bands = _node_bands(layers) if not collapse and rankdir == "TB" and len(all_layers) >= 2 else None
    use_layers = layout == "layers" or (layout == "auto" and n_vertices >= LAYERED_MIN_VERTICES)
    if layout == "layers" and bands is None:
        raise ValueError("layout='layers' needs a graph with at least 2 layers, every layer open and rankdir 'TB'")
    if use_layers and bands is not None and _dot_program() is not None:
        band_of = {vert_node[i]: b for i, b in enumerate(bands)}
        dot, lay = layered_layout(stmts, band_of, graph_attr, legend_spec)
        used = "layers"
    else:
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
        lay, used = {}, "dot"

    info = DotInfo(n_nodes_drawn=sum(1 for v in vert_node if not v.startswith("L")) + len(box_members),
                   n_leafs_drawn=sum(v is not None for v in vert_leaf), boxes={il: len(m) for il, m in
                                                                              box_members.items()},
                   collapsed=sorted(collapse), vertex_of_node=vert_node, vertex_of_leaf=vert_leaf,
                   colors=legend_items, n_edges=len(seen), layers=layers, layout=used, **lay)
    return dot, info


# ------------------------------------------------------------------------------------------------------------------
# The layered layout: the whole decode graph in well under a second.
#
# Graphviz ``dot`` lays a graph out globally (rank assignment, crossing minimisation over every rank, x placement by
# network simplex); on the fully opened decode graph -- 1086 nodes, ~340 leafs, ~1700 edges, some of them (inp_pos,
# the KQ mask) reaching into all 30 layers -- that takes 15-20 s even with its iteration limits turned down. But the
# graph is 30 copies of one layer: llama.cpp's ``llm_build_llama`` emits the same 36 nodes for every layer, reading
# the previous layer's residual stream ``l_out-(il-1)`` and the same few inputs. So the picture is built from bands:
#
# 1. every node gets a band (its layer, from the ``-<il>`` name suffix; un-named nodes between two nodes of one layer
#    join it, e.g. the ``out_ids`` GET_ROWS of the last layer; other runs of them -- the embeddings, the output
#    head -- are bands of their own); a leaf read by one band only (the layer's weights, its KV cache) belongs to it,
#    one read by several bands (inp_pos, the KQ mask, the KV index inputs) is *shared*;
# 2. bands whose contents match -- same vertex shapes and labels up to the numbers in them, same edges -- share one
#    *template*: ``dot`` lays out one of them (the one with the longest labels, so no other copy is wider), with a
#    tiny point ("stub") standing for each source outside the band. All templates go through one ``dot`` call
#    (for the decode graph: 5 small graphs instead of one of 1400 vertices);
# 3. the templates are stacked top to bottom in graph order, aligned horizontally along the edges between
#    neighbouring bands (the residual stream runs straight down); every vertex's position and every edge's spline
#    is written into the DOT source: an edge inside a band is the template's spline moved to the band; an edge from
#    outside runs to its stub -- straight from the bottom row of the band just above (the residual stream), down a
#    lane left of the stack from a shared leaf (drawn once, at the top of its lane), or down a lane right of it
#    otherwise -- and then along the template's spline from the stub. Lanes turn into a band in the free gap
#    between two rows, so they cross edges but no vertex;
# 4. Graphviz only draws it: ``neato -n2`` keeps the positions and splines as given (0.3-0.5 s for the SVG).
#
# Nothing is dropped or merged: every vertex and every (node, src) edge of the dot layout is in the picture, with
# the same labels, colours and ids.

def _dot_program():

    return shutil.which("dot")


class PinnedDigraph:
    """What every picture laid out by ``layered_layout`` is an instance of: a ``graphviz.Digraph`` (made by
    ``_pinned_digraph_class``, graphviz being imported lazily) whose ``pipe``/``render`` run ``neato -n2``."""


_PINNED_CLS = None


def _pinned_digraph_class():
    """A ``graphviz.Digraph`` whose positions are fixed: rendered (pipe, render, Jupyter display) by ``neato -n2``."""
    global _PINNED_CLS
    if _PINNED_CLS is None:

        class _Pinned(graphviz.Digraph, PinnedDigraph):
            """A Digraph with every node ``pos`` and edge ``pos`` given: ``neato -n2`` draws it as laid out."""

            def pipe(self, *args, **kwargs):
                kwargs.setdefault("neato_no_op", 2)
                kwargs.setdefault("engine", "neato")
                return super().pipe(*args, **kwargs)

            def render(self, *args, **kwargs):
                kwargs.setdefault("neato_no_op", 2)
                kwargs.setdefault("engine", "neato")
                return super().render(*args, **kwargs)

        _Pinned.__name__ = _Pinned.__qualname__ = "PinnedDigraph"
        _PINNED_CLS = _Pinned
    return _PINNED_CLS


def _node_bands(layers) -> list:
    """Per node: its band, ``("L", il)`` for a layer's nodes, ``("x", first node)`` for a run of un-layered nodes
    that is not inside one layer (un-layered nodes between two nodes of the same layer join that layer)."""
    n = len(layers)
    prev, nxt = [None] * n, [None] * n
    last = None
    for i, il in enumerate(layers):
        last = il if il is not None else last
        prev[i] = last
    last = None
    for i in range(n - 1, -1, -1):
        last = layers[i] if layers[i] is not None else last
        nxt[i] = last
    out, run = [], None
    for i, il in enumerate(layers):
        if il is None and prev[i] is not None and prev[i] == nxt[i]:
            il = prev[i]
        if il is not None:
            out.append(("L", il))
            run = None
        else:
            run = run or ("x", i)
            out.append(run)
    return out


_NODE_LAYOUT_KEYS = ("label", "shape", "margin", "fontsize", "fontname", "width", "height", "fixedsize",
                     "peripheries")
_EDGE_LAYOUT_KEYS = ("label", "fontsize", "fontname", "weight", "minlen", "constraint", "headport", "tailport",
                     "arrowhead", "arrowtail", "dir")
_DIGITS = _re.compile(r"\d+")


def _parse_spline(pos: str):
    start = end = None
    pts = []
    for tok in pos.split(";")[0].split():
        if tok.startswith("e,"):
            end = tuple(float(v) for v in tok[2:].split(","))
        elif tok.startswith("s,"):
            start = tuple(float(v) for v in tok[2:].split(","))
        else:
            x, y = tok.split(",")[:2]
            pts.append((float(x), float(y)))
    return start, end, pts


def _fmt_spline(start, end, pts) -> str:
    out = []
    if start is not None:
        out.append(f"s,{start[0]:.2f},{start[1]:.2f}")
    if end is not None:
        out.append(f"e,{end[0]:.2f},{end[1]:.2f}")
    out += [f"{x:.2f},{y:.2f}" for x, y in pts]
    return " ".join(out)


def _polyline_bezier(pts) -> list:
    """A polyline as cubic Bézier control points (1 + 3 per segment), the form of a Graphviz edge ``pos``."""
    out = [pts[0]]
    for (ax, ay), (bx, by) in zip(pts, pts[1:]):
        out += [(ax + (bx - ax) / 3, ay + (by - ay) / 3), (ax + 2 * (bx - ax) / 3, ay + 2 * (by - ay) / 3), (bx, by)]
    return out


def _lane_offset(k: int) -> float:
    """Where lane ``k`` crosses a gap between two rows, relative to the gap's middle (rows are >= 25 pt apart)."""
    return ((k % 5) - 2) * 3.5


def _run_dot_json(sources: list) -> list:
    """Lay out several graphs with one ``dot -Tjson0`` call; their JSON documents, in order."""

    exe = _dot_program()
    if exe is None:
        raise graphviz.ExecutableNotFound(["dot"])
    res = subprocess.run([exe, "-Tjson0"], input="\n".join(sources).encode("utf-8"), capture_output=True)
    if res.returncode != 0:
        raise RuntimeError(f"dot failed laying out the layer templates: {res.stderr.decode(errors='replace')}")
    text = res.stdout.decode("utf-8")
    dec = json.JSONDecoder()
    docs, k = [], 0
    while True:
        while k < len(text) and text[k].isspace():
            k += 1
        if k >= len(text):
            break
        doc, k = dec.raw_decode(text, k)
        docs.append(doc)
    if len(docs) != len(sources):
        raise RuntimeError(f"dot returned {len(docs)} layouts for {len(sources)} graphs")
    return docs


class _Template:
    """One ``dot`` layout: vertex boxes ``{name: (x, y, w, h)}`` in points (y up), edge splines by id, bb."""

    def __init__(self, doc):
        self.bb = tuple(float(v) for v in doc["bb"].split(","))
        self.v = {}
        self.clusters = {}
        for o in doc.get("objects", []):
            if "pos" in o:
                x, y = (float(a) for a in o["pos"].split(",")[:2])
                self.v[o["name"]] = (x, y, float(o["width"]) * 72.0, float(o["height"]) * 72.0)
            elif "bb" in o:
                self.clusters[o["name"]] = o
        self.e = {}
        for e in doc.get("edges", []):
            if "id" in e and "pos" in e:
                lp = tuple(float(a) for a in e["lp"].split(",")) if "lp" in e else None
                self.e[e["id"]] = (*_parse_spline(e["pos"]), lp)
        ys = [(y, h) for n, (x, y, w, h) in self.v.items() if n.startswith("v")]
        self.bottom_y = min((y for y, h in ys), default=self.bb[1])
        self._rows = ys + [(y, h) for n, (x, y, w, h) in self.v.items() if n.startswith("s")]

    def gap_above(self, y, h):
        """A y in the free gap between the row at ``y`` and the row above it (None: that is the top row)."""
        above = [yy - hh / 2 for yy, hh in self._rows if yy > y + 1.0]
        if not above:
            return None
        row_top = max([yy + hh / 2 for yy, hh in self._rows if abs(yy - y) <= 1.0] + [y + h / 2])
        return (row_top + min(above)) / 2

    def gap_below(self, y, h):
        """A y in the free gap between the row at ``y`` and the row below it (None: that is the bottom row)."""
        below = [yy + hh / 2 for yy, hh in self._rows if yy < y - 1.0]
        if not below:
            return None
        row_bottom = min([yy - hh / 2 for yy, hh in self._rows if abs(yy - y) <= 1.0] + [y - h / 2])
        return (row_bottom + max(below)) / 2


def layered_layout(stmts, band_of: dict, graph_attr: dict, legend_spec=None, band_gap: float = 18.0):
    """Position every vertex and edge of a picture of a layered graph (see the comment above); returns
    ``(PinnedDigraph, info)``.

    ``stmts``: the picture, ``("node", name, attrs)`` / ``("edge", src, dst, attrs)``; ``band_of``: {vertex name of
    a node: its band key}, in graph order (every other vertex is placed by its readers); ``legend_spec``:
    (cluster attrs, legend node attrs) or None.
    """

    verts = {st[1]: st[2] for st in stmts if st[0] == "node"}
    edges = [(st[1], st[2], st[3]) for st in stmts if st[0] == "edge"]
    order = list(dict.fromkeys(band_of.values()))
    bidx = {b: k for k, b in enumerate(order)}

    # ---- which band each vertex belongs to; shared vertices (read by several bands) get a lane
    readers: dict = {}
    for s, d, _a in edges:
        readers.setdefault(s, set()).add(band_of[d])
    owner = dict(band_of)
    shared = []
    for v in verts:
        if v in band_of:
            continue
        rb = readers.get(v, ())
        if len(rb) == 1:
            owner[v] = next(iter(rb))
        elif not rb:
            owner[v] = order[0]
        else:
            shared.append(v)

    # ---- per band: members (nodes in graph order, then owned leafs by first use), stubs, edges
    members = {b: [] for b in order}
    for v in verts:
        if v in band_of:
            members[band_of[v]].append(v)
    band_edges = {b: [] for b in order}
    for j, (s, d, a) in enumerate(edges):
        band_edges[band_of[d]].append(j)
    stubs = {b: [] for b in order}
    for b in order:
        mem = members[b]
        seen = set(mem)
        for j in band_edges[b]:
            s = edges[j][0]
            if s not in seen and owner.get(s) == b:
                mem.append(s)
                seen.add(s)
        st_seen = set()
        for j in band_edges[b]:
            s = edges[j][0]
            if s not in seen and s not in st_seen:
                stubs[b].append(s)
                st_seen.add(s)
    for v in verts:                                   # owned vertices nobody reads
        if v not in band_of and v not in shared and not readers.get(v):
            members[owner[v]].append(v)
    local = {b: {v: k for k, v in enumerate(members[b])} for b in order}
    stub_idx = {b: {v: k for k, v in enumerate(stubs[b])} for b in order}
    edge_local = {}
    for b in order:
        for k, j in enumerate(band_edges[b]):
            edge_local[j] = k

    def sref(b, v):
        return ("v", local[b][v]) if v in local[b] else ("s", stub_idx[b][v])

    def signature(b):
        vs = tuple((verts[v].get("shape"), _DIGITS.sub("0", verts[v].get("label", v)),
                    tuple(verts[v].get(k) for k in _NODE_LAYOUT_KEYS[2:])) for v in members[b])
        es = tuple((sref(b, edges[j][0]), local[b][edges[j][1]],
                    tuple((k, _DIGITS.sub("0", str(edges[j][2][k]))) for k in _EDGE_LAYOUT_KEYS
                          if k in edges[j][2])) for j in band_edges[b])
        return vs, len(stubs[b]), es

    groups: dict = {}
    for b in order:
        groups.setdefault(signature(b), []).append(b)
    group_of, reps = {}, []
    for g, bs in enumerate(groups.values()):
        # the copy with the longest labels is laid out: every other copy fits in its boxes
        rep = max(reversed(bs), key=lambda b: sum(len(verts[v].get("label", "")) for v in members[b]))
        reps.append(rep)
        for b in bs:
            group_of[b] = g

    # ---- one dot call for every template (+ the shared vertices and the legend, to learn their sizes)
    tattr = {k: v for k, v in graph_attr.items() if k not in ("label", "labelloc")}

    def layout_attrs(a, keys):
        return {k: str(a[k]) for k in keys if k in a}

    sources = []
    for rep in reps:
        g = graphviz.Digraph(name="template", graph_attr=tattr, node_attr=_GROUPED_NODE_ATTR,
                             edge_attr=_GROUPED_EDGE_ATTR)
        for k, v in enumerate(members[rep]):
            g.node(f"v{k}", **layout_attrs(verts[v], _NODE_LAYOUT_KEYS))
        for k in range(len(stubs[rep])):
            g.node(f"s{k}", label="", shape="point", width="0.05", height="0.05")
        for k, j in enumerate(band_edges[rep]):
            s, d, a = edges[j]
            ss = f"v{local[rep][s]}" if s in local[rep] else f"s{stub_idx[rep][s]}"
            g.edge(ss, f"v{local[rep][d]}", id=f"e{k}", **layout_attrs(a, _EDGE_LAYOUT_KEYS))
        sources.append(g.source)
    aux = graphviz.Digraph(name="aux", graph_attr=tattr, node_attr=_GROUPED_NODE_ATTR, edge_attr=_GROUPED_EDGE_ATTR)
    for k, v in enumerate(shared):
        aux.node(f"v{k}", **layout_attrs(verts[v], _NODE_LAYOUT_KEYS))
    if legend_spec is not None:
        with aux.subgraph(name="cluster_legend") as lg:
            lg.attr(**legend_spec[0])
            lg.node("legend", **legend_spec[1])
    sources.append(aux.source)
    docs = _run_dot_json(sources)
    temps = [_Template(d) for d in docs[:-1]]
    auxt = _Template(docs[-1])

    def T(b):
        return temps[group_of[b]]

    # ---- stack the bands top to bottom (y up: band 0's top at 0)
    dy, top = {}, 0.0
    for b in order:
        x0, y0, x1, y1 = T(b).bb
        dy[b] = top - y1
        top -= (y1 - y0) + band_gap

    # ---- x: the biggest group stays put; the others line up with a neighbour along an edge between them
    dx = {}
    main = max(groups.values(), key=len)
    if len(main) == 1:
        main = [order[0]]
    for b in main:
        dx[b] = 0.0

    def tpos(b, v):
        k = f"v{local[b][v]}"
        return T(b).v[k]

    def align(b, a):
        """dx for band b from placed neighbour a."""
        for j in band_edges[b]:
            s = edges[j][0]
            if s in local[a] and s in stub_idx[b]:
                return tpos(a, s)[0] + dx[a] - T(b).v[f"s{stub_idx[b][s]}"][0]
        for j in band_edges[a]:
            s = edges[j][0]
            if s in local[b] and s in stub_idx[a]:
                return T(a).v[f"s{stub_idx[a][s]}"][0] + dx[a] - tpos(b, s)[0]
        ta, tb = T(a).bb, T(b).bb
        return (ta[0] + ta[2]) / 2 + dx[a] - (tb[0] + tb[2]) / 2

    while len(dx) < len(order):
        progress = False
        for k, b in enumerate(order):
            if b in dx:
                continue
            for a in ([order[k - 1]] if k > 0 else []) + ([order[k + 1]] if k + 1 < len(order) else []):
                if a in dx:
                    dx[b] = align(b, a)
                    progress = True
                    break
        if not progress:                                # cannot happen for a chain; keep going regardless
            dx[next(b for b in order if b not in dx)] = 0.0

    pos: dict = {}
    for b in order:
        t = T(b)
        for v, k in local[b].items():
            x, y, w, h = t.v[f"v{k}"]
            pos[v] = (x + dx[b], y + dy[b], w, h)
    xmin = min(T(b).bb[0] + dx[b] for b in order)
    xmax = max(T(b).bb[2] + dx[b] for b in order)

    # ---- shared vertices: one lane each, left of the stack, the vertex at the top of its lane
    lane_w = max((auxt.v[f"v{k}"][2] for k in range(len(shared))), default=0.0) + 16.0
    lane_x, lane_dy = {}, {}
    for k, v in enumerate(shared):
        lane_dy[v] = _lane_offset(k)
        _x, _y, w, h = auxt.v[f"v{k}"]
        lane_x[v] = xmin - 24.0 - lane_w * k - lane_w / 2
        pos[v] = (lane_x[v], 10.0 + h / 2, w, h)

    # ---- edges
    right_lane: dict = {}
    epos = []
    for j, (s, d, a) in enumerate(edges):
        b = band_of[d]
        t = T(b)
        start, end, pts, lp = t.e[f"e{edge_local[j]}"]
        mv = (lambda p, b=b: (p[0] + dx[b], p[1] + dy[b]))
        pts = [mv(p) for p in pts]
        start = mv(start) if start is not None else None
        end = mv(end) if end is not None else None
        lp = mv(lp) if lp is not None else None
        if s not in local[b]:
            _sx, sy, _sw, sh = t.v[f"s{stub_idx[b][s]}"]
            gy = t.gap_above(sy, sh)
            gy = (t.bb[3] + band_gap / 2) if gy is None else gy
            gy += dy[b]
            p0 = pts[0]
            x, y, w, h = pos[s]
            if s in lane_x:
                gy += lane_dy[s]                            # lanes entering one gap do not overlap
                route = [(x, y - h / 2), (x, gy), (p0[0], gy), p0]
            else:
                a_band = owner[s]
                ta = T(a_band)
                k_s = local[a_band][s]
                at_bottom = ta.v[f"v{k_s}"][1] <= ta.bottom_y + 1.0
                if bidx[a_band] + 1 == bidx[b] and at_bottom:
                    route = [(x, y - h / 2), p0]           # the row just above: straight down
                else:
                    if s not in right_lane:
                        right_lane[s] = len(right_lane)
                    rx = xmax + 24.0 + 10.0 * right_lane[s]
                    ty_, th = ta.v[f"v{k_s}"][1], ta.v[f"v{k_s}"][3]
                    gb = ta.gap_below(ty_, th)
                    gb = (ta.bb[1] - band_gap / 2) if gb is None else gb
                    gb += dy[a_band] + _lane_offset(right_lane[s])
                    gy += _lane_offset(right_lane[s])
                    route = [(x, y - h / 2), (x, gb), (rx, gb), (rx, gy), (p0[0], gy), p0]
            pts = _polyline_bezier(route)[:-1] + pts
        attrs = {"pos": _fmt_spline(start, end, pts)}
        if lp is not None:
            attrs["lp"] = f"{lp[0]:.2f},{lp[1]:.2f}"
        epos.append(attrs)

    # ---- the legend: right of everything, at the top
    legend_at = None
    if legend_spec is not None:
        cl = auxt.clusters.get("cluster_legend")
        if cl is not None:
            cx0, cy0, cx1, cy1 = (float(v) for v in cl["bb"].split(","))
            ldx = xmax + 24.0 + 10.0 * len(right_lane) + 16.0 - cx0
            ldy = 10.0 + max((p[3] for v, p in pos.items() if v in lane_x), default=0.0) - cy1
            lx, ly = auxt.v["legend"][:2]
            lpx, lpy = (float(v) for v in cl["lp"].split(","))
            legend_at = {"bb": f"{cx0 + ldx:.2f},{cy0 + ldy:.2f},{cx1 + ldx:.2f},{cy1 + ldy:.2f}",
                         "lp": f"{lpx + ldx:.2f},{lpy + ldy:.2f}", "pos": f"{lx + ldx:.2f},{ly + ldy:.2f}"}

    # ---- the picture: every position given, drawn by neato -n2 (layout=nop2 for a plain ``dot`` run)
    gattr = dict(graph_attr, layout="nop2")
    dot = _pinned_digraph_class()(name="ggml_cgraph", graph_attr=gattr, node_attr=_GROUPED_NODE_ATTR,
                                  edge_attr=_GROUPED_EDGE_ATTR,
                                  comment="laid out by ggviz.viz.graph_dot.layered_layout: positions are fixed, "
                                          "render with neato -n2 (or -Knop2)")
    k_edge = 0
    for st in stmts:
        if st[0] == "node":
            # the template's box sizes for every copy (it has the longest labels): the copies of a layer look
            # alike, and the template's splines end exactly on their borders
            x, y, w, h = pos[st[1]]
            dot.node(st[1], **st[2], pos=f"{x:.2f},{y:.2f}", width=f"{w / 72:.4f}", height=f"{h / 72:.4f}")
        else:
            dot.edge(st[1], st[2], **st[3], **epos[k_edge])
            k_edge += 1
    if legend_spec is not None and legend_at is not None:
        with dot.subgraph(name="cluster_legend") as lg:
            lg.attr(**legend_spec[0], bb=legend_at["bb"], lp=legend_at["lp"])
            lg.node("legend", **legend_spec[1], pos=legend_at["pos"])
    info = {"bands": len(order), "templates": len(reps), "band_of_vertex": {v: owner.get(v) for v in verts},
            "band_order": order, "positions": dict(pos)}
    return dot, info
