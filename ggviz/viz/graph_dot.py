"""A ``ggml_cgraph`` as a Graphviz picture: nodes (computed tensors) as boxes, leafs (constants, inputs) as ellipses.

In the spirit of ``ggml_graph_dump_dot`` (ggml.c), drawn from the engine's own ``gf.nodes`` / ``gf.leafs`` lists:
each node is labelled with its index in ``gf->nodes`` (the order the CPU backend computes them), its name, op and
shape; each leaf with its index in ``gf->leafs``. Edges go from ``src[k]`` to the node that reads it, emitted in
node order then src slot order, and are labelled with the slot ``k`` when a node has more than one source.
"""
from __future__ import annotations

import html

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
    import graphviz

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
    import os

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

import re as _re

_LAYER_SUFFIX = _re.compile(r"-(\d+)(?=$|\s)")            # "Qcur-3", "Kcur-3 (view)"
_CACHE_LAYER = _re.compile(r"^cache_[kv]_l(\d+)(?=$|\s)")  # "cache_k_l3 (view)": llama_kv_cache's names
_WEIGHT_LAYER = _re.compile(r"^blk\.(\d+)\.")              # "blk.3.attn_q.weight"

# op -> fill colour. Fixed, so one op has one colour in every picture (and the collapsed and expanded views agree);
# views/reshapes, which compute nothing, are light grey.
OP_COLORS = {
    "MUL_MAT": "#90caf9", "ADD": "#a5d6a7", "MUL": "#dce775", "RMS_NORM": "#ffe082", "NORM": "#ffe082",
    "ROPE": "#ce93d8", "SOFT_MAX": "#ef9a9a", "GET_ROWS": "#80deea", "SET_ROWS": "#ffab91", "SWIGLU": "#f48fb1",
    "SILU": "#f48fb1", "GELU": "#f48fb1", "CONT": "#bcaaa4", "CPY": "#bcaaa4", "DUP": "#bcaaa4", "SCALE": "#b39ddb",
    "RESHAPE": "#eeeeee", "VIEW": "#eeeeee", "PERMUTE": "#eeeeee", "TRANSPOSE": "#eeeeee", "SUM_ROWS": "#fff59d",
    "FLASH_ATTN_EXT": "#ef9a9a", "SUB": "#a5d6a7", "DIV": "#dce775", "SQR": "#dce775", "SQRT": "#dce775",
}
_EXTRA_COLORS = ["#b2dfdb", "#f8bbd0", "#d1c4e9", "#ffccbc", "#c8e6c9", "#b3e5fc", "#fff9c4", "#d7ccc8",
                 "#cfd8dc", "#f0f4c3", "#e1bee7", "#ffe0b2"]
BOX_COLOR = "#cfd8dc"


def layer_of(name: str):
    """The layer index in a tensor name (``Qcur-3``, ``cache_k_l3 (view)``, ``blk.3.ffn_up.weight``), or None."""
    for rx in (_LAYER_SUFFIX, _CACHE_LAYER, _WEIGHT_LAYER):
        m = rx.search(name) if rx is _LAYER_SUFFIX else rx.match(name)
        if m:
            return int(m.group(1))
    return None


def node_layers(gf) -> list:
    """Per node of ``gf``: its layer (from the name) or None (embeddings, output head)."""
    return [layer_of(t.name) for t in gf.nodes]


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


def graph_to_dot_grouped(gf, collapse=(), color_by="op", title: str | None = None, rankdir: str = "TB",
                         id_prefix: str = "", highlight=None, edge_labels: bool | None = None,
                         legend: bool = False, hide_leafs: bool = False):
    """A ``graphviz.Digraph`` of ``gf`` where the layers in ``collapse`` are drawn as one box each.

    ``collapse``: layer indices (``"all"`` for every layer). A collapsed layer's nodes become one box labelled
    ``layer il (n nodes)``; leafs read only by collapsed layers (its weights, cache tensors, shared inputs) are
    folded into the boxes. ``color_by``: "op", "type", None, or a mapping/callable giving each node a category
    (e.g. the buffer it lives in); ``highlight``: a node index (or list) drawn with a thick red outline.
    Vertex names are ``n<i>`` (node i), ``l<j>`` (leaf j), ``L<il>`` (a layer box), ``x<k>`` (a source outside the
    graph); each vertex's SVG id is ``id_prefix`` + its name, so a picture can be restyled and clicked.

    Returns ``(dot, info)``; ``info`` holds ``n_nodes_drawn`` (node boxes + layer boxes), ``n_leafs_drawn``,
    ``boxes`` ({il: number of nodes}), ``vertex_of_node`` (list), ``vertex_of_leaf`` (list), ``colors`` (legend).
    """
    import graphviz

    layers = node_layers(gf)
    all_layers = sorted({il for il in layers if il is not None})
    collapse = set(all_layers) if collapse == "all" else {int(x) for x in collapse} & set(all_layers)
    highlight = set() if highlight is None else ({int(highlight)} if isinstance(highlight, (int,)) else
                                                 {int(h) for h in highlight})
    n_visible = sum(1 for il in layers if il not in collapse)
    if edge_labels is None:
        edge_labels = n_visible <= 80

    dot = graphviz.Digraph(name="ggml_cgraph", graph_attr={"rankdir": rankdir, "fontname": "Helvetica",
                                                           "fontsize": "12", "nodesep": "0.25", "ranksep": "0.35"},
                           node_attr={"fontname": "Helvetica", "fontsize": "10", "margin": "0.08,0.04"},
                           edge_attr={"fontname": "Helvetica", "fontsize": "8", "color": "#616161",
                                      "arrowsize": "0.6"})
    if title:
        dot.attr(label=title, labelloc="t", fontsize="14")

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

    hl = {"penwidth": "4", "color": "#d50000"}
    for j, t in enumerate(gf.leafs):
        if vert_leaf[j] is None:
            continue
        label = (f"<<font point-size='8'>leaf {j}</font><br/><b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        dot.node(vert_leaf[j], label=label, shape="ellipse", style="filled", fillcolor=_LEAF_COLOR,
                 id=vid(vert_leaf[j]), tooltip=f"leaf {j}: {t.name}")
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
            attrs = {"shape": "box3d", "style": "filled", "fillcolor": fill, "id": vid(v), "margin": "0.2,0.1",
                     "tooltip": f"layer {il}: nodes {mem[0]}..{mem[-1]}"}
            if highlight & set(mem):
                attrs.update(hl)
            dot.node(v, label=label, **attrs)
            continue
        op = op_desc(t)
        label = (f"<<font point-size='8'>#{i}</font> <b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(op)}<br/>{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        attrs = {"shape": "box", "style": "rounded,filled", "fillcolor": node_fill[i], "id": vid(v),
                 "tooltip": f"node {i}: {t.name} ({op})"}
        if i in highlight:
            attrs.update(hl)
        dot.node(v, label=label, **attrs)

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
                dot.node(src, label=f"{s.name or '?'}\n{type_name(s.type)} {_shape(s)}", shape="ellipse",
                         style="dashed", id=vid(src))
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
            dot.edge(src, dst, **attrs)

    if legend and legend_items:
        rows = "".join(f"<tr><td bgcolor='{c}' width='18'> </td><td align='left'>{_esc(str(k))}</td></tr>"
                       for k, c in legend_items.items())
        with dot.subgraph(name="cluster_legend") as lg:
            lg.attr(label="colour = " + (color_by if isinstance(color_by, str) else "attribute"), fontsize="10",
                    style="dashed", color="#9e9e9e")
            lg.node("legend", label=f"<<table border='0' cellspacing='2' cellpadding='2'>{rows}</table>>",
                    shape="plaintext", fontsize="10")

    info = DotInfo(n_nodes_drawn=sum(1 for v in vert_node if not v.startswith("L")) + len(box_members),
                   n_leafs_drawn=sum(v is not None for v in vert_leaf), boxes={il: len(m) for il, m in
                                                                              box_members.items()},
                   collapsed=sorted(collapse), vertex_of_node=vert_node, vertex_of_leaf=vert_leaf,
                   colors=legend_items, n_edges=len(seen), layers=layers)
    return dot, info
